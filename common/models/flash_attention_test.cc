#include "common/models/flash_attention.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace specwire {
namespace {

struct Shape {
  int64_t B, Hkv, group, T, D, past, window;
  std::string Name() const {
    return absl::StrCat("B", B, " Hkv", Hkv, " group", group, " T", T, " D", D, " past", past,
                        " window", window);
  }
};

// q [B, Hq, T, D] and k, v [B, Hkv, S, D], as the forward has them: transposed views of
// [B, T, heads, D] rows.
struct Inputs {
  at::Tensor q, k, v;
};
Inputs RandomInputs(const Shape& s, at::ScalarType dtype, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t S = s.past + s.T;
  auto make = [&](int64_t rows, int64_t heads) {
    return (at::randn({s.B, rows, heads, s.D}, gen, at::kFloat) * 1.5).to(dtype).transpose(1, 2);
  };
  return {make(s.T, s.Hkv * s.group), make(S, s.Hkv), make(S, s.Hkv)};
}

// The definition, in float64: softmax(scale · q kᵀ + mask) v, keys repeated per query group.
at::Tensor Reference(const Inputs& in, int64_t past, int64_t window, double scale) {
  const int64_t B = in.q.size(0), Hq = in.q.size(1), T = in.q.size(2), D = in.q.size(3);
  const int64_t group = Hq / in.k.size(1), S = in.k.size(2);
  at::Tensor q = in.q.to(at::kDouble);
  at::Tensor k = in.k.to(at::kDouble).repeat_interleave(group, 1);
  at::Tensor v = in.v.to(at::kDouble).repeat_interleave(group, 1);
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * scale;  // [B, Hq, T, S]
  at::Tensor pos = at::arange(past, past + T, at::kLong).unsqueeze(1);
  at::Tensor key = at::arange(0, S, at::kLong).unsqueeze(0);
  at::Tensor visible = key <= pos;
  if (window > 0) visible = at::logical_and(visible, pos - key < window);
  scores = scores.masked_fill(at::logical_not(visible), -std::numeric_limits<double>::infinity());
  at::Tensor out = at::matmul(at::softmax(scores, -1), v);  // [B, Hq, T, D]
  return out.transpose(1, 2).reshape({B, T, Hq * D});
}

// What the forward called before: scaled_dot_product_attention with the same mask.
at::Tensor Sdpa(const Inputs& in, int64_t past, int64_t window, double scale) {
  const int64_t T = in.q.size(2), S = in.k.size(2);
  at::Tensor pos = at::arange(past, past + T, at::kLong).unsqueeze(1);
  at::Tensor key = at::arange(0, S, at::kLong).unsqueeze(0);
  at::Tensor visible = key <= pos;
  if (window > 0) visible = at::logical_and(visible, pos - key < window);
  at::Tensor out = at::scaled_dot_product_attention(in.q, in.k, in.v, visible, 0.0, false, scale,
                                                    in.q.size(1) != in.k.size(1));
  return out.transpose(1, 2).reshape({in.q.size(0), T, in.q.size(1) * in.q.size(3)});
}

double MaxRelError(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double scale = w.abs().max().item<double>();
  return (g - w).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

// Seeded random shapes over the space the targets produce: head dims from 1 to 256 (odd ones
// too), one to four query heads per kv head, sequences around the 64-row and 64-key blocks, a
// cache in front or not, windows shorter and longer than the sequence.
std::vector<Shape> RandomShapes(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::initializer_list<int64_t> v) { return v.begin()[rng() % v.size()]; };
  std::vector<Shape> out;
  for (int i = 0; i < n; ++i) {
    Shape s;
    s.B = pick({1, 1, 2});
    s.Hkv = pick({1, 2, 3});
    s.group = pick({1, 2, 4});
    s.T = pick({16, 17, 31, 63, 64, 65, 100, 130, 200});
    s.D = pick({1, 3, 8, 12, 16, 17, 32, 48, 64, 80, 96, 128, 256});
    s.past = pick({0, 0, 1, 5, 64, 70});
    s.window = pick({0, 0, 0, 1, 4, 7, 64, 100, 300});
    out.push_back(s);
  }
  return out;
}

class FlashAttentionTest : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    kernel_ = CpuFlashAttentionKernel(GetParam());
    // Machines without the instructions keep scaled_dot_product_attention; the forward must not
    // try the kernel there.
    if (kernel_.empty()) {
      EXPECT_FALSE(UseCpuFlashAttention(at::zeros({1, 1, 64, 8}, GetParam())));
    }
  }
  std::string kernel_;
};

// Against float64 softmax attention: fp32 within 1e-5 of the largest output (as libtorch's own
// kernel is); bf16 within 1.5× libtorch's bf16 error on the same inputs, plus one bf16 ulp.
TEST_P(FlashAttentionTest, MatchesTheDefinitionOverRandomShapes) {
  if (kernel_.empty()) return;
  const bool bf16 = GetParam() == at::kBFloat16;
  int n = 0;
  for (const Shape& s : RandomShapes(60, bf16 ? 11 : 12)) {
    SCOPED_TRACE(s.Name());
    const Inputs in = RandomInputs(s, GetParam(), 1000 + n++);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
    const at::Tensor got = CpuFlashAttention(in.q, in.k, in.v, s.past, s.window, scale);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{s.B, s.T, s.Hkv * s.group * s.D}));
    ASSERT_EQ(got.scalar_type(), GetParam());
    const at::Tensor want = Reference(in, s.past, s.window, scale);
    const double err = MaxRelError(got, want);
    if (bf16) {
      const double sdpa = MaxRelError(Sdpa(in, s.past, s.window, scale), want);
      EXPECT_LE(err, 1.5 * sdpa + 1.0 / 128) << "sdpa's error " << sdpa;
    } else {
      EXPECT_LE(err, 1e-5);
    }
  }
}

// A row's bits do not depend on the rows computed with it: the first rows of a longer sequence,
// the rows of a continuation over a cache, the other sequences of a batch, contiguous or strided
// inputs, one thread or two.
TEST_P(FlashAttentionTest, RowsDependOnlyOnTheirOwnInputs) {
  if (kernel_.empty()) return;
  for (const Shape& s : RandomShapes(12, 21)) {
    SCOPED_TRACE(s.Name());
    Shape two = s;
    two.B = 2;
    two.past = 0;
    two.T = s.T + 37;
    const Inputs in = RandomInputs(two, GetParam(), 77);
    const double scale = 0.125;
    const at::Tensor full = CpuFlashAttention(in.q, in.k, in.v, 0, s.window, scale);

    // Each sequence alone.
    for (int64_t b = 0; b < 2; ++b) {
      const at::Tensor alone =
          CpuFlashAttention(in.q.narrow(0, b, 1), in.k.narrow(0, b, 1), in.v.narrow(0, b, 1), 0,
                            s.window, scale);
      EXPECT_TRUE(BitEqual(alone, full.narrow(0, b, 1))) << "sequence " << b;
    }
    // The first T rows as a sequence of their own (keys past T never seen).
    const int64_t t = s.T;
    const at::Tensor prefix = CpuFlashAttention(in.q.narrow(2, 0, t), in.k.narrow(2, 0, t),
                                                in.v.narrow(2, 0, t), 0, s.window, scale);
    EXPECT_TRUE(BitEqual(prefix, full.narrow(1, 0, t))) << "prefix";
    // The remaining rows as a continuation over the first T as past keys.
    const int64_t rest = two.T - t;
    if (rest >= kMinFlashAttentionRows) {
      const at::Tensor cont = CpuFlashAttention(in.q.narrow(2, t, rest), in.k, in.v, t, s.window,
                                                scale);
      EXPECT_TRUE(BitEqual(cont, full.narrow(1, t, rest))) << "continuation";
    }
    // Contiguous copies of the strided views.
    const at::Tensor contiguous = CpuFlashAttention(in.q.contiguous(), in.k.contiguous(),
                                                    in.v.contiguous(), 0, s.window, scale);
    EXPECT_TRUE(BitEqual(contiguous, full)) << "contiguous";
    // One intra-op thread.
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    const at::Tensor one = CpuFlashAttention(in.q, in.k, in.v, 0, s.window, scale);
    at::set_num_threads(threads);
    EXPECT_TRUE(BitEqual(one, full)) << "one thread";
  }
}

TEST_P(FlashAttentionTest, RefusesInconsistentShapes) {
  if (kernel_.empty()) return;
  const auto o = at::TensorOptions().dtype(GetParam());
  const at::Tensor q = at::zeros({1, 4, 16, 8}, o), k = at::zeros({1, 2, 16, 8}, o);
  EXPECT_THROW(CpuFlashAttention(q, at::zeros({1, 3, 16, 8}, o), at::zeros({1, 3, 16, 8}, o), 0,
                                 0, 1.0),
               c10::Error);  // 4 query heads over 3 kv heads
  EXPECT_THROW(CpuFlashAttention(q, k, k, 1, 0, 1.0), c10::Error);  // S != past + T
  EXPECT_THROW(CpuFlashAttention(q, k, at::zeros({1, 2, 16, 4}, o), 0, 0, 1.0), c10::Error);
  EXPECT_THROW(CpuFlashAttention(q, k.to(at::kDouble), k, 0, 0, 1.0), c10::Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlashAttentionTest,
                         ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) {
                           return std::string(info.param == at::kFloat ? "Fp32" : "Bf16");
                         });

}  // namespace
}  // namespace specwire
