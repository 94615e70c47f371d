// Qwen3.5 hybrid layers without a checkpoint: the chunked delta rule against the recurrent one,
// and cached decoding (prefill, chunked prefill, single steps) against one full forward of a tiny
// random model. Agreement with transformers itself is the parity tier's job
// (tests/parity/test_hybrid_parity.py).
#include "common/models/qwen3_5.h"

#include <ATen/Parallel.h>

#include <array>
#include <vector>

#include <gtest/gtest.h>

#include "common/model_config.h"
#include "common/models/attention.h"
#include "common/models/delta_rule_fused.h"
#include "common/models/gated_delta_rule.h"
#include "common/models/test_models.h"

namespace specwire {
namespace {

double RelErr(const at::Tensor& ours, const at::Tensor& ref) {
  at::Tensor r = ref.to(at::kDouble);
  return ((ours.to(at::kDouble) - r).norm() / r.norm().clamp_min(1e-30)).item<double>();
}

struct DeltaRuleCase {
  at::Tensor q, k, v, g, beta, state;
};

// Random inputs shaped like a GVA layer: 2 key heads serving 4 value heads.
DeltaRuleCase RandomDeltaRule(int64_t B, int64_t T, uint64_t seed) {
  at::manual_seed(seed);
  const int64_t nk = 2, nv = 4, dk = 16, dv = 8;
  DeltaRuleCase c;
  c.q = at::randn({B, T, nk, dk});
  c.k = at::randn({B, T, nk, dk});
  c.v = at::randn({B, T, nv, dv});
  // Log decays spread over (−∞, 0), some close to 0 (long memory), some strongly negative.
  c.g = -at::softplus(at::randn({B, T, nv}) * 2);
  c.beta = at::sigmoid(at::randn({B, T, nv}));
  c.state = at::randn({B, nv, dk, dv}) * 0.5;
  return c;
}

class ChunkedVsRecurrent : public ::testing::TestWithParam<int64_t> {};

TEST_P(ChunkedVsRecurrent, SameOutputsAndFinalState) {
  c10::InferenceMode inference;
  const int64_t T = GetParam();
  for (bool with_state : {false, true}) {
    DeltaRuleCase c = RandomDeltaRule(2, T, 1234 + T);
    at::Tensor init = with_state ? c.state : at::Tensor();
    DeltaRuleResult chunked = GatedDeltaRuleChunked(c.q, c.k, c.v, c.g, c.beta, init);
    DeltaRuleResult recurrent = GatedDeltaRuleRecurrent(c.q, c.k, c.v, c.g, c.beta, init);
    ASSERT_EQ(chunked.out.sizes(), (std::vector<int64_t>{2, T, 4, 8}));
    EXPECT_EQ(chunked.out.scalar_type(), at::kFloat);
    EXPECT_LE(RelErr(chunked.out, recurrent.out), 1e-5) << "T=" << T << " state=" << with_state;
    EXPECT_LE(RelErr(chunked.final_state, recurrent.final_state), 1e-5)
        << "T=" << T << " state=" << with_state;
  }
}

// Around one chunk (64), two chunks, and past one block of 16 chunks (1024 tokens).
INSTANTIATE_TEST_SUITE_P(Lengths, ChunkedVsRecurrent, ::testing::Values(1, 63, 64, 65, 130, 1100));

// The fast set's fused kernel against the recurrent reference: same function, other roundings.
// Head widths that fill whole registers, part of one, and more than eight (the scalar path).
TEST(GatedDeltaRuleFused, MatchesTheRecurrentReference) {
  c10::InferenceMode inference;
  for (const auto& [nk, nv, dk, dv] : std::vector<std::array<int64_t, 4>>{
           {2, 4, 16, 8}, {1, 4, 16, 64}, {2, 2, 64, 48}, {1, 2, 8, 144}, {4, 8, 32, 16}}) {
    for (int64_t T : {1, 5, 70, 300}) {
      at::manual_seed(100 + T + dv);
      const int64_t B = 2;
      at::Tensor q = at::randn({B, T, nk, dk}), k = at::randn({B, T, nk, dk});
      at::Tensor v = at::randn({B, T, nv, dv});
      at::Tensor g = -at::softplus(at::randn({B, T, nv}) * 2);
      at::Tensor beta = at::sigmoid(at::randn({B, T, nv}));
      at::Tensor state = at::randn({B, nv, dk, dv}) * 0.5;
      for (bool with_state : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "nk " << nk << " nv " << nv << " dk " << dk << " dv "
                                          << dv << " T " << T << " state " << with_state);
        at::Tensor init = with_state ? state : at::Tensor();
        DeltaRuleResult want = GatedDeltaRuleRecurrent(q, k, v, g, beta, init);
        DeltaRuleResult got = GatedDeltaRuleFused(q, k, v, g, beta, init);
        ASSERT_EQ(got.out.sizes(), want.out.sizes());
        EXPECT_LE(RelErr(got.out, want.out), 1e-5);
        EXPECT_LE(RelErr(got.final_state, want.final_state), 1e-5);
        if (with_state) {
          EXPECT_TRUE(at::equal(init, state)) << "the initial state was written";
        }
        // A sequence alone, and with one intra-op thread: the same bits.
        DeltaRuleResult alone =
            GatedDeltaRuleFused(q.narrow(0, 1, 1), k.narrow(0, 1, 1), v.narrow(0, 1, 1),
                                g.narrow(0, 1, 1), beta.narrow(0, 1, 1),
                                with_state ? init.narrow(0, 1, 1) : at::Tensor());
        EXPECT_TRUE(at::equal(alone.out, got.out.narrow(0, 1, 1)));
        const int threads = at::get_num_threads();
        at::set_num_threads(1);
        DeltaRuleResult one = GatedDeltaRuleFused(q, k, v, g, beta, init);
        at::set_num_threads(threads);
        EXPECT_TRUE(at::equal(one.out, got.out));
        EXPECT_TRUE(at::equal(one.final_state, got.final_state));
      }
    }
  }
}

// bf16 inputs (what a bf16 forward passes): outputs in bf16, within bf16 rounding of fp32.
TEST(GatedDeltaRuleFused, KeepsTheInputDtype) {
  c10::InferenceMode inference;
  DeltaRuleCase c = RandomDeltaRule(1, 130, 77);
  auto bf = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  DeltaRuleResult r = GatedDeltaRuleFused(bf(c.q), bf(c.k), bf(c.v), c.g, bf(c.beta), c.state);
  EXPECT_EQ(r.out.scalar_type(), at::kBFloat16);
  EXPECT_EQ(r.final_state.scalar_type(), at::kFloat);
  DeltaRuleResult ref = GatedDeltaRuleRecurrent(bf(c.q).to(at::kFloat), bf(c.k).to(at::kFloat),
                                                bf(c.v).to(at::kFloat), c.g,
                                                bf(c.beta).to(at::kFloat), c.state);
  EXPECT_LE(RelErr(r.out, ref.out), 1e-2);
}

TEST(GatedDeltaRuleChunked, ContinuesFromAState) {
  c10::InferenceMode inference;
  DeltaRuleCase c = RandomDeltaRule(1, 150, 7);
  DeltaRuleResult whole = GatedDeltaRuleChunked(c.q, c.k, c.v, c.g, c.beta, at::Tensor());
  // 70 + 80 tokens: the second part starts mid-chunk relative to the whole sequence.
  auto part = [&](int64_t start, int64_t len, const at::Tensor& state) {
    return GatedDeltaRuleChunked(c.q.narrow(1, start, len), c.k.narrow(1, start, len),
                                 c.v.narrow(1, start, len), c.g.narrow(1, start, len),
                                 c.beta.narrow(1, start, len), state);
  };
  DeltaRuleResult first = part(0, 70, at::Tensor());
  DeltaRuleResult second = part(70, 80, first.final_state);
  EXPECT_LE(RelErr(at::cat({first.out, second.out}, 1), whole.out), 1e-5);
  EXPECT_LE(RelErr(second.final_state, whole.final_state), 1e-5);
}

TEST(GatedDeltaRuleChunked, KeepsTheInputDtype) {
  c10::InferenceMode inference;
  DeltaRuleCase c = RandomDeltaRule(1, 65, 3);
  auto bf = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  DeltaRuleResult r =
      GatedDeltaRuleChunked(bf(c.q), bf(c.k), bf(c.v), c.g, bf(c.beta), at::Tensor());
  EXPECT_EQ(r.out.scalar_type(), at::kBFloat16);
  EXPECT_EQ(r.final_state.scalar_type(), at::kFloat);
}

TEST(Qwen3_5Model, RejectsSlidingLayers) {
  ModelConfig c = testing::TinyHybridConfig();
  c.layer_types[1] = LayerType::kSlidingAttention;
  auto built = BuildQwen3_5Model(c, at::kFloat);
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.status().message().find("layer_types[1]"), std::string::npos);
}

TEST(Qwen3_5Model, KernelVariants) {
  auto model = testing::RandomTinyHybrid();
  EXPECT_EQ(model->layer(0).KernelVariant(),
            "gated-delta-rule chunked fp32 (chunk 64) / recurrent decode");
  EXPECT_EQ(model->layer(3).KernelVariant(), "sdpa gated");  // the hybrid's default
  auto fast = BuildQwen3_5Model(testing::TinyHybridConfig(), at::kFloat, KernelSet::kFast);
  ASSERT_TRUE(fast.ok()) << fast.status();  // layers start on the CPU
  const std::string linears = LinearKernelSuffix(KernelSet::kFast, at::kFloat, at::kCPU);
  EXPECT_EQ((*fast)->layer(3).KernelVariant(),
            AttentionKernelName(AttentionKernel::kFlashWhereAvailable, at::kFloat, at::kCPU) +
                " gated" + linears);
  EXPECT_EQ((*fast)->layer(0).KernelVariant(), "gated-delta-rule recurrent fused fp32" + linears);
}

// Prefill of n tokens, then single cached steps, equals one forward over all tokens; so does a
// prefill split into several multi-token pieces (chunked prefill continuing the GDN states).
TEST(Qwen3_5Model, CachedDecodingMatchesFullForward) {
  c10::InferenceMode inference;
  auto model = testing::RandomTinyHybrid();
  const int64_t total = 140;
  at::manual_seed(5);
  at::Tensor ids = at::randint(0, 96, {1, total}, at::kLong);
  CaptureSpec all;
  all.layers = {0, 1, 2, 3, 4};
  CapturedStates full_states;
  at::Tensor full = model->Forward(ids, nullptr, all, &full_states, LogitsMode::kAll);  // [1, T, V]

  auto run_pieces = [&](const std::vector<int64_t>& pieces) {
    auto cache = model->NewCache(1, total);
    std::vector<at::Tensor> logits;
    std::map<int64_t, std::vector<at::Tensor>> states;
    int64_t start = 0;
    for (int64_t len : pieces) {
      CapturedStates cs;
      logits.push_back(
          model->Forward(ids.narrow(1, start, len), cache.get(), all, &cs, LogitsMode::kAll));
      for (auto& [id, t] : cs.layers) states[id].push_back(t);
      start += len;
    }
    EXPECT_EQ(start, total);
    EXPECT_EQ(cache->length, total);
    for (auto& [id, parts] : states) {
      EXPECT_LE(RelErr(at::cat(parts, 1), full_states.layers[id]), 1e-5) << "layer " << id;
    }
    return at::cat(logits, 1);
  };

  // Prefill 65 tokens (crosses a chunk boundary), then 75 single-token steps.
  std::vector<int64_t> steps = {65};
  steps.insert(steps.end(), total - 65, 1);
  at::Tensor stepped = run_pieces(steps);
  EXPECT_LE(RelErr(stepped, full), 1e-5);
  EXPECT_EQ(stepped.argmax(-1).equal(full.argmax(-1)), true);

  // Chunked prefill: 2 + 70 + 64 tokens (first piece shorter than the conv window), then steps.
  at::Tensor chunked = run_pieces({2, 70, 64, 1, 1, 1, 1});
  EXPECT_LE(RelErr(chunked, full), 1e-5);

  // A one-token prompt takes the chunked kernel with no state, like transformers.
  at::Tensor from_one = run_pieces(std::vector<int64_t>(total, 1));
  EXPECT_LE(RelErr(from_one, full), 1e-5);
}

// Rows of a right-padded batch equal the same sequences run alone.
TEST(Qwen3_5Model, BatchRowsMatchSingleSequences) {
  c10::InferenceMode inference;
  auto model = testing::RandomTinyHybrid();
  at::manual_seed(9);
  at::Tensor ids = at::randint(0, 96, {2, 70}, at::kLong);
  CaptureSpec top;
  top.final_norm = true;
  CapturedStates batch;
  model->Forward(ids, nullptr, top, &batch, LogitsMode::kNone);
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t len = b == 0 ? 70 : 33;
    CapturedStates one;
    model->Forward(ids.narrow(0, b, 1).narrow(1, 0, len), nullptr, top, &one, LogitsMode::kNone);
    EXPECT_LE(RelErr(batch.final_norm.narrow(0, b, 1).narrow(1, 0, len), one.final_norm), 1e-5);
  }
}

}  // namespace
}  // namespace specwire
