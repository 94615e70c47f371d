#include "common/models/rope.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>

#include "common/models/torch_util.h"

namespace specwire {
namespace {

// Python's `scalar / tensor` is `tensor.reciprocal() * scalar`; keep that rounding.
at::Tensor ScalarDiv(double s, const at::Tensor& t) { return at::reciprocal(t) * s; }

// YaRN (transformers' _compute_yarn_parameters, operation by operation: fp32 tensors, double
// scalars): frequencies blended between extrapolation (high frequencies, kept) and
// interpolation (low frequencies, divided by `factor`) over a linear ramp between the
// correction dimensions of beta_fast and beta_slow rotations.
at::Tensor YarnInverseFrequencies(const RopeConfig& rope, int64_t dim) {
  const double base = rope.theta;
  const double omax = static_cast<double>(rope.original_max_position_embeddings);
  auto correction_dim = [&](double num_rotations) {
    return (static_cast<double>(dim) * std::log(omax / (num_rotations * 2 * M_PI))) /
           (2 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // prevents a singular ramp
  at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  at::Tensor pos_freqs =
      at::pow(at::Scalar(base), at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim);
  at::Tensor extrapolation = at::reciprocal(pos_freqs) * 1.0;
  at::Tensor interpolation = at::reciprocal(pos_freqs * rope.factor) * 1.0;
  at::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const RopeConfig& rope, int64_t head_dim)
    : device_copies_(std::make_shared<DeviceCopies>()) {
  // transformers' dim = int(head_dim × partial_rotary_factor); an odd dim still gives
  // ceil(dim / 2) frequencies (arange(0, dim, 2)), which turn twice as many dims.
  const int64_t dim =
      static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  rotary_dim_ = 2 * ((dim + 1) / 2);
  // inv_freq = 1 / (theta ** (arange(0, dim, 2) / dim))
  at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  at::Tensor inv_freq = ScalarDiv(1.0, at::pow(at::Scalar(rope.theta), exponents));
  if (rope.type == "linear") {
    inv_freq = inv_freq / rope.factor;
  } else if (rope.type == "llama3") {
    // Llama 3.1 long-context rescaling: long wavelengths divided by `factor`, short ones kept,
    // a smooth blend in between.
    const double old_len = static_cast<double>(rope.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / rope.low_freq_factor;
    const double high_freq_wavelen = old_len / rope.high_freq_factor;
    at::Tensor wavelen = ScalarDiv(2 * M_PI, inv_freq);
    at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
    at::Tensor smooth = (ScalarDiv(old_len, wavelen) - rope.low_freq_factor) /
                        (rope.high_freq_factor - rope.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
    at::Tensor medium =
        at::logical_not(wavelen < high_freq_wavelen) * at::logical_not(wavelen > low_freq_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  } else if (rope.type == "yarn") {
    inv_freq = YarnInverseFrequencies(rope, dim);
    attention_scaling_ = rope.attention_factor;
  }
  inv_freq_ = inv_freq.contiguous();
}

struct RotaryEmbedding::DeviceCopies {
  std::mutex mu;
  std::map<std::string, at::Tensor> by_device;
};

const at::Tensor& RotaryEmbedding::InvFreqOn(const at::Device& device) const {
  if (device.is_cpu()) return inv_freq_;
  std::lock_guard<std::mutex> lock(device_copies_->mu);
  at::Tensor& t = device_copies_->by_device[device.str()];
  if (!t.defined()) t = ToDeviceAsync(inv_freq_, device);
  return t;  // std::map never moves its elements
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::CosSin(int64_t start, int64_t len,
                                                          at::ScalarType dtype,
                                                          const at::Device& device) const {
  // On a GPU the table is computed there, as transformers computes it (inv_freq is a buffer
  // on the model's device; the position product, cos and sin run on the device): the host
  // never waits for a copy, and the values are the device's own cos and sin.
  at::Tensor pos =
      at::arange(start, start + len, at::TensorOptions().dtype(at::kLong).device(device))
          .to(at::kFloat);                                                    // [T]
  const at::Tensor& inv = InvFreqOn(device);                                  // [dim/2]
  at::Tensor freqs = pos.unsqueeze(1) * inv.unsqueeze(0);                     // [T, dim/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                               // [T, dim]
  // attention_scaling is 1.0 for default, linear and llama3 (an exact no-op in fp32).
  return {(emb.cos() * attention_scaling_).to(device, dtype),
          (emb.sin() * attention_scaling_).to(device, dtype)};
}

at::Tensor RotaryEmbedding::Apply(const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin) {
  const int64_t rot = cos.size(-1);
  const int64_t half = rot / 2;
  at::Tensor xr = rot == x.size(-1) ? x : x.narrow(-1, 0, rot);
  // rotate_half(x) = cat(-x2, x1)
  at::Tensor rotated = at::cat({-xr.narrow(-1, half, half), xr.narrow(-1, 0, half)}, -1);
  at::Tensor out = xr * cos + rotated * sin;
  if (rot == x.size(-1)) return out;
  return at::cat({out, x.narrow(-1, rot, x.size(-1) - rot)}, -1);
}

}  // namespace specwire
