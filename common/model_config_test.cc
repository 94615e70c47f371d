#include "common/model_config.h"

#include <cmath>

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace specwire {
namespace {

void ExpectError(const absl::StatusOr<ModelConfig>& r,
                 std::initializer_list<absl::string_view> parts) {
  ASSERT_FALSE(r.ok()) << "parsed, expected an error";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  for (absl::string_view part : parts) {
    EXPECT_TRUE(absl::StrContains(r.status().message(), part))
        << "\"" << part << "\" not in: " << r.status();
  }
}

void ExpectError(const absl::Status& s, std::initializer_list<absl::string_view> parts) {
  ExpectError(absl::StatusOr<ModelConfig>(s), parts);
}

ModelConfig MustParse(absl::string_view text) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
  EXPECT_TRUE(c.ok()) << c.status() << "\n" << text;
  return c.ok() ? *c : ModelConfig();
}

// --- Real-world-shaped snippets (trimmed to the keys the parser reads) ----------------------

// Llama-2-7b style: default rope, head_dim implied by hidden / heads.
constexpr char kLlamaDefault[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
  "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "rope_scaling": null, "tie_word_embeddings": false,
  "attention_bias": false, "mlp_bias": false, "bos_token_id": 1, "eos_token_id": 2,
  "torch_dtype": "float16"
})";

// Llama-3.1-8B style: v4 `rope_scaling` with llama3 rescaling and a list of eos ids.
constexpr char kLlama3Rope[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
  "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16"
})";

// Older checkpoints spell the rope type `type` (linear scaling) and have biases.
constexpr char kLlamaBiases[] = R"({
  "model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "attention_bias": true, "mlp_bias": true, "max_position_embeddings": 2048,
  "rope_scaling": {"type": "linear", "factor": 2.0}
})";

constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
  "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
  "hidden_act": "silu", "max_position_embeddings": 32768, "max_window_layers": 21,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
  "use_sliding_window": false, "tie_word_embeddings": true, "eos_token_id": 151643,
  "torch_dtype": "bfloat16"
})";

constexpr char kQwen2Sliding[] = R"({
  "model_type": "qwen2", "vocab_size": 500, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
  "use_sliding_window": true, "max_window_layers": 2, "sliding_window": 16
})";

// Qwen3-0.6B: head_dim 128 although hidden / heads = 64; v4 top-level rope_theta.
constexpr char kQwen3TopLevelTheta[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
  "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936
})";

// The same model as transformers v5 writes it: rope_theta inside rope_parameters, `dtype`.
constexpr char kQwen3RopeParameters[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
  "attention_bias": false, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000},
  "tie_word_embeddings": true, "dtype": "bfloat16", "vocab_size": 151936
})";

// Qwen3.5 text model: no layer_types, the schedule comes from full_attention_interval.
constexpr char kQwen3_5Text[] = R"({
  "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
  "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
  "head_dim": 256, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
  "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
  "linear_num_value_heads": 16, "rms_norm_eps": 1e-06, "max_position_embeddings": 262144,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                      "mrope_section": [11, 11, 10], "mrope_interleaved": true},
  "tie_word_embeddings": true, "eos_token_id": 248044
})";

// Qwen3.5 as a vision-language package: the text model sits in text_config, whose model_type is
// the VLM's; eos lives at the top level.
constexpr char kQwen3_5Vlm[] = R"({
  "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
  "eos_token_id": 248046, "image_token_id": 248056,
  "text_config": {
    "model_type": "qwen3_5", "vocab_size": 248320, "hidden_size": 2048,
    "intermediate_size": 6144, "num_hidden_layers": 12, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 256, "layer_types": [
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_num_value_heads": 32, "rope_parameters": {"rope_type": "default",
      "rope_theta": 10000000, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]},
    "dtype": "bfloat16"
  },
  "vision_config": {"depth": 24, "hidden_size": 1024}
})";

// A Qwen3 long-context config with YaRN rope (v4 spelling, transformers' defaults for the rest).
constexpr char kQwen3Yarn[] = R"({
  "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
  "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "max_position_embeddings": 131072, "rope_theta": 1000000,
  "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
})";

struct Variant {
  const char* name;
  const char* json;
};
constexpr Variant kVariants[] = {
    {"llama_default_rope", kLlamaDefault},
    {"llama_llama3_rope", kLlama3Rope},
    {"llama_biases", kLlamaBiases},
    {"qwen2", kQwen2},
    {"qwen2_sliding", kQwen2Sliding},
    {"qwen3_top_level_theta", kQwen3TopLevelTheta},
    {"qwen3_rope_parameters", kQwen3RopeParameters},
    {"qwen3_5_text", kQwen3_5Text},
    {"qwen3_5_vlm", kQwen3_5Vlm},
    {"qwen3_yarn", kQwen3Yarn},
};

TEST(ModelConfigTest, RoundTripEveryVariant) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    ModelConfig c = MustParse(v.json);
    const std::string written = ModelConfigToJson(c);
    absl::StatusOr<ModelConfig> back = ParseModelConfig(written, "written");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << written;
    EXPECT_EQ(*back, c) << written;
    // Writing is a fixed point too.
    EXPECT_EQ(ModelConfigToJson(*back), written);
  }
}

// Found by fuzz/model_config_fuzz.cc: parameters a rope type does not use were kept, so the
// written config (which has only the used ones) parsed back to a different one; and an
// original_max_position_embeddings beyond int64 was converted regardless.
TEST(ModelConfigTest, RopeKeepsOnlyTheParametersItsTypeUses) {
  std::string text = kLlamaDefault;
  text.replace(text.find(R"("rope_scaling": null)"), 20,
               R"("rope_scaling": {"factor": 8.0, "high_freq_factor": 2.0})");
  ModelConfig c = MustParse(text);
  RopeConfig plain;
  plain.original_max_position_embeddings = 4096;
  EXPECT_EQ(c.rope, plain);
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c);

  std::string huge = kLlama3Rope;
  huge.replace(huge.find(R"("original_max_position_embeddings": 8192)"), 41,
               R"("original_max_position_embeddings": 1e300)");
  EXPECT_EQ(ParseModelConfig(huge).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, YarnLikeTransformers) {
  ModelConfig c = MustParse(kQwen3Yarn);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 0.1 * std::log(4.0) + 1.0);  // get_mscale(4)
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  EXPECT_TRUE(c.rope.truncate);
  // Without a factor, YaRN scales by the context ratio.
  std::string no_factor = kQwen3Yarn;
  no_factor.replace(no_factor.find(R"("factor": 4.0, )"), 15, "");
  EXPECT_DOUBLE_EQ(MustParse(no_factor).rope.factor, 131072.0 / 32768.0);
}

// transformers' standardize_rope_params gives a top-level original_max_position_embeddings
// priority over the one in the rope dict, for the types that use it (an outside check found the
// top-level key ignored: silently different hidden states).
TEST(ModelConfigTest, TopLevelOriginalMaxPositionEmbeddingsWins) {
  for (const char* base : {kLlama3Rope, kQwen3Yarn}) {
    std::string text = base;
    text.replace(text.rfind('}'), 1, R"(, "original_max_position_embeddings": 1024})");
    SCOPED_TRACE(text);
    EXPECT_EQ(MustParse(text).rope.original_max_position_embeddings, 1024);
  }
  // A default rope does not use it.
  std::string plain = kLlamaDefault;
  plain.replace(plain.rfind('}'), 1, R"(, "original_max_position_embeddings": 1024})");
  EXPECT_EQ(MustParse(plain).rope.original_max_position_embeddings,
            MustParse(kLlamaDefault).max_position_embeddings);
  // Not an integer: refused, naming the key.
  std::string half = kLlama3Rope;
  half.replace(half.rfind('}'), 1, R"(, "original_max_position_embeddings": 1024.5})");
  ExpectError(ParseModelConfig(half), {"original_max_position_embeddings", "1024.5"});
}

// Llama, Qwen2 and Qwen3 rotate the whole head: their default rope never reads
// partial_rotary_factor (an outside check found it applied: silently different hidden states),
// and their attention cannot apply a partial rotation, so a scaled rope with a factor < 1 is
// refused. Qwen3.5 rotates a quarter of the head by default.
TEST(ModelConfigTest, PartialRotaryFactorOnlyWhereTheFamilyHasIt) {
  for (const char* base : {kLlamaDefault, kQwen2, kQwen3TopLevelTheta}) {
    std::string text = base;
    text.replace(text.rfind('}'), 1, R"(, "partial_rotary_factor": 0.5})");
    SCOPED_TRACE(text);
    ModelConfig c = MustParse(text);
    EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 1.0);
    EXPECT_EQ(c.rotary_dim(), c.head_dim);
  }
  std::string scaled = kLlama3Rope;
  scaled.replace(scaled.rfind('}'), 1, R"(, "partial_rotary_factor": 0.5})");
  ExpectError(ParseModelConfig(scaled), {"partial_rotary_factor", "0.5", "llama3"});
  EXPECT_DOUBLE_EQ(MustParse(kQwen3_5Text).rope.partial_rotary_factor, 0.25);
}

TEST(ModelConfigTest, NonPositiveMaxPositionEmbeddingsNamed) {
  for (const char* bad : {"0", "-4096"}) {
    std::string text = kLlamaDefault;
    const std::string key = R"("max_position_embeddings": )";
    const size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos);
    const size_t end = text.find_first_of(",\n}", at + key.size());
    text.replace(at + key.size(), end - at - key.size(), bad);
    absl::Status s = ParseModelConfig(text).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), "max_position_embeddings")) << s;
  }
}

TEST(ModelConfigTest, RoundTripHandBuiltConfig) {
  // Not every struct a caller builds came from a parse: a hand-built config with a mixed
  // full / sliding layer schedule must survive too.
  ModelConfig c;
  c.family = ModelFamily::kQwen3;
  c.model_type = "qwen3";
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 3;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  c.max_position_embeddings = 64;
  c.rope.theta = 1e6;
  c.rope.original_max_position_embeddings = 64;
  c.layer_types = {LayerType::kFullAttention, LayerType::kSlidingAttention,
                   LayerType::kSlidingAttention};
  c.sliding_window = 4;
  c.eos_token_ids = {3, 5};
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c);
}

TEST(ModelConfigTest, LlamaDefaults) {
  ModelConfig c = MustParse(kLlamaDefault);
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_FALSE(c.vlm_packaged);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.head_dim, 4096 / 32);  // default: hidden / heads
  EXPECT_EQ(c.rotary_dim(), 128);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.layer_types, std::vector<LayerType>(32, LayerType::kFullAttention));
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({2}));
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(ModelConfigTest, Llama3RopeScaling) {
  ModelConfig c = MustParse(kLlama3Rope);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({128001, 128008, 128009}));
}

TEST(ModelConfigTest, LegacyRopeTypeKeyAndLlamaBiases) {
  ModelConfig c = MustParse(kLlamaBiases);
  EXPECT_EQ(c.rope.type, "linear");  // from "type"
  EXPECT_DOUBLE_EQ(c.rope.factor, 2.0);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);  // Llama's attention_bias covers o_proj too
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ModelConfigTest, Qwen2AlwaysHasQkvBiases) {
  ModelConfig c = MustParse(kQwen2);
  EXPECT_EQ(c.family, ModelFamily::kQwen2);
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 896 / 14);
  EXPECT_TRUE(c.tie_word_embeddings);
  // use_sliding_window false: every layer is full attention, the window is not used.
  EXPECT_EQ(c.layer_types, std::vector<LayerType>(24, LayerType::kFullAttention));
  EXPECT_EQ(c.sliding_window, 0);
}

TEST(ModelConfigTest, Qwen2SlidingWindowFromMaxWindowLayers) {
  ModelConfig c = MustParse(kQwen2Sliding);
  EXPECT_EQ(c.layer_types,
            std::vector<LayerType>({LayerType::kFullAttention, LayerType::kFullAttention,
                                    LayerType::kSlidingAttention, LayerType::kSlidingAttention}));
  EXPECT_EQ(c.sliding_window, 16);
}

TEST(ModelConfigTest, Qwen3_0_6B) {
  ModelConfig c = MustParse(kQwen3TopLevelTheta);
  EXPECT_EQ(c.family, ModelFamily::kQwen3);
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.head_dim, 128);  // != 1024 / 16
  EXPECT_EQ(c.rotary_dim(), 128);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({151645}));
  EXPECT_EQ(c.layer_types, std::vector<LayerType>(28, LayerType::kFullAttention));
}

TEST(ModelConfigTest, RopeThetaTopLevelOrInRopeParametersIsTheSame) {
  ModelConfig top = MustParse(kQwen3TopLevelTheta);
  ModelConfig nested = MustParse(kQwen3RopeParameters);
  EXPECT_EQ(top.rope, nested.rope);
  EXPECT_DOUBLE_EQ(nested.rope.theta, 1e6);
  EXPECT_EQ(nested.torch_dtype, "bfloat16");  // v5 spells it "dtype"
  // The dict wins over a stale top-level value, as in transformers.
  ModelConfig both = MustParse(R"({"model_type": "qwen3", "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
      "rope_theta": 10000, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})");
  EXPECT_DOUBLE_EQ(both.rope.theta, 5e5);
}

TEST(ModelConfigTest, HeadDimDefaults) {
  const char* kSizes = R"("vocab_size": 8, "hidden_size": 64, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 4)";
  EXPECT_EQ(MustParse(absl::StrCat(R"({"model_type": "llama", )", kSizes, "}")).head_dim, 16);
  EXPECT_EQ(MustParse(absl::StrCat(R"({"model_type": "qwen2", )", kSizes, "}")).head_dim, 16);
  EXPECT_EQ(MustParse(absl::StrCat(R"({"model_type": "qwen3", )", kSizes, "}")).head_dim, 128);
  ModelConfig c =
      MustParse(absl::StrCat(R"({"model_type": "llama", "head_dim": 32, )", kSizes, "}"));
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_kv_heads, 4);  // default: num_attention_heads
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ModelConfigTest, Qwen3_5LayerScheduleAndPartialRotary) {
  ModelConfig c = MustParse(kQwen3_5Text);
  EXPECT_EQ(c.family, ModelFamily::kQwen3_5);
  EXPECT_EQ(c.architecture, "Qwen3_5ForCausalLM");
  EXPECT_FALSE(c.vlm_packaged);
  ASSERT_EQ(c.layer_types.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(c.layer_types[i],
              i == 3 || i == 7 ? LayerType::kFullAttention : LayerType::kLinearAttention)
        << "layer " << i;
  }
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.25);  // default for qwen3_5
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e7);
  EXPECT_EQ(c.rope.mrope_section, std::vector<int64_t>({11, 11, 10}));
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.linear_num_value_heads, 16);
  EXPECT_EQ(c.linear_num_key_heads, 16);

  // full_attention_interval 2 → layers 1, 3, ... full.
  ModelConfig two = MustParse(R"({"model_type": "qwen3_5_text", "vocab_size": 8,
      "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 4,
      "num_attention_heads": 2, "full_attention_interval": 2})");
  EXPECT_EQ(two.layer_types,
            std::vector<LayerType>({LayerType::kLinearAttention, LayerType::kFullAttention,
                                    LayerType::kLinearAttention, LayerType::kFullAttention}));
  EXPECT_EQ(two.head_dim, 256);  // qwen3_5 default
}

TEST(ModelConfigTest, Qwen3_5VlmPackage) {
  ModelConfig c = MustParse(kQwen3_5Vlm);
  EXPECT_TRUE(c.vlm_packaged);
  EXPECT_EQ(c.vlm_architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.model_type, "qwen3_5_text");
  EXPECT_EQ(c.architecture, "Qwen3_5ForCausalLM");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 12);
  EXPECT_EQ(c.layer_types[3], LayerType::kFullAttention);
  EXPECT_EQ(c.layer_types[4], LayerType::kLinearAttention);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({248046}));  // from the top level
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfigTest, EosTokenIdIntOrList) {
  const char* kBase = R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, )";
  EXPECT_EQ(MustParse(absl::StrCat(kBase, R"("eos_token_id": 7})")).eos_token_ids,
            std::vector<int64_t>({7}));
  EXPECT_EQ(MustParse(absl::StrCat(kBase, R"("eos_token_id": [7, 1]})")).eos_token_ids,
            std::vector<int64_t>({7, 1}));
  EXPECT_TRUE(MustParse(absl::StrCat(kBase, R"("eos_token_id": null})")).eos_token_ids.empty());
  ExpectError(ParseModelConfig(absl::StrCat(kBase, R"("eos_token_id": "7"})")), {"eos_token_id"});
  ExpectError(ParseModelConfig(absl::StrCat(kBase, R"("eos_token_id": [7, "x"]})")),
              {"eos_token_id"});
}

TEST(ModelConfigTest, AttentionBiasAndTieWordEmbeddings) {
  ModelConfig c = MustParse(R"({"model_type": "qwen3", "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
      "attention_bias": true, "tie_word_embeddings": true, "rms_norm_eps": 1e-5})");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
}

// --- Errors --------------------------------------------------------------------------------

// A valid qwen3 config with `extra` spliced in (later keys win in nlohmann's parser).
std::string Qwen3With(absl::string_view extra) {
  return absl::StrCat(R"({"model_type": "qwen3", "vocab_size": 32, "hidden_size": 64,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16)",
                      extra.empty() ? "" : ", ", extra, "}");
}

TEST(ModelConfigTest, BaseOfErrorCasesParses) { MustParse(Qwen3With("")); }

TEST(ModelConfigTest, ErrorBadJson) {
  ExpectError(ParseModelConfig(R"({"model_type": "qwen3",)", "/ckpt/config.json"),
              {"/ckpt/config.json", "JSON"});
  ExpectError(ParseModelConfig(""), {"JSON"});
}

TEST(ModelConfigTest, ErrorTopLevelArray) { ExpectError(ParseModelConfig("[1, 2]"), {"object"}); }

TEST(ModelConfigTest, ErrorUnknownModelType) {
  ExpectError(ParseModelConfig(R"({"model_type": "mistral", "vocab_size": 32})"),
              {"model_type", "mistral"});
  ExpectError(ParseModelConfig(R"({"vocab_size": 32})"), {"model_type"});
  // "qwen3_5" is only a text model_type inside a VLM package's text_config.
  ExpectError(ParseModelConfig(R"({"model_type": "qwen3_5", "vocab_size": 32})"), {"qwen3_5"});
}

TEST(ModelConfigTest, ErrorMissingRequiredKey) {
  ExpectError(ParseModelConfig(R"({"model_type": "qwen3", "vocab_size": 32,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4})"),
              {"hidden_size", "missing"});
}

TEST(ModelConfigTest, ErrorWrongType) {
  ExpectError(ParseModelConfig(Qwen3With(R"("hidden_size": "64")")),
              {"hidden_size", "\"64\"", "integer"});
  ExpectError(ParseModelConfig(Qwen3With(R"("hidden_size": 0)")), {"hidden_size", "positive"});
  ExpectError(ParseModelConfig(Qwen3With(R"("rms_norm_eps": "1e-6")")), {"rms_norm_eps"});
  ExpectError(ParseModelConfig(Qwen3With(R"("tie_word_embeddings": 1)")), {"tie_word_embeddings"});
  ExpectError(ParseModelConfig(Qwen3With(R"("rope_parameters": [1])")), {"rope_parameters"});
}

TEST(ModelConfigTest, ErrorKvHeadsDoNotDivideHeads) {
  ExpectError(ParseModelConfig(Qwen3With(R"("num_key_value_heads": 3)")),
              {"num_key_value_heads", "3", "4"});
}

TEST(ModelConfigTest, ErrorUnsupportedRopeType) {
  ExpectError(
      ParseModelConfig(Qwen3With(R"("rope_scaling": {"rope_type": "longrope", "factor": 4.0})")),
      {"rope_scaling", "longrope"});
  ExpectError(ParseModelConfig(Qwen3With(R"("rope_parameters": {"type": "dynamic"})")),
              {"rope_parameters", "dynamic"});
}

TEST(ModelConfigTest, ErrorUnsupportedActivation) {
  ExpectError(ParseModelConfig(Qwen3With(R"("hidden_act": "gelu")")), {"hidden_act", "gelu"});
}

TEST(ModelConfigTest, ErrorLayerTypes) {
  ExpectError(ParseModelConfig(Qwen3With(R"("layer_types": ["full_attention"])")),
              {"layer_types", "2"});
  ExpectError(
      ParseModelConfig(Qwen3With(R"("layer_types": ["full_attention", "linear_attention"])")),
      {"layer_types", "[1]", "linear_attention", "qwen3"});
  ExpectError(
      ParseModelConfig(Qwen3With(R"("layer_types": ["full_attention", "chunked_attention"])")),
      {"layer_types", "chunked_attention"});
}

TEST(ModelConfigTest, ErrorInsideTextConfigNamesThePath) {
  ExpectError(ParseModelConfig(R"({"model_type": "qwen3_5", "text_config": {
      "model_type": "qwen3_5", "vocab_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 1}})"),
              {"text_config.hidden_size"});
  ExpectError(ParseModelConfig(R"({"model_type": "qwen3_5", "text_config": 3})"), {"text_config"});
}

}  // namespace
}  // namespace specwire

namespace specwire {
namespace {

// Keys whose meaning a key-by-key reading of transformers' config and modeling code found
// different from what specwire did (docs/CONFIG_KEYS.md); each is now transformers' meaning or a
// refusal naming the key.
TEST(ModelConfigTest, TransformersSemanticsOfEdgeKeys) {
  // A non-empty rope_scaling wins over rope_parameters (`rope_scaling or rope_parameters`).
  ModelConfig both = MustParse(Qwen3With(
      R"("rope_parameters": {"rope_type": "default", "rope_theta": 5.0},
         "rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 7.0})"));
  EXPECT_EQ(both.rope.type, "linear");
  EXPECT_DOUBLE_EQ(both.rope.theta, 7.0);
  EXPECT_DOUBLE_EQ(MustParse(Qwen3With(R"("rope_parameters": {"rope_theta": 5.0},
                                          "rope_scaling": {})"))
                       .rope.theta,
                   5.0);
  // A rope per layer type is refused, naming the key.
  ExpectError(ParseModelConfig(Qwen3With(
                  R"("rope_parameters": {"full_attention": {"rope_type": "default"}})")),
              {"rope_parameters", "full_attention"});
  // Rope parameters transformers reads as required.
  ExpectError(ParseModelConfig(Qwen3With(R"("rope_scaling": {"rope_type": "linear"})")),
              {"rope_scaling.factor", "linear"});
  ExpectError(ParseModelConfig(Qwen3With(R"("rope_scaling": {"rope_type": "llama3",
                                             "factor": 8.0, "high_freq_factor": 4.0})")),
              {"rope_scaling.low_freq_factor"});
  // yarn with a null truncate does not round the correction range.
  EXPECT_FALSE(MustParse(Qwen3With(R"("rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                       "truncate": null})"))
                   .rope.truncate);
  // Qwen3.5 with a null top-level partial_rotary_factor turns the whole head.
  std::string null_partial = kQwen3_5Text;
  null_partial.replace(null_partial.rfind('}'), 1, R"(, "partial_rotary_factor": null})");
  EXPECT_DOUBLE_EQ(MustParse(null_partial).rope.partial_rotary_factor, 1.0);
  EXPECT_DOUBLE_EQ(MustParse(kQwen3_5Text).rope.partial_rotary_factor, 0.25);
  // "swish" is SiLU.
  MustParse(Qwen3With(R"("hidden_act": "swish")"));
  // Llama never reads layer_types: sliding entries run full attention.
  ModelConfig llama = MustParse(R"({"model_type": "llama", "vocab_size": 32, "hidden_size": 64,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
      "layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": true,
      "sliding_window": 4})");
  EXPECT_EQ(llama.layer_types[0], LayerType::kFullAttention);
  ExpectError(ParseModelConfig(R"({"model_type": "llama", "vocab_size": 32, "hidden_size": 66,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
      "head_dim": 16})"),
              {"hidden_size", "66", "num_attention_heads"});
  // Qwen2 / Qwen3: use_sliding_window without a sliding_window key means transformers' 4096.
  ModelConfig window = MustParse(Qwen3With(R"("use_sliding_window": true,
      "layer_types": ["full_attention", "sliding_attention"])"));
  EXPECT_EQ(window.sliding_window, 4096);
  // A null window: Qwen2Config derives no sliding layers at all.
  ModelConfig null_window = MustParse(Qwen3With(R"("use_sliding_window": true,
      "sliding_window": null, "max_window_layers": 0)"));
  EXPECT_EQ(null_window.layer_types[1], LayerType::kFullAttention);
  EXPECT_TRUE(CheckTargetConfig(null_window).ok());
  // Target-only keys: parsed, and refused for a target.
  ModelConfig bidirectional = MustParse(Qwen3With(R"("is_causal": false)"));
  ExpectError(CheckTargetConfig(bidirectional), {"is_causal", "false"});
  ModelConfig raw_last = MustParse(Qwen3With(R"("tie_last_hidden_states": false)"));
  ExpectError(CheckTargetConfig(raw_last), {"tie_last_hidden_states"});
  ModelConfig no_window = MustParse(Qwen3With(R"("use_sliding_window": false,
      "layer_types": ["full_attention", "sliding_attention"])"));
  ExpectError(CheckTargetConfig(no_window), {"layer_types", "[1]", "sliding_attention"});
  EXPECT_TRUE(CheckTargetConfig(MustParse(Qwen3With(""))).ok());
  // A vision-language root other than qwen3_5.
  ExpectError(ParseModelConfig(R"({"model_type": "llava", "text_config": {"model_type": "llama",
      "vocab_size": 32, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4}})"),
              {"model_type", "llava", "qwen3_5"});
}

}  // namespace
}  // namespace specwire
