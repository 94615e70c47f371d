#include "common/models/attention.h"

#include "common/models/flash_attention.h"

namespace specwire {

KvCache::KvCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
                 at::ScalarType dtype, const at::Device& device) {
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  k = at::empty({batch, kv_heads, capacity, head_dim}, opts);
  v = at::empty({batch, kv_heads, capacity, head_dim}, opts);
}

void GrowKv(std::vector<at::Tensor>& k, std::vector<at::Tensor>& v, size_t layers,
            int64_t kv_heads, int64_t head_dim, int64_t keep, int64_t capacity,
            const at::TensorOptions& options) {
  for (size_t l = 0; l < layers; ++l) {
    at::Tensor nk = at::empty({1, kv_heads, capacity, head_dim}, options);
    at::Tensor nv = at::empty({1, kv_heads, capacity, head_dim}, options);
    if (keep > 0) {
      nk.narrow(2, 0, keep).copy_(k[l].narrow(2, 0, keep));
      nv.narrow(2, 0, keep).copy_(v[l].narrow(2, 0, keep));
    }
    if (l < k.size()) {
      k[l] = nk;
      v[l] = nv;
    } else {
      k.push_back(nk);
      v.push_back(nv);
    }
  }
}

std::string AttentionKernelName(AttentionKernel kernel, at::ScalarType dtype,
                                const at::Device& device) {
  if (kernel == AttentionKernel::kFlashWhereAvailable && device.is_cpu()) {
    std::string flash = CpuFlashAttentionKernel(dtype);
    if (!flash.empty()) return flash;
  }
  return "sdpa";
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                           const ForwardContext& ctx, KvCache* cache, int64_t sliding_window,
                           double scale, AttentionKernel kernel) {
  const int64_t past = ctx.past_len;
  const int64_t T = q.size(2);
  at::Tensor k = k_new, v = v_new;
  if (cache != nullptr) {
    TORCH_CHECK(past + T <= cache->k.size(2), "KV cache overflow: ", past + T, " > ",
                cache->k.size(2));
    cache->k.narrow(2, past, T).copy_(k_new);
    cache->v.narrow(2, past, T).copy_(v_new);
    k = cache->k.narrow(2, 0, past + T);
    v = cache->v.narrow(2, 0, past + T);
  } else {
    TORCH_CHECK(past == 0, "a forward with past tokens needs a cache");
  }
  if (kernel == AttentionKernel::kFlashWhereAvailable && UseCpuFlashAttention(q)) {
    return CpuFlashAttention(q, k, v, past, sliding_window, scale);  // [B, T, Hq * D]
  }
  const int64_t S = past + T;
  const bool window_binds = sliding_window > 0 && S > sliding_window;
  const bool gqa = q.size(1) != k.size(1);

  at::Tensor out;
  if (!window_binds && past == 0) {
    out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/T > 1, scale, gqa);
  } else if (!window_binds && T == 1) {
    out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale, gqa);
  } else {
    // Query t sits at absolute position past + t; key j is visible when j <= past + t and, with a
    // window, past + t - j < sliding_window.
    at::Tensor qpos = at::arange(past, past + T, at::TensorOptions().dtype(at::kLong).device(q.device()));
    at::Tensor kpos = at::arange(0, S, at::TensorOptions().dtype(at::kLong).device(q.device()));
    at::Tensor diff = qpos.unsqueeze(1) - kpos.unsqueeze(0);  // [T, S]
    at::Tensor mask = diff >= 0;
    if (sliding_window > 0) mask = at::logical_and(mask, diff < sliding_window);
    out = at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale, gqa);
  }
  // [B, Hq, T, D] -> [B, T, Hq * D]
  return out.transpose(1, 2).reshape({q.size(0), T, q.size(1) * q.size(3)});
}

}  // namespace specwire
