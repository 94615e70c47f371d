// Causal softmax attention on the CPU, blocked as FlashAttention is (scores, an online softmax and
// the value product one 64-key block at a time, never the whole score matrix), with AVX-512
// kernels of our own.
//
// Why not libtorch's scaled_dot_product_attention: on CPUs without AMX its bf16 path runs no
// faster than fp32 (about 110 GFLOP/s on two Zen 4 cores at 2,048 tokens, where the bf16
// projections run at about 390), so attention took ~45 % of a bf16 forward at 2,048 tokens. Here
// bf16 scores and value products multiply bf16 pairs with fp32 accumulation (AVX512-BF16's
// vdpbf16ps), as the bf16 GEMMs do; fp32 runs fused multiply-adds on 16 lanes.
//
// Rounding points are those of libtorch's CPU flash attention: scores accumulate in fp32 and are
// scaled in fp32; the softmax (running max, exponentials, row sums) is fp32; in bf16 the
// probabilities are rounded to bf16 for the value product, which accumulates in fp32; the output
// is the fp32 accumulator divided by the fp32 row sum, rounded once to the compute dtype.
//
// Determinism: one thread computes each query row, over key blocks that start at multiples of 64
// keys, in increasing order. A fully masked block leaves a row exactly as it was (its
// probabilities are exact zeros and its rescale factor is exactly 1), so a row's bits depend on
// its query, its keys and values, its position and the window only: not on the thread count, on
// which thread ran it, on the other rows of its block, on the sequence's length beyond it, or on
// the other sequences of a batch.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace specwire {

// The kernel CpuFlashAttention runs for `dtype` on this machine ("flash avx512-bf16",
// "flash avx512-fp32"), or "" when it has none (no AVX-512 here, bf16 without AVX512-BF16, or
// another dtype): callers then use scaled_dot_product_attention.
std::string CpuFlashAttentionKernel(at::ScalarType dtype);

// Query rows below which a call keeps scaled_dot_product_attention: each call packs every key and
// value of the sequence once, which a one-token decoding step would pay in full for a single row.
inline constexpr int64_t kMinFlashAttentionRows = 16;

// True when CausalAttention should call CpuFlashAttention for q ([B, Hq, T, D]).
bool UseCpuFlashAttention(const at::Tensor& q);

// q: [B, Hq, T, D]; k, v: [B, Hkv, S, D] with S = past + T and Hq a multiple of Hkv (query head h
// reads key/value head h / (Hq / Hkv), as transformers' repeat_kv). Query t sits at position
// past + t and sees key j when j <= past + t and, with window > 0, past + t - j < window.
// Any strides. Returns [B, T, Hq * D] in q's dtype.
at::Tensor CpuFlashAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             int64_t past, int64_t window, double scale);

}  // namespace specwire
