#include "common/models/rope.h"

#include <cmath>

namespace specwire {
namespace {

// Python's `scalar / tensor` is `tensor.reciprocal() * scalar`; keep that rounding.
at::Tensor ScalarDiv(double s, const at::Tensor& t) { return at::reciprocal(t) * s; }

}  // namespace

RotaryEmbedding::RotaryEmbedding(const RopeConfig& rope, int64_t head_dim)
    : rotary_dim_(static_cast<int64_t>(static_cast<double>(head_dim) *
                                       rope.partial_rotary_factor)) {
  const int64_t dim = rotary_dim_;
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
    at::Tensor medium = at::logical_not(wavelen < high_freq_wavelen) *
                        at::logical_not(wavelen > low_freq_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  inv_freq_ = inv_freq.contiguous();
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::CosSin(int64_t start, int64_t len,
                                                          at::ScalarType dtype,
                                                          const at::Device& device) const {
  at::Tensor pos = at::arange(start, start + len, at::kLong).to(at::kFloat);  // [T]
  at::Tensor freqs = pos.unsqueeze(1) * inv_freq_.unsqueeze(0);              // [T, dim/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                              // [T, dim]
  // attention_scaling is 1.0 for default, linear and llama3.
  return {emb.cos().to(device, dtype), emb.sin().to(device, dtype)};
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
