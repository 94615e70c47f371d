#include "common/models/linear.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace specwire {
namespace {

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

double MaxRelError(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double scale = w.abs().max().item<double>();
  return (g - w).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

class LinearTest : public ::testing::TestWithParam<at::ScalarType> {};

// Random layer shapes (odd ones too), with and without a bias.
struct Layer {
  at::Tensor w, b;
  std::string name;
};
std::vector<Layer> RandomLayers(at::ScalarType dtype, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<Layer> out;
  for (int i = 0; i < n; ++i) {
    const int64_t in = std::initializer_list<int64_t>{8, 24, 64, 96, 257, 768}.begin()[rng() % 6];
    const int64_t outf = std::initializer_list<int64_t>{1, 12, 40, 96, 512, 1280}.begin()[rng() % 6];
    Layer l;
    l.w = (at::randn({outf, in}, gen) / std::sqrt(static_cast<double>(in))).to(dtype);
    if (rng() % 2) l.b = (at::randn({outf}, gen) * 0.1).to(dtype);
    l.name = absl::StrCat("[", outf, ", ", in, "]", l.b.defined() ? " + bias" : "");
    out.push_back(l);
  }
  return out;
}

// kReference is at::linear itself; kFast is within rounding of it (fp32 products summed in
// another order; in bf16 both round the fp32 sums once).
TEST_P(LinearTest, FastIsWithinRoundingOfReference) {
  const at::ScalarType dtype = GetParam();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (const Layer& l : RandomLayers(dtype, 12, 17)) {
    SCOPED_TRACE(l.name);
    const Linear reference(l.w, l.b, KernelSet::kReference), fast(l.w, l.b, KernelSet::kFast);
    EXPECT_FALSE(reference.packed());
    EXPECT_EQ(fast.packed(), !FastLinearKernel(dtype, at::kCPU).empty());
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{8, l.w.size(1)}, {2, 37, l.w.size(1)}, {1, 130, l.w.size(1)}}) {
      const at::Tensor x = at::randn(shape, gen).to(dtype);
      const at::Tensor want = at::linear(x, l.w, l.b);
      EXPECT_TRUE(BitEqual(reference(x), want));
      const at::Tensor got = fast(x);
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_LE(MaxRelError(got, want), dtype == at::kFloat ? 1e-5 : 1e-2);
    }
  }
}

// What the packed layout and batched decoding rely on: on at least 8 rows, a multiple of 4, a
// row's bits depend neither on how many rows share the product nor on the thread count; rows
// read through a stride (views into a fused product) give the bits of the same rows contiguous.
TEST_P(LinearTest, FastRowsDependOnlyOnThemselves) {
  const at::ScalarType dtype = GetParam();
  if (FastLinearKernel(dtype, at::kCPU).empty()) return;  // at::linear there: its own tests
  std::mt19937_64 rng(23);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(29);
  for (const Layer& l : RandomLayers(dtype, 8, 31)) {
    SCOPED_TRACE(l.name);
    const Linear fast(l.w, l.b, KernelSet::kFast);
    const at::Tensor rows = at::randn({1100, l.w.size(1)}, gen).to(dtype);
    const at::Tensor first = fast(rows.narrow(0, 0, 8));
    for (int k = 0; k < 6; ++k) {
      const int64_t m = 8 + 4 * static_cast<int64_t>(rng() % 270);
      const at::Tensor out = fast(rows.narrow(0, 0, m));
      EXPECT_TRUE(BitEqual(out.narrow(0, 0, 8), first)) << m << " rows";
      const int threads = at::get_num_threads();
      at::set_num_threads(1);
      const at::Tensor one = fast(rows.narrow(0, 0, m));
      at::set_num_threads(threads);
      EXPECT_TRUE(BitEqual(one, out)) << m << " rows, one thread";
    }
    const at::Tensor wide = at::randn({64, 2 * l.w.size(1)}, gen).to(dtype);
    const at::Tensor strided = wide.narrow(1, 0, l.w.size(1));
    EXPECT_TRUE(BitEqual(fast(strided), fast(strided.contiguous())));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearTest, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) {
                           return std::string(info.param == at::kFloat ? "Fp32" : "Bf16");
                         });

}  // namespace
}  // namespace specwire
