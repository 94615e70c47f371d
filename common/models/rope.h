// Rotary position embedding (RoPE) as transformers computes it, for targets and drafters alike:
// inverse frequencies in fp32 (default, "linear", "llama3" or "yarn" rescaling), cos/sin of
// position × frequency in fp32 times the attention scaling (YaRN's attention factor, else 1),
// rounded to the compute dtype, applied with the half-split rotate_half on the first rotary_dim
// dims of a head. The config side (which keys, which defaults) is ParseRope in model_config.cc.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "common/model_config.h"

namespace specwire {

class RotaryEmbedding {
 public:
  RotaryEmbedding(const RopeConfig& rope, int64_t head_dim);

  int64_t rotary_dim() const { return rotary_dim_; }
  const at::Tensor& inv_freq() const { return inv_freq_; }  // [rotary_dim / 2] fp32, CPU
  double attention_scaling() const { return attention_scaling_; }

  // cos and sin for positions [start, start + len), each [len, rotary_dim] in `dtype` on `device`.
  std::pair<at::Tensor, at::Tensor> CosSin(int64_t start, int64_t len, at::ScalarType dtype,
                                           const at::Device& device) const;

  // Rotates x: [B, heads, T, head_dim] with cos/sin [T, rotary_dim]; dims past rotary_dim pass
  // through (partial rotary, Qwen3.5).
  static at::Tensor Apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

 private:
  // inv_freq_ on the devices it has been asked for (one host copy per device, ever: a forward
  // then queues only device work, which a CUDA graph can capture). Shared by copies.
  struct DeviceCopies;
  const at::Tensor& InvFreqOn(const at::Device& device) const;

  int64_t rotary_dim_;
  at::Tensor inv_freq_;
  double attention_scaling_ = 1.0;
  std::shared_ptr<DeviceCopies> device_copies_;
};

}  // namespace specwire
