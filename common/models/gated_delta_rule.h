// The gated delta rule of Qwen3.5 / Qwen3.6's Gated DeltaNet layers, as transformers' torch
// fallbacks compute it (models/qwen3_5/modeling_qwen3_5.py: torch_chunk_gated_delta_rule and
// torch_recurrent_gated_delta_rule): the reference kernels. The fused CPU kernel of --kernels
// fast is delta_rule_fused.h; the layer that calls them is qwen3_5.h.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace specwire {

// Gated delta rule (Yang et al., "Gated Delta Networks"), per value head h and token t:
//   S_t = exp(g_t) S_{t-1} + k_t (β_t (v_t − exp(g_t) S_{t-1}ᵀ k_t))ᵀ        S: [dk, dv]
//   o_t = S_tᵀ q_t
// with q, k L2-normalised (eps 1e-6, in fp32) and q scaled by dk^-1/2. Key heads serve
// nv / nk consecutive value heads (grouped value attention).
//
// Shared argument shapes: q, k [B, T, nk, dk]; v [B, T, nv, dv]; g [B, T, nv] fp32 (log decay,
// <= 0); beta [B, T, nv]; initial_state [B, nv, dk, dv] fp32, or undefined for zeros.
// `out` is [B, T, nv, dv] in q's dtype; `final_state` [B, nv, dk, dv] fp32.
struct DeltaRuleResult {
  at::Tensor out;
  at::Tensor final_state;
};

// transformers' torch_chunk_gated_delta_rule: chunks of `chunk_size` tokens, inside a chunk the
// delta-rule updates are condensed by a unit-lower-triangular solve (the UT transform), between
// chunks the state is carried sequentially. Chunks are processed a block at a time, so memory
// grows linearly with T (the reference materialises all chunks' [C, C] matrices at once; the
// arithmetic per chunk is identical).
DeltaRuleResult GatedDeltaRuleChunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, const at::Tensor& beta,
                                      const at::Tensor& initial_state, int64_t chunk_size = 64);

// transformers' torch_recurrent_gated_delta_rule: one token at a time. Used for single-token
// decode steps, as transformers does (its results differ from the chunked form by rounding only).
DeltaRuleResult GatedDeltaRuleRecurrent(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& g,
                                        const at::Tensor& beta, const at::Tensor& initial_state);

}  // namespace specwire
