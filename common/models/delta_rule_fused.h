// The gated delta rule as --kernels fast runs it on the CPU: transformers' recurrent form
// (torch_recurrent_gated_delta_rule), token by token, fused into one pass per token over a state
// that stays in cache, one (sequence, value head) per thread.
//
// Why: the reference path (GatedDeltaRuleChunked, gated_delta_rule.h) spends ~4 % of a hybrid
// forward's floating-point work in a few dozen small libtorch operations per chunk, which took
// 40-60 % of the forward's time on two cores. Here each token costs two sweeps over the head's [dk, dv] fp32
// state (64 x 64 = 16 KiB for Qwen3.5): the first decays it and reads Sᵀk, the second writes
// k ⊗ δ and reads Sᵀq. Same operations as the recurrent reference, in its order per element;
// the chunked form is the same function with other roundings (both within 1e-5 here).
//
// Rows are independent: a (sequence, head)'s outputs do not depend on the thread count or on
// the other sequences of the batch.
#pragma once

#include <ATen/ATen.h>

#include "common/models/gated_delta_rule.h"

namespace specwire {

// Shapes and dtypes as GatedDeltaRuleRecurrent (gated_delta_rule.h): q, k [B, T, nk, dk] and
// v [B, T, nv, dv] in the compute dtype (any strides, last dimension contiguous), g [B, T, nv]
// fp32, beta [B, T, nv] (any float dtype), initial_state [B, nv, dk, dv] fp32 or undefined. q and
// k are L2-normalised here (x · rsqrt(Σx² + 1e-6), in fp32) and q is scaled by dk^-1/2.
DeltaRuleResult GatedDeltaRuleFused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, const at::Tensor& beta,
                                    const at::Tensor& initial_state);

}  // namespace specwire
