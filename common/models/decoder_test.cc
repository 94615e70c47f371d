#include "common/models/decoder.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model_config.h"
#include "common/models/llama.h"
#include "common/models/rope.h"
#include "common/models/test_models.h"
#include "gtest/gtest.h"

namespace specwire {
namespace {

// max |a - b| / max |b|: one number for "these states agree", robust to entries near zero.
double RelDiff(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  const double scale = b64.abs().max().item<double>();
  return (a64 - b64).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

ModelConfig MustParse(const std::string& json) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(json);
  EXPECT_TRUE(c.ok()) << c.status() << "\n" << json;
  return c.ok() ? *c : ModelConfig();
}

// Tiny Llama-family configs: 2 query heads sharing 1 KV head, head_dim 12 (!= hidden / heads).
// `extra` adds or overrides keys.
ModelConfig TinyConfig(const std::string& model_type, const std::string& extra = "",
                       int64_t layers = 2) {
  return MustParse(absl::StrCat(R"({"model_type": ")", model_type,
                                R"(", "vocab_size": 32, "hidden_size": 16,
          "intermediate_size": 24, "num_attention_heads": 2, "num_key_value_heads": 1,
          "head_dim": 12, "max_position_embeddings": 64, "rope_theta": 10000,
          "num_hidden_layers": )",
                                layers, extra.empty() ? "" : ", ", extra, "}"));
}

ModelConfig SlidingConfig(int64_t layers = 2) {
  std::string types;
  for (int64_t i = 0; i < layers; ++i)
    absl::StrAppend(&types, i ? ", " : "", "\"sliding_attention\"");
  return TinyConfig("qwen3",
                    absl::StrCat(R"("use_sliding_window": true, "sliding_window": 4, "layer_types": [)",
                                 types, "]"),
                    layers);
}

// Fills every weight the model lists with seeded noise (norm weights near 1, matrices scaled by
// 1 / sqrt(fan_in)) and places the model on the test device (testing::TestDevice).
void FillRandom(DecoderModel& model, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  model.ForEachWeight([&](const WeightSlot& s) {
    at::Tensor t = at::randn(s.shape, gen, at::kFloat);
    if (s.shape.size() == 1 && absl::StrContains(s.name, "norm")) {
      t = 1.0 + 0.1 * t;
    } else if (s.shape.size() == 1) {
      t = 0.1 * t;  // biases
    } else if (!absl::StrContains(s.name, "embed_tokens")) {
      t = t / std::sqrt(static_cast<double>(s.shape[1]));
    }
    *s.slot = t;
  });
  model.Prepare(std::vector<at::Device>(model.num_layers(), testing::TestDevice()));
}

std::unique_ptr<DecoderModel> RandomModel(const ModelConfig& config, uint64_t seed = 7) {
  std::unique_ptr<DecoderModel> model = BuildLlamaFamilyModel(config, at::kFloat);
  FillRandom(*model, seed);
  return model;
}

at::Tensor Tokens(std::vector<int64_t> ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  return at::tensor(ids, at::kLong).view({1, n});
}

CaptureSpec AllTaps(const DecoderModel& m) {
  CaptureSpec spec;
  for (int64_t i = 0; i < m.num_layers(); ++i) spec.layers.push_back(i);
  spec.embedding = true;
  spec.final_norm = true;
  return spec;
}

// --- RMSNorm ---------------------------------------------------------------------------------

TEST(RmsNormTest, PlainAndOnePlusWeightMatchHandComputedReference) {
  const std::vector<std::vector<double>> x = {{1, 2, 3, 4}, {-1, 0.5, 0, 2}};
  const std::vector<double> w = {0.5, 1, 2, -1};
  const double eps = 1e-6;
  at::Tensor xt = at::tensor({1.0f, 2.0f, 3.0f, 4.0f, -1.0f, 0.5f, 0.0f, 2.0f}).view({2, 4});
  at::Tensor wt = at::tensor({0.5f, 1.0f, 2.0f, -1.0f});
  at::Tensor plain = RmsNorm(xt, wt, eps, NormKind::kPlain);
  at::Tensor one_plus = RmsNorm(xt, wt, eps, NormKind::kOnePlusWeight);
  ASSERT_EQ(plain.sizes(), xt.sizes());
  EXPECT_EQ(plain.scalar_type(), at::kFloat);
  EXPECT_EQ(one_plus.scalar_type(), at::kFloat);
  for (int r = 0; r < 2; ++r) {
    double ms = 0;
    for (double v : x[r]) ms += v * v / 4;
    const double inv_rms = 1.0 / std::sqrt(ms + eps);  // row 0: 1 / sqrt(7.5)
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(plain[r][i].item<double>(), w[i] * x[r][i] * inv_rms, 1e-6) << r << "," << i;
      EXPECT_NEAR(one_plus[r][i].item<double>(), (1 + w[i]) * x[r][i] * inv_rms, 1e-6)
          << r << "," << i;
    }
  }
  // A zero weight zeroes the plain norm but leaves (1 + w) at identity scaling.
  at::Tensor zero = at::zeros({4});
  EXPECT_TRUE(at::equal(RmsNorm(xt, zero, eps, NormKind::kPlain), at::zeros({2, 4})));
  EXPECT_LT(RelDiff(RmsNorm(xt, zero, eps, NormKind::kOnePlusWeight),
                    RmsNorm(xt, at::ones({4}), eps, NormKind::kPlain)),
            1e-7);
}

TEST(RmsNormTest, KeepsTheInputDtypeAndRoundsLikeTransformers) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  at::Tensor x = at::randn({3, 64}, gen, at::kFloat).to(at::kBFloat16);
  at::Tensor w = (1.0 + 0.1 * at::randn({64}, gen, at::kFloat)).to(at::kBFloat16);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6);  // fp32
  // kPlain: the normed state is rounded to bf16 before the (bf16) weight multiplies it.
  at::Tensor plain = RmsNorm(x, w, 1e-6, NormKind::kPlain);
  EXPECT_EQ(plain.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(plain, w * normed.to(at::kBFloat16)));
  // kOnePlusWeight: one rounding of the fp32 product at the end.
  at::Tensor one_plus = RmsNorm(x, w, 1e-6, NormKind::kOnePlusWeight);
  EXPECT_EQ(one_plus.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(one_plus, (normed * (1.0 + w.to(at::kFloat))).to(at::kBFloat16)));
}

TEST(RmsNormFusedTest, MatchesTheCompositeOnRandomShapesAndDependsOnlyOnTheRow) {
  // Lengths around the 16-lane vectors (tails of every size), strided rows (q/k heads are views
  // into a fused projection), fp32 and bf16.
  c10::InferenceMode inference;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t dim : {1, 3, 15, 16, 17, 31, 33, 64, 100, 129, 768}) {
      SCOPED_TRACE(absl::StrCat(c10::toString(dtype), " dim ", dim));
      at::Tensor wide = (3.0 * at::randn({37, 2 * dim + 5}, gen, at::kFloat)).to(dtype);
      at::Tensor x = wide.narrow(1, 2, dim);  // rows 2·dim + 5 apart
      at::Tensor w = (1.0 + 0.2 * at::randn({dim}, gen, at::kFloat)).to(dtype);
      at::Tensor fused = RmsNormFused(x, w, 1e-6);
      at::Tensor composite = RmsNorm(x, w, 1e-6, NormKind::kPlain);
      ASSERT_EQ(fused.scalar_type(), dtype);
      // Only the order of a row's sum of squares differs: fp32 rounding of the mean, which in
      // bf16 can flip the last bit of an element.
      const double tol = dtype == at::kFloat ? 2e-6 : 8e-3;
      EXPECT_LE(RelDiff(fused, composite), tol);
      // A row's result does not depend on which rows share the call.
      at::Tensor some = RmsNormFused(x.narrow(0, 5, 7), w, 1e-6);
      EXPECT_TRUE(at::equal(some, fused.narrow(0, 5, 7)));
      at::Tensor one = RmsNormFused(x.narrow(0, 36, 1), w, 1e-6);
      EXPECT_TRUE(at::equal(one, fused.narrow(0, 36, 1)));
    }
  }
}

// --- Rotary embedding ------------------------------------------------------------------------

TEST(RotaryEmbeddingTest, DefaultInverseFrequencies) {
  RopeConfig rope;
  rope.theta = 10000.0;
  RotaryEmbedding emb(rope, 16);
  EXPECT_EQ(emb.rotary_dim(), 16);
  ASSERT_EQ(emb.inv_freq().sizes(), at::IntArrayRef({8}));
  EXPECT_EQ(emb.inv_freq().scalar_type(), at::kFloat);
  for (int i = 0; i < 8; ++i) {
    const double expected = 1.0 / std::pow(10000.0, 2.0 * i / 16);
    EXPECT_NEAR(emb.inv_freq()[i].item<double>() / expected, 1.0, 1e-6) << i;
  }
}

TEST(RotaryEmbeddingTest, LinearScalingDividesEveryFrequency) {
  RopeConfig plain, linear;
  linear.type = "linear";
  linear.factor = 4.0;
  at::Tensor a = RotaryEmbedding(plain, 16).inv_freq();
  at::Tensor b = RotaryEmbedding(linear, 16).inv_freq();
  EXPECT_LT(RelDiff(b * 4.0, a), 1e-7);
}

TEST(RotaryEmbeddingTest, Llama3ScalingKeepsHighFrequenciesAndDividesTheLowest) {
  // Llama 3.1 8B: head_dim 128, theta 5e5, factor 8, low 1, high 4, original 8192.
  RopeConfig base;
  base.theta = 500000.0;
  RopeConfig llama3 = base;
  llama3.type = "llama3";
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_position_embeddings = 8192;
  at::Tensor a = RotaryEmbedding(base, 128).inv_freq();
  at::Tensor b = RotaryEmbedding(llama3, 128).inv_freq();
  ASSERT_EQ(b.size(0), 64);
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = a[i].item<double>(), g = b[i].item<double>();
    const double wavelen = 2 * M_PI / f;
    if (wavelen < 8192.0 / 4.0) {  // high frequency: untouched
      EXPECT_EQ(g, f) << i;
      ++kept;
    } else if (wavelen > 8192.0 / 1.0) {  // low frequency: divided by factor
      EXPECT_NEAR(g / (f / 8.0), 1.0, 1e-6) << i;
      ++divided;
    } else {  // in between: a blend, strictly between the two
      EXPECT_LT(g, f) << i;
      EXPECT_GT(g, f / 8.0) << i;
      ++blended;
    }
  }
  EXPECT_EQ(b[0].item<float>(), a[0].item<float>());
  EXPECT_NEAR(b[63].item<double>() / (a[63].item<double>() / 8.0), 1.0, 1e-6);
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(RotaryEmbeddingTest, ApplyRotatesHalfSplitPairs) {
  RopeConfig rope;
  RotaryEmbedding emb(rope, 8);
  auto [cos, sin] = emb.CosSin(0, 3, at::kFloat, at::kCPU);
  ASSERT_EQ(cos.sizes(), at::IntArrayRef({3, 8}));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor x = at::randn({1, 2, 3, 8}, gen, at::kFloat);  // [B, heads, T, D]
  at::Tensor y = RotaryEmbedding::Apply(x, cos, sin);
  // Position 0 is the identity.
  EXPECT_LT(RelDiff(y.select(2, 0), x.select(2, 0)), 1e-7);
  // Position p rotates the pair (i, i + 4) by p * inv_freq[i].
  for (int p = 1; p < 3; ++p) {
    for (int i = 0; i < 4; ++i) {
      const double angle = p * emb.inv_freq()[i].item<double>();
      const double x1 = x[0][1][p][i].item<double>(), x2 = x[0][1][p][i + 4].item<double>();
      EXPECT_NEAR(y[0][1][p][i].item<double>(), x1 * std::cos(angle) - x2 * std::sin(angle), 1e-5);
      EXPECT_NEAR(y[0][1][p][i + 4].item<double>(), x2 * std::cos(angle) + x1 * std::sin(angle),
                  1e-5);
    }
  }
}

TEST(RotaryEmbeddingTest, PartialRotaryLeavesTrailingDimsUntouched) {
  RopeConfig rope;
  rope.partial_rotary_factor = 0.25;
  RotaryEmbedding emb(rope, 16);
  EXPECT_EQ(emb.rotary_dim(), 4);
  EXPECT_EQ(emb.inv_freq().size(0), 2);
  // Frequencies are those of a 4-dim rotary: 1 / theta^(2i / 4).
  EXPECT_NEAR(emb.inv_freq()[1].item<double>(), 1.0 / 100.0, 1e-8);
  auto [cos, sin] = emb.CosSin(5, 4, at::kFloat, at::kCPU);  // positions 5..8
  ASSERT_EQ(cos.sizes(), at::IntArrayRef({4, 4}));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(6);
  at::Tensor x = at::randn({2, 3, 4, 16}, gen, at::kFloat);
  at::Tensor y = RotaryEmbedding::Apply(x, cos, sin);
  ASSERT_EQ(y.sizes(), x.sizes());
  EXPECT_TRUE(at::equal(y.narrow(-1, 4, 12), x.narrow(-1, 4, 12)));
  EXPECT_GT(RelDiff(y.narrow(-1, 0, 4), x.narrow(-1, 0, 4)), 1e-2);
  // Rotation preserves the norm of the rotated part.
  EXPECT_LT(RelDiff(y.narrow(-1, 0, 4).norm(2, -1), x.narrow(-1, 0, 4).norm(2, -1)), 1e-6);
}

// --- KV cache ---------------------------------------------------------------------------------

struct CacheCase {
  const char* name;
  ModelConfig config;
};
std::vector<CacheCase> CacheCases() {
  return {
      {"qwen3", TinyConfig("qwen3")},
      {"qwen2", TinyConfig("qwen2")},
      {"llama_biases", TinyConfig("llama", R"("attention_bias": true, "mlp_bias": true)")},
      {"qwen3_sliding_window_4", SlidingConfig()},
      {"qwen3_mixed_full_sliding",
       TinyConfig(
           "qwen3",
           R"("use_sliding_window": true, "sliding_window": 3,)"
           R"( "layer_types": ["full_attention", "sliding_attention"])")},
  };
}

const std::vector<int64_t> kTen = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};

// A cache case's model and its uncached forward of kTen with every tap.
struct FullForward {
  std::unique_ptr<DecoderModel> model;
  at::Tensor ids;
  CaptureSpec taps;
  CapturedStates states;
  at::Tensor logits;
};

FullForward RunFullForward(const CacheCase& c, LogitsMode logits) {
  FullForward f;
  f.model = RandomModel(c.config);
  f.ids = Tokens(kTen);
  f.taps = AllTaps(*f.model);
  f.logits = f.model->Forward(f.ids, nullptr, f.taps, &f.states, logits);
  return f;
}

// A cached forward's states of positions [start, start + len) against the full forward's.
void ExpectStatesMatch(const CapturedStates& part, const FullForward& f, int64_t start,
                       int64_t len) {
  for (int64_t l = 0; l < f.model->num_layers(); ++l) {
    EXPECT_LE(RelDiff(part.layers.at(l), f.states.layers.at(l).narrow(1, start, len)), 1e-5)
        << "layer " << l;
  }
  EXPECT_LE(RelDiff(part.final_norm, f.states.final_norm.narrow(1, start, len)), 1e-5);
}

TEST(KvCacheTest, LastTokenStepMatchesFullForward) {
  c10::InferenceMode inference;
  for (const CacheCase& c : CacheCases()) {
    SCOPED_TRACE(c.name);
    const FullForward f = RunFullForward(c, LogitsMode::kLast);
    const int64_t N = static_cast<int64_t>(kTen.size());
    ASSERT_EQ(f.logits.sizes(), at::IntArrayRef({1, 32}));

    auto cache = f.model->NewCache(1, N);
    f.model->Forward(f.ids.narrow(1, 0, N - 1), cache.get(), {}, nullptr, LogitsMode::kNone);
    EXPECT_EQ(cache->length, N - 1);
    CapturedStates step;
    at::Tensor step_logits =
        f.model->Forward(f.ids.narrow(1, N - 1, 1), cache.get(), f.taps, &step, LogitsMode::kLast);
    EXPECT_EQ(cache->length, N);

    EXPECT_LE(RelDiff(step_logits, f.logits), 1e-5);
    ExpectStatesMatch(step, f, N - 1, 1);
  }
}

TEST(KvCacheTest, ChunkedPrefillMatchesFullForward) {
  c10::InferenceMode inference;
  for (const CacheCase& c : CacheCases()) {
    SCOPED_TRACE(c.name);
    const FullForward f = RunFullForward(c, LogitsMode::kAll);
    const int64_t N = static_cast<int64_t>(kTen.size());

    // Chunks 3 + 4 + 2 + 1: past > 0 with T > 1, crossing the sliding window.
    auto cache = f.model->NewCache(1, N + 2);  // spare capacity is fine
    int64_t start = 0;
    for (int64_t len : {3, 4, 2, 1}) {
      SCOPED_TRACE(absl::StrCat("chunk at ", start));
      CapturedStates part;
      at::Tensor logits = f.model->Forward(f.ids.narrow(1, start, len), cache.get(), f.taps,
                                           &part, LogitsMode::kAll);
      EXPECT_LE(RelDiff(logits, f.logits.narrow(1, start, len)), 1e-5);
      EXPECT_LE(RelDiff(part.embedding, f.states.embedding.narrow(1, start, len)), 0);
      ExpectStatesMatch(part, f, start, len);
      start += len;
    }
    EXPECT_EQ(cache->length, N);
  }
}

TEST(KvCacheTest, BatchedCacheMatchesPerRowCache) {
  c10::InferenceMode inference;
  auto model = RandomModel(SlidingConfig());
  at::Tensor ids =
      at::tensor({3, 1, 4, 1, 5, 9, 2, 6, 7, 7, 0, 31, 12, 8, 8, 1}, at::kLong).view({2, 8});
  auto batch_cache = model->NewCache(2, 8);
  model->Forward(ids.narrow(1, 0, 6), batch_cache.get(), {}, nullptr, LogitsMode::kNone);
  at::Tensor batch_logits =
      model->Forward(ids.narrow(1, 6, 2), batch_cache.get(), {}, nullptr, LogitsMode::kLast);
  for (int64_t b = 0; b < 2; ++b) {
    at::Tensor row = ids.narrow(0, b, 1);
    at::Tensor alone = model->Forward(row, nullptr, {}, nullptr, LogitsMode::kLast);
    EXPECT_LE(RelDiff(batch_logits.narrow(0, b, 1), alone), 1e-5) << "row " << b;
  }
}

TEST(SlidingWindowTest, WindowIncludesTheQueryAndExcludesOlderKeys) {
  // One sliding layer (window 4): the output at position t sees tokens t-3 .. t only (the MLP is
  // per position), so changing token t-4 leaves it bit for bit unchanged and changing t-3 does not.
  c10::InferenceMode inference;
  auto model = RandomModel(SlidingConfig(/*layers=*/1));
  const int64_t t = 8;
  auto layer0 = [&](std::vector<int64_t> tokens) {
    CaptureSpec spec;
    spec.layers = {0};
    CapturedStates s;
    model->Forward(Tokens(tokens), nullptr, spec, &s, LogitsMode::kNone);
    return s.layers.at(0).select(1, t);
  };
  const at::Tensor base = layer0(kTen);
  std::vector<int64_t> outside = kTen, inside = kTen;
  outside[t - 4] = 30;
  inside[t - 3] = 30;
  EXPECT_TRUE(at::equal(layer0(outside), base));
  EXPECT_GT(RelDiff(layer0(inside), base), 1e-4);

  // A window at least as long as the sequence is full attention.
  ModelConfig wide = SlidingConfig(1);
  wide.sliding_window = 10;
  ModelConfig full = wide;
  full.layer_types = {LayerType::kFullAttention};
  full.sliding_window = 0;
  CapturedStates a, b;
  CaptureSpec spec;
  spec.layers = {0};
  RandomModel(wide)->Forward(Tokens(kTen), nullptr, spec, &a, LogitsMode::kNone);
  RandomModel(full)->Forward(Tokens(kTen), nullptr, spec, &b, LogitsMode::kNone);
  EXPECT_LE(RelDiff(a.layers.at(0), b.layers.at(0)), 1e-6);
  // And a binding window changes the result.
  EXPECT_GT(RelDiff(base, b.layers.at(0).select(1, t)), 1e-4);
}

// --- Padding ----------------------------------------------------------------------------------

TEST(PaddedBatchTest, RightPaddedRowsMatchEachSequenceAlone) {
  c10::InferenceMode inference;
  for (const CacheCase& c : CacheCases()) {
    SCOPED_TRACE(c.name);
    auto model = RandomModel(c.config);
    const std::vector<std::vector<int64_t>> seqs = {kTen, {7, 2, 30, 11, 4, 4}};
    const CaptureSpec taps = AllTaps(*model);
    for (int64_t pad : {0, 31}) {
      SCOPED_TRACE(absl::StrCat("pad token ", pad));
      at::Tensor ids = at::full({2, 10}, pad, at::kLong);
      for (int64_t b = 0; b < 2; ++b) {
        for (size_t t = 0; t < seqs[b].size(); ++t) ids[b][t] = seqs[b][t];
      }
      CapturedStates batch;
      model->Forward(ids, nullptr, taps, &batch, LogitsMode::kNone);
      for (int64_t b = 0; b < 2; ++b) {
        const int64_t len = static_cast<int64_t>(seqs[b].size());
        CapturedStates alone;
        model->Forward(Tokens(seqs[b]), nullptr, taps, &alone, LogitsMode::kNone);
        auto row = [&](const at::Tensor& t) { return t.select(0, b).narrow(0, 0, len); };
        EXPECT_LE(RelDiff(row(batch.embedding), alone.embedding.select(0, 0)), 0);
        for (int64_t l = 0; l < model->num_layers(); ++l) {
          EXPECT_LE(RelDiff(row(batch.layers.at(l)), alone.layers.at(l).select(0, 0)), 1e-6)
              << "row " << b << " layer " << l;
        }
        EXPECT_LE(RelDiff(row(batch.final_norm), alone.final_norm.select(0, 0)), 1e-6)
            << "row " << b;
      }
    }
  }
}

// --- Packed forwards ---------------------------------------------------------------------------

TEST(PackedForwardTest, EachSequenceIsBitIdenticalToItAloneAndCloseToTheUnpackedForward) {
  c10::InferenceMode inference;
  std::mt19937 rng(20261202);
  for (const CacheCase& c : CacheCases()) {
    SCOPED_TRACE(c.name);
    auto model = RandomModel(c.config);
    const CaptureSpec taps = AllTaps(*model);
    std::vector<std::vector<int64_t>> pool;
    for (int64_t len : {1, 2, 5, 8, 13, 40}) {
      std::vector<int64_t> seq(len);
      for (int64_t& t : seq) t = static_cast<int64_t>(rng() % model->config().vocab_size);
      pool.push_back(seq);
    }
    std::vector<std::vector<CapturedStates>> alone;
    for (const auto& seq : pool) alone.push_back(model->ForwardPacked({seq}, taps));
    for (int batch = 0; batch < 6; ++batch) {
      std::vector<size_t> members(2 + rng() % 5);
      for (size_t& m : members) m = rng() % pool.size();
      std::vector<std::vector<int64_t>> seqs;
      for (size_t m : members) seqs.push_back(pool[m]);
      std::vector<CapturedStates> got = model->ForwardPacked(seqs, taps);
      ASSERT_EQ(got.size(), members.size());
      for (size_t i = 0; i < members.size(); ++i) {
        const CapturedStates& want = alone[members[i]][0];
        SCOPED_TRACE(
            absl::StrCat("batch ", batch, " position ", i, " length ", pool[members[i]].size()));
        EXPECT_TRUE(at::equal(got[i].embedding, want.embedding));
        for (int64_t l = 0; l < model->num_layers(); ++l) {
          EXPECT_TRUE(at::equal(got[i].layers.at(l), want.layers.at(l))) << "layer " << l;
        }
        EXPECT_TRUE(at::equal(got[i].final_norm, want.final_norm));
      }
    }
    // The same math as a plain forward of the sequence (other row counts: rounding only).
    for (size_t m = 0; m < pool.size(); ++m) {
      CapturedStates plain;
      model->Forward(Tokens(pool[m]), nullptr, taps, &plain, LogitsMode::kNone);
      for (int64_t l = 0; l < model->num_layers(); ++l) {
        EXPECT_LE(RelDiff(alone[m][0].layers.at(l), plain.layers.at(l).select(0, 0)), 1e-5);
      }
      EXPECT_LE(RelDiff(alone[m][0].final_norm, plain.final_norm.select(0, 0)), 1e-5);
    }
  }
}

// --- Early exit -------------------------------------------------------------------------------

TEST(EarlyExitTest, CapturingLayerZeroAloneEqualsCaptureInAFullRun) {
  c10::InferenceMode inference;
  auto model = RandomModel(TinyConfig("qwen3", "", /*layers=*/3));
  at::Tensor ids = Tokens(kTen);
  CapturedStates full;
  at::Tensor logits = model->Forward(ids, nullptr, AllTaps(*model), &full, LogitsMode::kAll);
  ASSERT_TRUE(logits.defined());
  CaptureSpec only0;
  only0.layers = {0};
  CapturedStates part;
  at::Tensor none = model->Forward(ids, nullptr, only0, &part, LogitsMode::kNone);
  EXPECT_FALSE(none.defined());
  ASSERT_EQ(part.layers.size(), 1u);
  EXPECT_TRUE(at::equal(part.layers.at(0), full.layers.at(0)));
  EXPECT_FALSE(part.embedding.defined());
  EXPECT_FALSE(part.final_norm.defined());
}

// A layer that adds 1 and counts its calls: shows which layers a forward runs, without weights.
class CountingLayer : public DecoderLayer {
 public:
  explicit CountingLayer(int* calls) : calls_(calls) {}
  at::Tensor Forward(const at::Tensor& h, const ForwardContext&, LayerCache*) override {
    ++*calls_;
    return h + 1;
  }
  void ForEachWeight(const WeightVisitor&) override {}
  void Prepare(const at::Device& device) override { device_ = device; }
  std::unique_ptr<LayerCache> NewCache(int64_t, int64_t) const override {
    return std::make_unique<LayerCache>();
  }
  std::string KernelVariant() const override { return "counting"; }

 private:
  int* calls_;  // owned by the test
};

TEST(EarlyExitTest, LayersAfterTheLastNeededOneDoNotRun) {
  c10::InferenceMode inference;
  ModelConfig config = TinyConfig("qwen3", "", /*layers=*/3);
  config.tie_word_embeddings = true;
  std::vector<int> calls(3, 0);
  std::vector<std::unique_ptr<DecoderLayer>> layers;
  for (int& c : calls) layers.push_back(std::make_unique<CountingLayer>(&c));
  DecoderModel model(config, at::kFloat, NormKind::kPlain, std::move(layers));
  FillRandom(model, 1);
  at::Tensor ids = Tokens({1, 2, 3});

  auto run = [&](CaptureSpec spec, LogitsMode mode, ModelCache* cache = nullptr) {
    std::fill(calls.begin(), calls.end(), 0);
    CapturedStates s;
    model.Forward(ids, cache, spec, &s, mode);
    return s;
  };
  CaptureSpec layer0, layer1, embedding, final_norm;
  layer0.layers = {0};
  layer1.layers = {1, 0};
  embedding.embedding = true;
  final_norm.final_norm = true;

  CapturedStates s = run(layer0, LogitsMode::kNone);
  EXPECT_EQ(calls, std::vector<int>({1, 0, 0}));
  EXPECT_TRUE(at::equal(s.layers.at(0), at::embedding(model.embed_tokens(), ids) + 1));
  run(layer1, LogitsMode::kNone);
  EXPECT_EQ(calls, std::vector<int>({1, 1, 0}));
  run(embedding, LogitsMode::kNone);
  EXPECT_EQ(calls, std::vector<int>({0, 0, 0}));
  run(final_norm, LogitsMode::kNone);
  EXPECT_EQ(calls, std::vector<int>({1, 1, 1}));
  run(layer0, LogitsMode::kLast);
  EXPECT_EQ(calls, std::vector<int>({1, 1, 1}));
  // With a cache every layer runs, or later layers' caches would miss these positions.
  auto cache = model.NewCache(1, 3);
  run(layer0, LogitsMode::kNone, cache.get());
  EXPECT_EQ(calls, std::vector<int>({1, 1, 1}));
}

}  // namespace
}  // namespace specwire
