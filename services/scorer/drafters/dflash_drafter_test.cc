#include "services/scorer/drafters/dflash_drafter.h"

#include "common/models/rope.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/safetensors.h"
#include "nlohmann/json.hpp"
#include "services/scorer/replay/replay.h"

namespace specwire {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr int64_t kVocab = 40, kHidden = 16, kHeads = 2, kKvHeads = 1, kHeadDim = 8, kInter = 24;

// A drafter config.json in z-lab's format, with overridable fields.
json TinyConfig(std::vector<std::string> layer_types = {"sliding_attention", "full_attention"}) {
  return json{{"architectures", {"DFlashDraftModel"}},
              {"model_type", "qwen3"},
              {"vocab_size", kVocab},
              {"hidden_size", kHidden},
              {"intermediate_size", kInter},
              {"num_hidden_layers", layer_types.size()},
              {"num_attention_heads", kHeads},
              {"num_key_value_heads", kKvHeads},
              {"head_dim", kHeadDim},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0},
              {"layer_types", layer_types},
              {"use_sliding_window", true},
              {"sliding_window", 3},
              {"block_size", 8},
              {"num_target_layers", 4},
              {"dflash_config", {{"mask_token_id", kVocab - 1}, {"target_layer_ids", {0, 2}}}}};
}

absl::StatusOr<DrafterConfig> Parse(const json& j) { return ParseDrafterConfig(j.dump(), "cfg"); }

void ExpectInvalid(const json& j, const std::string& needle) {
  auto c = Parse(j);
  ASSERT_FALSE(c.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(needle));
}

TEST(ParseDrafterConfigTest, ZLabFormat) {
  auto c = Parse(TinyConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->block_size, 8);
  EXPECT_EQ(c->mask_token_id, kVocab - 1);
  EXPECT_THAT(c->target_layer_ids, ElementsAre(0, 2));
  EXPECT_EQ(c->num_target_layers, 4);
  EXPECT_EQ(c->target_hidden_size(), kHidden);
  EXPECT_FALSE(c->is_causal.has_value());
  // Sliding layers are causal with the window; full layers bidirectional and unlimited.
  EXPECT_TRUE(c->LayerIsCausal(0));
  EXPECT_EQ(c->LayerWindow(0), 3);
  EXPECT_FALSE(c->LayerIsCausal(1));
  EXPECT_EQ(c->LayerWindow(1), 0);
  EXPECT_NE(c->layers.rope.type, "yarn");
}

TEST(ParseDrafterConfigTest, MissingMaskTokenIdNamesTheKey) {
  json j = TinyConfig();
  j["dflash_config"].erase("mask_token_id");
  ExpectInvalid(j, "\"dflash_config.mask_token_id\" is required but missing");
  j["dflash_config"]["mask_token_id"] = -3;
  ExpectInvalid(j, "\"dflash_config.mask_token_id\" must be a non-negative integer");
}

TEST(ParseDrafterConfigTest, TopLevelKeysAreTheFallback) {
  // dflash's _draft_value: dflash_config first, then the config itself.
  json j = TinyConfig();
  j["dflash_config"].erase("mask_token_id");
  j["mask_token_id"] = 7;
  j["dflash_config"]["block_size"] = 16;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mask_token_id, 7);
  EXPECT_EQ(c->block_size, 16);  // dflash_config wins over the top-level 8
}

TEST(ParseDrafterConfigTest, TargetLayerIds) {
  json j = TinyConfig();
  j["dflash_config"]["target_layer_ids"] = {0, 4};
  ExpectInvalid(j, "\"dflash_config.target_layer_ids\" holds layer 4, outside the target's 4");
  j["dflash_config"]["target_layer_ids"] = json::array();
  ExpectInvalid(j, "\"dflash_config.target_layer_ids\" must be a non-empty list");
  j["dflash_config"]["target_layer_ids"] = {0, "x"};
  ExpectInvalid(j, "\"dflash_config.target_layer_ids\" must hold non-negative integers");
  // Absent: dflash's build_target_layer_ids(num_target_layers, num_hidden_layers).
  j["dflash_config"].erase("target_layer_ids");
  j["num_target_layers"] = 7;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->target_layer_ids, ElementsAre(1, 4));
  j.erase("num_target_layers");
  ExpectInvalid(j, "\"dflash_config.target_layer_ids\" is missing, and num_target_layers");
}

TEST(ParseDrafterConfigTest, OtherErrorsNameTheKey) {
  json j = TinyConfig();
  j["dflash_config"]["block_size"] = 1;
  ExpectInvalid(j, "\"dflash_config.block_size\" must be an integer in [2, 4096]");
  j = TinyConfig();
  j["block_size"] = "16";
  ExpectInvalid(j, "\"block_size\" must be an integer");
  j = TinyConfig();
  j["dflash_config"] = 5;
  ExpectInvalid(j, "\"dflash_config\" must be an object");
  j = TinyConfig();
  j["model_type"] = "llama";
  ExpectInvalid(j, "\"model_type\" is \"llama\"; DFlash drafters are Qwen3 layers");
  j = TinyConfig();
  j["is_causal"] = "yes";
  ExpectInvalid(j, "\"is_causal\" must be true or false");
  j = TinyConfig();
  j.erase("hidden_size");
  ExpectInvalid(j, "\"hidden_size\" is required but missing");
  j = TinyConfig();
  j["num_target_layers"] = 0;
  ExpectInvalid(j, "\"num_target_layers\" must be a positive integer");
  ExpectInvalid(json::array(), "not a JSON object");
}

TEST(ParseDrafterConfigTest, SlidingWindowFollowsQwen3Config) {
  json j = TinyConfig();
  j["use_sliding_window"] = false;  // transformers: sliding_window = None → no window
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerWindow(0), 0);
  EXPECT_TRUE(c->LayerIsCausal(0));  // still a sliding_attention layer: causal
  j = TinyConfig();
  j["sliding_window"] = nullptr;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerWindow(0), 0);
  j = TinyConfig();
  j["is_causal"] = true;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->LayerIsCausal(1));
  j["is_causal"] = false;
  c = Parse(j);
  EXPECT_FALSE(c->LayerIsCausal(0));
}

TEST(ParseDrafterConfigTest, DflashConfigExtras) {
  json j = TinyConfig();
  j["dflash_config"]["output_multiplier"] = 0.5;
  j["dflash_config"]["final_logit_softcapping"] = 30.0;
  j["dflash_config"]["input_embedding_scale"] = "big";
  ExpectInvalid(j, "\"dflash_config.input_embedding_scale\" must be a number");
  j["dflash_config"]["input_embedding_scale"] = 2.0;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->input_embedding_scale, 2.0);
  EXPECT_EQ(c->output_multiplier, 0.5);
  EXPECT_EQ(c->final_logit_softcapping, 30.0);
}

TEST(BuildTargetLayerIdsTest, MatchesReleasedDrafters) {
  // z-lab/Qwen3-8B-DFlash-b16 (36 target layers) and Qwen3.6-27B-DFlash (64).
  EXPECT_THAT(BuildTargetLayerIds(36, 5), ElementsAre(1, 9, 17, 25, 33));
  EXPECT_THAT(BuildTargetLayerIds(64, 5), ElementsAre(1, 16, 31, 46, 61));
  EXPECT_THAT(BuildTargetLayerIds(4, 1), ElementsAre(2));
  // Python's round(2.5) == 2 (half to even).
  EXPECT_THAT(BuildTargetLayerIds(7, 3), ElementsAre(1, 2, 4));
}

TEST(YarnTest, ParsedAndComputedLikeTransformers) {
  json j = TinyConfig();
  j["rope_theta"] = 1e6;
  j["max_position_embeddings"] = 4096;
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->layers.rope.type, "yarn");
  EXPECT_EQ(c->layers.rope.theta, 1e6);
  EXPECT_EQ(c->layers.rope.original_max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(c->layers.rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  const RotaryEmbedding rope(c->layers.rope, c->layers.head_dim);
  const at::Tensor inv_freq = rope.inv_freq();
  const double scaling = rope.attention_scaling();
  EXPECT_DOUBLE_EQ(scaling, c->layers.rope.attention_factor);
  // The YaRN formula in doubles.
  const int dim = kHeadDim;
  auto corr = [&](double rot) {
    return dim * std::log(64 / (rot * 2 * M_PI)) / (2 * std::log(1e6));
  };
  double low = std::max(std::floor(corr(32)), 0.0), high = std::min(std::ceil(corr(1)), dim - 1.0);
  if (low == high) high += 0.001;
  ASSERT_EQ(inv_freq.numel(), dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(1e6, 2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extra = 1 - ramp;
    const double want = (1 / (4 * pos_freq)) * (1 - extra) + (1 / pos_freq) * extra;
    EXPECT_NEAR(inv_freq[i].item<double>(), want, want * 1e-6) << i;
  }
  // attention_factor given explicitly, and the mscale / mscale_all_dim rule.
  j["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_EQ(Parse(j)->layers.rope.attention_factor, 1.5);
  j["rope_scaling"].erase("attention_factor");
  j["rope_scaling"]["mscale"] = 2.0;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  EXPECT_DOUBLE_EQ(Parse(j)->layers.rope.attention_factor,
                   (0.2 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0));
  j["rope_scaling"]["factor"] = "x";
  ExpectInvalid(j, "\"rope_scaling.factor\" must be a number");
}

// --- Tiny random drafters on disk -------------------------------------------------------------

class DrafterFixture : public ::testing::Test {
 protected:
  // Writes config `cfg` and random weights (fc width `fc_inputs` × hidden; the config's by
  // default) plus `extra` tensors to a fresh directory.
  std::string Write(const json& cfg, int64_t fc_inputs = -1,
                    const std::vector<std::string>& extra = {}, const std::string& drop = "") {
    const std::string dir = ::testing::TempDir() + "/drafter_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                            std::to_string(counter_++);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << cfg.dump();
    const int64_t n_ids = cfg["dflash_config"]["target_layer_ids"].size();
    if (fc_inputs < 0) fc_inputs = n_ids * kHidden;
    at::manual_seed(1234);
    std::vector<std::pair<std::string, at::Tensor>> t;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm = false) {
      at::Tensor x = norm ? 1 + 0.1 * at::randn(shape) : 0.3 * at::randn(shape);
      t.emplace_back(name, x.contiguous());
    };
    add("fc.weight", {kHidden, fc_inputs});
    add("hidden_norm.weight", {kHidden}, true);
    add("norm.weight", {kHidden}, true);
    for (size_t i = 0; i < cfg["layer_types"].size(); ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", {kHidden}, true);
      add(p + "post_attention_layernorm.weight", {kHidden}, true);
      add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden});
      add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden});
      add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden});
      add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim});
      add(p + "self_attn.q_norm.weight", {kHeadDim}, true);
      add(p + "self_attn.k_norm.weight", {kHeadDim}, true);
      add(p + "mlp.gate_proj.weight", {kInter, kHidden});
      add(p + "mlp.up_proj.weight", {kInter, kHidden});
      add(p + "mlp.down_proj.weight", {kHidden, kInter});
    }
    for (const std::string& e : extra) add(e, {4});
    std::vector<TensorToWrite> w;
    for (const auto& [name, x] : t) {
      if (name == drop) continue;
      w.push_back(
          {name, DType::kF32, x.sizes().vec(),
           std::span<const std::byte>(static_cast<const std::byte*>(x.data_ptr()), x.nbytes())});
    }
    EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", w).ok());
    return dir;
  }

  std::unique_ptr<DFlashDrafter> Load(const json& cfg) {
    auto d = DFlashDrafter::Load(Write(cfg), at::kFloat, at::kCPU);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    at::manual_seed(99);
    embed_ = at::randn({kVocab, kHidden});
    head_ = at::randn({kVocab, kHidden});
    EXPECT_TRUE((*d)->SetTargetHead(embed_, head_).ok());
    return std::move(*d);
  }

  static at::Tensor Features(int64_t rows, int64_t seed = 5) {
    at::manual_seed(seed);
    return at::randn({rows, 2 * kHidden});
  }

  at::Tensor embed_, head_;
  int counter_ = 0;
};

TEST_F(DrafterFixture, LoadChecksTensors) {
  json cfg = TinyConfig();
  auto d = DFlashDrafter::Load(Write(cfg, 3 * kHidden), at::kFloat, at::kCPU);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("key \"dflash_config.target_layer_ids\" has 2 entries, so fc.weight must "
                        "be [16, 32]"));
  d = DFlashDrafter::Load(Write(cfg, -1, {"layers.0.attention_conv.base_kernel"}), at::kFloat,
                          at::kCPU);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("DFlash2 weights in a checkpoint that does not declare DFlash2"));
  d = DFlashDrafter::Load(Write(cfg, -1, {"embed_tokens.weight"}), at::kFloat, at::kCPU);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("unexpected tensor \"embed_tokens.weight\""));
  d = DFlashDrafter::Load(Write(cfg, -1, {}, "layers.1.self_attn.k_norm.weight"), at::kFloat,
                          at::kCPU);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("layers.1.self_attn.k_norm.weight"));
  d = DFlashDrafter::Load(Write(cfg, -1, {"layers.0.rotary_emb.inv_freq"}), at::kFloat, at::kCPU);
  EXPECT_TRUE(d.ok()) << d.status();  // rotary buffers are recomputed
}

TEST_F(DrafterFixture, TargetHeadAndFitChecks) {
  auto d = Load(TinyConfig());
  ASSERT_NE(d, nullptr);
  absl::Status s = d->SetTargetHead(at::randn({kVocab, kHidden + 1}), at::randn({kVocab, kHidden}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("embed_tokens must be [vocab, 16]"));
  s = d->SetTargetHead(at::randn({8, kHidden}), at::randn({8, kHidden}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("mask_token_id 39 is outside"));
  ModelConfig target;
  target.hidden_size = kHidden;
  target.num_layers = 4;
  target.vocab_size = kVocab;
  EXPECT_TRUE(CheckDrafterFitsTarget(d->config(), target).ok());
  target.num_layers = 6;
  EXPECT_THAT(std::string(CheckDrafterFitsTarget(d->config(), target).message()),
              HasSubstr("num_target_layers 4 != target num_hidden_layers 6"));
  target.num_layers = 4;
  target.hidden_size = 32;
  EXPECT_THAT(std::string(CheckDrafterFitsTarget(d->config(), target).message()),
              HasSubstr("hidden_size 16 != target hidden_size 32"));
}

TEST_F(DrafterFixture, ChunkedContextEqualsOneShot) {
  auto d = Load(TinyConfig());
  ASSERT_NE(d, nullptr);
  at::Tensor f = Features(20);
  auto one = d->NewCache(64);
  d->AppendContext(*one, f.narrow(0, 0, 12));
  at::Tensor want = d->DraftHidden(*one, 5, 12);
  // The loop's way: context arrives in pieces, each followed by a draft whose block K/V must not
  // survive; a capacity of 1 also exercises growth.
  auto loop = d->NewCache(1);
  d->AppendContext(*loop, f.narrow(0, 0, 5));
  d->DraftHidden(*loop, 3, 5);
  d->AppendContext(*loop, f.narrow(0, 5, 4));
  d->DraftHidden(*loop, 7, 9, 3);
  d->AppendContext(*loop, f.narrow(0, 9, 3));
  at::Tensor got = d->DraftHidden(*loop, 5, 12);
  EXPECT_EQ(loop->length(), 12);
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << (got - want).abs().max().item<double>();
  at::Tensor logits = d->DraftBlock(*loop, 5, 12);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{7, kVocab}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
}

TEST_F(DrafterFixture, BatchedCallsEqualSingleOnes) {
  auto d = Load(TinyConfig());
  ASSERT_NE(d, nullptr);
  const std::vector<int64_t> rows = {3, 11, 6}, anchors = {1, 30, 39};
  std::vector<std::unique_ptr<DraftCache>> singles, batched;
  std::vector<DraftCache*> ptrs;
  std::vector<at::Tensor> feats;
  for (size_t r = 0; r < rows.size(); ++r) {
    feats.push_back(Features(rows[r], 10 + r));
    singles.push_back(d->NewCache(4));
    d->AppendContext(*singles.back(), feats.back());
    batched.push_back(d->NewCache(4));
    ptrs.push_back(batched.back().get());
  }
  d->AppendContext(ptrs, feats);
  at::Tensor all = d->DraftHidden(ptrs, anchors, rows, 6);  // [3, 6, H]
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{3, 6, kHidden}));
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(batched[r]->length(), rows[r]);
    at::Tensor one = d->DraftHidden(*singles[r], anchors[r], rows[r], 6);
    EXPECT_TRUE(at::allclose(all[r], one, 1e-5, 1e-6)) << r;
  }
}

TEST_F(DrafterFixture, DraftNeedsContextUpToStart) {
  auto d = Load(TinyConfig());
  ASSERT_NE(d, nullptr);
  auto cache = d->NewCache(16);
  d->AppendContext(*cache, Features(4));
  EXPECT_THROW(d->DraftBlock(*cache, 1, 5), c10::Error);
  EXPECT_THROW(d->AppendContext(*cache, at::randn({2, 3})), c10::Error);
}

TEST_F(DrafterFixture, SlidingWindowHidesOldContext) {
  auto d = Load(TinyConfig({"sliding_attention"}));  // window 3, causal
  ASSERT_NE(d, nullptr);
  at::Tensor f = Features(10);
  auto run = [&](const at::Tensor& feats) {
    auto c = d->NewCache(32);
    d->AppendContext(*c, feats);
    return d->DraftHidden(*c, 2, 10);
  };
  at::Tensor base = run(f);
  at::Tensor old = f.clone();
  old[7] += 1.0;  // 10 − 7 = 3: outside every query's window
  EXPECT_TRUE(at::equal(run(old), base));
  at::Tensor recent = f.clone();
  recent[8] += 1.0;  // visible to block slot 0 (10 − 8 = 2 < 3)
  EXPECT_FALSE(at::allclose(run(recent), base));
}

TEST_F(DrafterFixture, CausalityWithinTheBlock) {
  auto causal = Load(TinyConfig({"sliding_attention"}));
  json full_cfg = TinyConfig({"full_attention"});
  auto full = Load(full_cfg);
  ASSERT_NE(causal, nullptr);
  ASSERT_NE(full, nullptr);
  at::Tensor f = Features(6);
  auto hidden = [&](const DFlashDrafter& d, int64_t len) {
    auto c = d.NewCache(32);
    d.AppendContext(*c, f);
    return d.DraftHidden(*c, 2, 6, len);
  };
  // Causal: slots 0..3 cannot see slots 4..7, so a shorter block changes nothing before it.
  EXPECT_TRUE(at::allclose(hidden(*causal, 8).narrow(0, 0, 4), hidden(*causal, 4), 1e-5, 1e-6));
  // Bidirectional: every slot sees the whole block.
  EXPECT_FALSE(at::allclose(hidden(*full, 8).narrow(0, 0, 4), hidden(*full, 4), 1e-5, 1e-6));
  // is_causal: true makes the full layer causal as well.
  full_cfg["is_causal"] = true;
  auto forced = Load(full_cfg);
  EXPECT_TRUE(at::allclose(hidden(*forced, 8).narrow(0, 0, 4), hidden(*forced, 4), 1e-5, 1e-6));
}

TEST_F(DrafterFixture, EarlyExitAcceptanceMatchesTheFullArgmax) {
  auto d = Load(TinyConfig());
  ASSERT_NE(d, nullptr);
  auto drafter = MakeBlockDrafter(d.get());
  auto session = drafter->NewSession(32);
  session->AppendContext(Features(9), std::vector<int64_t>(9, -1));
  at::Tensor drafts = session->DraftLogits(4, 9, 8).argmax(-1);
  ASSERT_EQ(drafts.numel(), 7);
  for (int64_t mismatch = 0; mismatch <= 7; ++mismatch) {
    std::vector<int64_t> truth(drafts.data_ptr<int64_t>(), drafts.data_ptr<int64_t>() + 7);
    if (mismatch < 7) truth[mismatch] = (truth[mismatch] + 1) % kVocab;
    EXPECT_EQ(session->AcceptedDrafts(4, 9, 8, truth), mismatch);
    // The base class's way (all logits, then argmax) agrees.
    EXPECT_EQ(session->DraftSession::AcceptedDrafts(4, 9, 8, truth), mismatch);
  }
}

// A trajectory built from the drafter's own drafts: at each step the first m drafts are kept
// and the next token differs from draft m + 1, so the replay must accept exactly m.
struct Planted {
  std::vector<int64_t> trajectory;
  std::vector<int32_t> lengths;  // m + 1 per step
};

Planted Plant(const DFlashDrafter& d, const at::Tensor& features, int64_t prompt_len,
              int64_t max_len, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t B = d.config().block_size;
  Planted p;
  for (int64_t i = 0; i <= prompt_len; ++i) p.trajectory.push_back(rng() % (kVocab - 1));
  auto cache = d.NewCache(max_len + B);
  int64_t start = prompt_len;
  while (start + B + 1 < max_len) {
    d.AppendContext(*cache, features.narrow(0, cache->length(), start - cache->length()));
    at::Tensor drafts = d.DraftBlock(*cache, p.trajectory[start], start).argmax(-1);
    const int64_t* dr = drafts.data_ptr<int64_t>();
    const int64_t m = rng() % B;  // 0 .. B − 1 accepted
    for (int64_t k = 0; k < m; ++k) p.trajectory.push_back(dr[k]);
    p.trajectory.push_back(m < B - 1 ? (dr[m] + 1) % kVocab : rng() % kVocab);
    p.lengths.push_back(static_cast<int32_t>(m + 1));
    start += m + 1;
  }
  return p;
}

TEST_F(DrafterFixture, ReplayRecoversPlantedAcceptance) {
  auto d = Load(TinyConfig());
  ASSERT_NE(d, nullptr);
  at::Tensor features = Features(80);
  std::vector<Planted> planted;
  std::vector<at::Tensor> feats;
  for (uint32_t seed = 0; seed < 3; ++seed) {
    planted.push_back(Plant(*d, features, 4 + seed, 60, seed));
    feats.push_back(features.narrow(0, 0, planted.back().trajectory.size()));
  }
  std::vector<ReplayInput> inputs;
  for (int i = 0; i < 3; ++i) {
    inputs.push_back({&planted[i].trajectory, &feats[i], 4 + i, 80});
  }
  for (bool full_logits : {false, true}) {
    ReplayOptions options{{}, 0, 16, full_logits};
    auto results = AcceptanceReplay(MakeBlockDrafter(d.get()).get()).RunBatch(inputs, options);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(results[i].step_lengths, planted[i].lengths) << i << " full " << full_logits;
    }
  }
}

TEST_F(DrafterFixture, LogitsUseTheTargetHead) {
  json cfg = TinyConfig();
  cfg["dflash_config"]["output_multiplier"] = 0.5;
  cfg["dflash_config"]["final_logit_softcapping"] = 2.0;
  auto d = Load(cfg);
  ASSERT_NE(d, nullptr);
  at::Tensor h = at::randn({3, kHidden});
  at::Tensor want = at::tanh(at::linear(h, head_) * 0.5 / 2.0) * 2.0;
  EXPECT_TRUE(at::allclose(d->Logits(h), want, 1e-5, 1e-6));
}

}  // namespace
}  // namespace specwire
