#include "common/models/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/model_config.h"
#include "common/models/llama.h"
#include "gtest/gtest.h"

namespace specwire {
namespace {

using Tokens = std::vector<int64_t>;

constexpr int64_t kVocab = 16;

void ExpectInvalid(const absl::Status& s, std::initializer_list<absl::string_view> parts) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (absl::string_view part : parts) {
    EXPECT_TRUE(absl::StrContains(s.message(), part)) << "\"" << part << "\" not in: " << s;
  }
}

ModelConfig TinyConfig(const std::string& eos) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(absl::StrCat(
      R"({"model_type": "qwen3", "vocab_size": 16, "hidden_size": 16, "intermediate_size": 8,
          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
          "head_dim": 8, "tie_word_embeddings": false)",
      eos.empty() ? "" : absl::StrCat(R"(, "eos_token_id": )", eos), "}"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// A model whose greedy continuation of token i is (i + 1) mod 16, through the real layers and KV
// cache: the embedding is one-hot, o_proj and down_proj are zero (each layer is then exactly the
// identity on the residual stream), and lm_head maps the normed one-hot of i onto row i + 1.
// `edit_head` changes lm_head before Prepare (the products own copies of their weights after it).
std::unique_ptr<DecoderModel> SuccessorModel(
    const std::string& eos = "", const std::function<void(at::Tensor&)>& edit_head = {}) {
  auto model = BuildLlamaFamilyModel(TinyConfig(eos), at::kFloat);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  model->ForEachWeight([&](const WeightSlot& s) {
    at::Tensor t;
    if (s.name == "model.embed_tokens.weight") {
      t = at::eye(kVocab);
    } else if (s.name == "lm_head.weight") {
      t = at::roll(at::eye(kVocab), 1, 0);  // row (i + 1) % V is e_i
      if (edit_head) edit_head(t);
    } else if (absl::StrContains(s.name, "o_proj") || absl::StrContains(s.name, "down_proj")) {
      t = at::zeros(s.shape);
    } else if (s.shape.size() == 1) {
      t = at::ones(s.shape);
    } else {
      t = at::randn(s.shape, gen, at::kFloat);
    }
    *s.slot = t;
  });
  model->Prepare(std::vector<at::Device>(model->num_layers(), at::Device(at::kCPU)));
  return model;
}

GenerateOptions Options(int64_t max_new_tokens, std::vector<int64_t> stops = {}) {
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.stop_token_ids = std::move(stops);
  return o;
}

TEST(GreedyGenerateTest, StopsAtStopTokenAndIncludesIt) {
  auto model = SuccessorModel();
  const std::vector<int64_t> prompt = {2, 5};
  auto r = GreedyGenerate(*model, prompt, Options(10, {8}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({6, 7, 8}));
  EXPECT_EQ(r->finish_reason, "stop_token");
}

TEST(GreedyGenerateTest, ConfigEosStopsUnlessDisabled) {
  auto model = SuccessorModel("[9, 12]");
  const std::vector<int64_t> prompt = {5};
  auto r = GreedyGenerate(*model, prompt, Options(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({6, 7, 8, 9}));
  EXPECT_EQ(r->finish_reason, "stop_token");

  // Explicit stop tokens add to the config's.
  r = GreedyGenerate(*model, prompt, Options(10, {7}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({6, 7}));

  GenerateOptions no_eos = Options(5);
  no_eos.use_config_eos = false;
  r = GreedyGenerate(*model, prompt, no_eos);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({6, 7, 8, 9, 10}));
  EXPECT_EQ(r->finish_reason, "max_new_tokens");
}

TEST(GreedyGenerateTest, StopsAtMaxNewTokens) {
  auto model = SuccessorModel();
  const std::vector<int64_t> prompt = {13};
  auto r = GreedyGenerate(*model, prompt, Options(4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({14, 15, 0, 1}));  // wraps around the vocabulary
  EXPECT_EQ(r->finish_reason, "max_new_tokens");

  // A stop token that is also the last allowed token counts as a stop.
  r = GreedyGenerate(*model, prompt, Options(2, {15}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({14, 15}));
  EXPECT_EQ(r->finish_reason, "stop_token");

  r = GreedyGenerate(*model, prompt, Options(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({14}));
}

TEST(GreedyGenerateTest, CallbackSeesEveryTokenOnce) {
  auto model = SuccessorModel();
  const std::vector<int64_t> prompt = {1, 2, 3};
  std::vector<int64_t> seen;
  auto r = GreedyGenerate(*model, prompt, Options(5, {6}), [&](int64_t token) {
    seen.push_back(token);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({4, 5, 6}));
  EXPECT_EQ(seen, r->tokens);

  seen.clear();
  r = GreedyGenerate(*model, prompt, Options(3), [&](int64_t token) {
    seen.push_back(token);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen, r->tokens);
}

TEST(GreedyGenerateTest, CallbackReturningFalseCancels) {
  auto model = SuccessorModel();
  const std::vector<int64_t> prompt = {1};
  int calls = 0;
  auto r = GreedyGenerate(*model, prompt, Options(10), [&](int64_t) { return ++calls < 2; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(r->tokens, Tokens({2, 3}));  // the token the callback refused was emitted
  EXPECT_EQ(r->finish_reason, "cancelled");

  // Cancelling on the very first token.
  calls = 0;
  r = GreedyGenerate(*model, prompt, Options(10), [&](int64_t) {
    ++calls;
    return false;
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r->tokens, Tokens({2}));
  EXPECT_EQ(r->finish_reason, "cancelled");
}

TEST(GreedyGenerateTest, ZeroMaxNewTokensReturnsNothing) {
  auto model = SuccessorModel();
  const std::vector<int64_t> prompt = {1};
  int calls = 0;
  auto r = GreedyGenerate(*model, prompt, Options(0), [&](int64_t) {
    ++calls;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tokens.empty());
  EXPECT_EQ(calls, 0);
}

TEST(GreedyGenerateTest, InvalidInput) {
  auto model = SuccessorModel();
  ExpectInvalid(GreedyGenerate(*model, {}, Options(4)).status(), {"prompt", "empty"});
  const std::vector<int64_t> oov = {1, 2, 16};
  ExpectInvalid(GreedyGenerate(*model, oov, Options(4)).status(), {"prompt[2]", "16", "[0, 16)"});
  const std::vector<int64_t> negative = {-1, 2};
  ExpectInvalid(GreedyGenerate(*model, negative, Options(4)).status(), {"prompt[0]", "-1"});
  const std::vector<int64_t> ok = {1};
  ExpectInvalid(GreedyGenerate(*model, ok, Options(-1)).status(), {"max_new_tokens", "-1"});
}

TEST(GreedyGenerateTest, TiesGoToTheLowestTokenId) {
  // Make token 0's logit equal to the successor's after token 4: argmax picks the first maximum,
  // as torch.argmax does in transformers.
  auto model = SuccessorModel("", [](at::Tensor& head) { head[0][4] = 1.0; });
  const std::vector<int64_t> prompt = {3};
  auto r = GreedyGenerate(*model, prompt, Options(3));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, Tokens({4, 0, 1}));
}

TEST(GreedyGenerateTest, RandomModelMatchesRecomputingEveryStep) {
  // Greedy decoding through the KV cache equals argmax of a fresh full forward at every step.
  auto model = BuildLlamaFamilyModel(TinyConfig(""), at::kFloat);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(21);
  model->ForEachWeight([&](const WeightSlot& s) {
    at::Tensor t = at::randn(s.shape, gen, at::kFloat);
    *s.slot = s.shape.size() == 1 ? 1.0 + 0.1 * t : t / std::sqrt(double(s.shape.back()));
  });
  model->Prepare(std::vector<at::Device>(model->num_layers(), at::Device(at::kCPU)));
  const std::vector<int64_t> prompt = {3, 1, 4, 1, 5};
  auto r = GreedyGenerate(*model, prompt, Options(8));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tokens.size(), 8u);

  c10::InferenceMode inference;
  std::vector<int64_t> seq = prompt;
  for (int64_t expected : r->tokens) {
    at::Tensor ids = at::tensor(seq, at::kLong).view({1, static_cast<int64_t>(seq.size())});
    at::Tensor logits = model->Forward(ids, nullptr, {}, nullptr, LogitsMode::kLast);
    EXPECT_EQ(logits.argmax(-1).item<int64_t>(), expected) << "after " << seq.size() << " tokens";
    seq.push_back(expected);
  }
}

}  // namespace
}  // namespace specwire
