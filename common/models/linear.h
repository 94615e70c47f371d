// A linear layer's product y = x Wᵀ + b as a target's forward runs it.
//
// KernelSet::kReference: at::linear, the op transformers calls. KernelSet::kFast, on the CPU in
// fp32 and bf16: the weight is reordered once, at load, into oneDNN's blocked layout and every
// product runs oneDNN's kernels on it (mkldnn::_linear_pointwise, the path vLLM's CPU backend and
// torch.compile's CPU freezing take). Measured on two Zen 4 cores: fp32 products at 190-214
// GFLOP/s against at::linear's (MKL's) 116-174, 3x faster at decoding's 8 rows; bf16 the same
// oneDNN kernels as at::linear without the per-call reorder (and the same bits, as measured).
// fp32 differs from MKL within rounding.
//
// oneDNN compiles and caches a kernel per product shape, so fast products round their row count
// up to one of a few buckets (zero rows, at most 12.5 % more): memory and compilation stay bounded
// whatever lengths requests have (linear.cc, RowBucket).
//
// Batch invariance holds as for at::linear: on InvariantRows rows (at least 8, a multiple of 4) a
// row's bits do not depend on the row count, nor on the thread count (measured over 200 random
// shapes; checked by linear_test.cc on the machine that runs it).
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "common/models/kernel_set.h"

namespace specwire {

class Linear {
 public:
  Linear() = default;
  // w [out, in] and b [out] (or undefined), on their device in the compute dtype. With kFast on
  // a CPU whose torch has oneDNN, w is reordered (a copy: w is not kept); otherwise w is kept
  // as it is.
  Linear(const at::Tensor& w, const at::Tensor& b, KernelSet kernels);

  // x [..., in] (rows may be strided; the last dimension contiguous) -> [..., out].
  at::Tensor operator()(const at::Tensor& x) const;

  bool defined() const { return w_.defined(); }
  bool packed() const { return packed_; }

 private:
  at::Tensor w_;  // [out, in], plain or in oneDNN's layout
  at::Tensor b_;
  bool packed_ = false;
};

// What kFast runs for `dtype` on `device`: "onednn-packed linears", or "" (at::linear there too).
std::string FastLinearKernel(at::ScalarType dtype, const at::Device& device);

// The tail of a layer's KernelVariant: ", onednn-packed linears" where `kernels` packs them for
// `dtype` on `device`, "" where the layer runs at::linear.
std::string LinearKernelSuffix(KernelSet kernels, at::ScalarType dtype, const at::Device& device);

}  // namespace specwire
