#include "common/models/linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cpuid.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace specwire {
namespace {

// The batch size oneDNN's weight layout is chosen for. Fixed: the layout decides the kernel,
// and one layout for every call keeps a row's bits independent of the row count.
constexpr int64_t kLayoutRows = 2048;

// torch's registered oneDNN ops, when this torch has them (x86 builds with oneDNN).
struct OneDnnOps {
  std::optional<c10::OperatorHandle> reorder, linear;
  bool ok() const { return reorder.has_value() && linear.has_value(); }
};
const OneDnnOps& Ops() {
  static const OneDnnOps ops = [] {
    OneDnnOps o;
    if (!at::hasMKLDNN()) return o;
    auto& d = c10::Dispatcher::singleton();
    o.reorder = d.findSchema({"mkldnn::_reorder_linear_weight", ""});
    o.linear = d.findSchema({"mkldnn::_linear_pointwise", ""});
    return o;
  }();
  return ops;
}

// oneDNN builds (and caches, with its JIT code) one primitive per product shape, ~0.6 MB each
// here: a server that saw every row count would grow by hundreds of MB and compile a kernel for
// every new request length. Row counts are rounded up to a bucket instead (8-row steps to 64,
// then eight buckets per doubling: at most 12.5 % more rows, 8 + 8·log2(M / 64) shapes).
// Padding rows are zeros, and a row's bits do not depend on the row count.
int64_t RowBucket(int64_t rows) {
  if (rows <= 64) return std::max<int64_t>(8, (rows + 7) / 8 * 8);
  int64_t octave = 64;
  while (octave * 2 <= rows) octave *= 2;
  const int64_t step = octave / 8;
  return (rows + step - 1) / step * step;
}

// oneDNN's packed bf16 weights need AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT: on an AVX2-only CPU
// mkldnn::_reorder_linear_weight refuses bf16, so such machines keep at::linear for bf16.
bool Bf16PackingSupported() {
  static const bool yes = [] {
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq")) {
      return true;
    }
    unsigned a = 0, b = 0, c = 0, d = 0;  // CPUID.(EAX=7, ECX=1):EDX[5] is AVX-NE-CONVERT
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (d & (1u << 5)) != 0;
  }();
  return yes;
}

bool Packable(at::ScalarType dtype, const at::Device& device) {
  if (!device.is_cpu() || !Ops().ok()) return false;
  return dtype == at::kFloat || (dtype == at::kBFloat16 && Bf16PackingSupported());
}

}  // namespace

std::string FastLinearKernel(at::ScalarType dtype, const at::Device& device) {
  return Packable(dtype, device) ? "onednn-packed linears" : "";
}

std::string LinearKernelSuffix(KernelSet kernels, at::ScalarType dtype, const at::Device& device) {
  const std::string fast = kernels == KernelSet::kFast ? FastLinearKernel(dtype, device) : "";
  return fast.empty() ? "" : ", " + fast;
}

Linear::Linear(const at::Tensor& w, const at::Tensor& b, KernelSet kernels)
    : w_(w), b_(b) {
  if (kernels != KernelSet::kFast || !Packable(w.scalar_type(), w.device())) return;
  torch::jit::Stack stack{w.contiguous(), c10::IValue(kLayoutRows)};
  Ops().reorder->callBoxed(&stack);
  w_ = stack.back().toTensor();
  packed_ = true;
}

at::Tensor Linear::operator()(const at::Tensor& x) const {
  if (!packed_) return at::linear(x, w_, b_);
  const int64_t in_features = x.size(-1);
  at::Tensor rows = x.reshape({-1, in_features});  // a view where the strides allow it
  if (rows.stride(-1) != 1) rows = rows.contiguous();
  const int64_t m = rows.size(0), bucket = RowBucket(m);
  if (bucket != m) rows = at::constant_pad_nd(rows, {0, 0, 0, bucket - m});
  torch::jit::Stack stack{rows,
                          w_,
                          b_.defined() ? c10::IValue(b_) : c10::IValue(),
                          c10::IValue(std::string("none")),
                          c10::IValue(c10::List<std::optional<at::Scalar>>()),
                          c10::IValue()};
  Ops().linear->callBoxed(&stack);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = stack.back().toTensor().size(-1);
  return stack.back().toTensor().narrow(0, 0, m).view(shape);  // the real rows: a prefix
}

}  // namespace specwire
