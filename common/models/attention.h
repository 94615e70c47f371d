// Softmax attention over a growing KV cache, shared by every attention flavour (Llama / Qwen2 /
// Qwen3 layers, Qwen3.5 gated attention, the DFlash drafter).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "common/models/decoder.h"
#include "common/models/kernel_set.h"

namespace specwire {

// K/V of one attention layer: [B, kv_heads, capacity, head_dim]; the first `length` positions of
// the owning ModelCache are filled.
class KvCache : public LayerCache {
 public:
  KvCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
          at::ScalarType dtype, const at::Device& device);
  int64_t bytes() const override { return static_cast<int64_t>(k.nbytes() + v.nbytes()); }
  at::Tensor k, v;
};

// Grows per-layer K/V tensors [1, kv_heads, capacity, head_dim] to `capacity` positions, keeping
// the first `keep` (a drafter's context caches; new layers are appended up to `layers`).
void GrowKv(std::vector<at::Tensor>& k, std::vector<at::Tensor>& v, size_t layers,
            int64_t kv_heads, int64_t head_dim, int64_t keep, int64_t capacity,
            const at::TensorOptions& options);

// Which softmax-attention kernel a caller runs.
enum class AttentionKernel {
  // libtorch's scaled_dot_product_attention: what transformers runs on the same inputs. The
  // drafters' replays keep the reference loops' own arithmetic with it, and the Qwen3.5 hybrid,
  // whose every other rounding point is transformers', stays bit-identical to transformers.
  kSdpa,
  // CpuFlashAttention (common/models/flash_attention.h) for calls of at least
  // kMinFlashAttentionRows query rows on a CPU that has its instructions, SDPA otherwise: 2-3x
  // faster attention in bf16, ~1.4x in fp32, within rounding of SDPA (not bit-identical).
  kFlashWhereAvailable,
};

// The attention kernel of a kernel set (common/models/kernel_set.h).
inline AttentionKernel AttentionKernelOf(KernelSet kernels) {
  return kernels == KernelSet::kFast ? AttentionKernel::kFlashWhereAvailable : AttentionKernel::kSdpa;
}

// The kernel a forward of `dtype` on `device` runs for its prefill-sized calls, as the contract's
// kernel_variant names it: "sdpa", "flash avx512-bf16", "flash avx512-fp32".
std::string AttentionKernelName(AttentionKernel kernel, at::ScalarType dtype,
                                const at::Device& device);

// q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] for the T new positions (already normed and rotated).
// Appends k/v to `cache` at ctx.past_len when given and attends over [0, past_len + T) with causal
// masking; `sliding_window` > 0 limits keys to the last `sliding_window` positions (inclusive of
// the query's own). Returns [B, T, Hq * D].
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const ForwardContext& ctx, KvCache* cache, int64_t sliding_window,
                           double scale, AttentionKernel kernel = AttentionKernel::kSdpa);

}  // namespace specwire
