#include "common/models/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/model_config.h"
#include "common/models/attention.h"
#include "common/models/linear.h"
#include "common/models/torch_util.h"
#include "common/safetensors.h"
#include "common/status_testing.h"
#include "gtest/gtest.h"

namespace specwire {
namespace {

// A 2-layer Qwen3 small enough to build in microseconds: GQA (2 query heads, 1 KV head) and a
// head_dim that is not hidden / heads, as in the real Qwen3 models.
ModelConfig TinyQwen3Config(bool tied = true) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(absl::StrCat(
      R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 32,
          "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 12,
          "max_position_embeddings": 64, "rope_theta": 10000, "tie_word_embeddings": )",
      tied ? "true" : "false", "}"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// The checkpoint tensors a Llama-family model needs, written out by hand (independently of
// DecoderModel::ForEachWeight, which this test checks).
std::vector<std::pair<std::string, std::vector<int64_t>>> ExpectedWeights(const ModelConfig& c) {
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Q = c.num_heads * D, KV = c.num_kv_heads * D;
  std::vector<std::pair<std::string, std::vector<int64_t>>> w = {
      {"model.embed_tokens.weight", {V, H}}, {"model.norm.weight", {H}}};
  if (!c.tie_word_embeddings) w.push_back({"lm_head.weight", {V, H}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    w.push_back({p + "input_layernorm.weight", {H}});
    w.push_back({p + "self_attn.q_proj.weight", {Q, H}});
    w.push_back({p + "self_attn.k_proj.weight", {KV, H}});
    w.push_back({p + "self_attn.v_proj.weight", {KV, H}});
    w.push_back({p + "self_attn.o_proj.weight", {H, Q}});
    if (c.qk_norm) {
      w.push_back({p + "self_attn.q_norm.weight", {D}});
      w.push_back({p + "self_attn.k_norm.weight", {D}});
    }
    w.push_back({p + "post_attention_layernorm.weight", {H}});
    w.push_back({p + "mlp.gate_proj.weight", {I, H}});
    w.push_back({p + "mlp.up_proj.weight", {I, H}});
    w.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  return w;
}

using TensorMap = std::map<std::string, at::Tensor>;

// Random fp32 weights with a fixed seed: norms near 1, matrices scaled by 1 / sqrt(fan_in).
TensorMap RandomWeights(const ModelConfig& c, uint64_t seed = 1234) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  TensorMap w;
  for (const auto& [name, shape] : ExpectedWeights(c)) {
    at::Tensor t = at::randn(shape, gen, at::kFloat);
    if (shape.size() == 1) {
      t = 1.0 + 0.1 * t;
    } else if (!absl::StrContains(name, "embed_tokens")) {
      t = t / std::sqrt(static_cast<double>(shape[1]));
    }
    w[name] = t.contiguous();
  }
  return w;
}

// Renames canonical "model.*" tensors to a VLM package's "model.language_model.*".
TensorMap AsVlmLayout(const TensorMap& text) {
  TensorMap out;
  for (const auto& [name, t] : text) {
    out[absl::StartsWith(name, "model.")
            ? absl::StrCat("model.language_model.", name.substr(strlen("model.")))
            : name] = t;
  }
  return out;
}

absl::Status WriteCheckpoint(const std::string& dir, const std::string& config_json,
                             const TensorMap& tensors, DType dtype = DType::kF32) {
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/config.json", std::ios::trunc);
    out << config_json;
    if (!out.good()) return absl::InternalError("cannot write config.json");
  }
  std::vector<at::Tensor> keep;  // owns the bytes the spans point at
  std::vector<TensorToWrite> to_write;
  for (const auto& [name, t] : tensors) {
    keep.push_back(t.to(ToScalarType(dtype)).contiguous());
    const at::Tensor& k = keep.back();
    to_write.push_back(
        {name, dtype, k.sizes().vec(), {static_cast<const std::byte*>(k.data_ptr()), k.nbytes()}});
  }
  return WriteSafetensors(dir + "/model.safetensors", to_write);
}

// States of a fixed prompt: every layer, the final-norm tap and all logits.
struct Outputs {
  CapturedStates states;
  at::Tensor logits;
};
Outputs RunPrompt(LoadedModel& m) {
  c10::InferenceMode inference;
  at::Tensor ids = at::tensor({3, 1, 4, 1, 5, 9, 2, 6}, at::kLong).view({1, 8});
  CaptureSpec spec;
  spec.layers = {0, 1};
  spec.embedding = true;
  spec.final_norm = true;
  Outputs out;
  out.logits = m.model->Forward(ids, nullptr, spec, &out.states, LogitsMode::kAll);
  return out;
}

void ExpectSameOutputs(const Outputs& a, const Outputs& b) {
  EXPECT_TRUE(at::equal(a.states.embedding, b.states.embedding));
  ASSERT_EQ(a.states.layers.size(), b.states.layers.size());
  for (const auto& [id, t] : a.states.layers) {
    EXPECT_TRUE(at::equal(t, b.states.layers.at(id))) << "layer " << id;
  }
  EXPECT_TRUE(at::equal(a.states.final_norm, b.states.final_norm));
  EXPECT_TRUE(at::equal(a.logits, b.logits));
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/loader_test.XXXXXX";
    ASSERT_NE(::mkdtemp(root_.data()), nullptr) << root_;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Writes a checkpoint under a fresh subdirectory and returns its path.
  std::string Write(const std::string& name, const ModelConfig& config, const TensorMap& tensors,
                    DType dtype = DType::kF32) {
    return WriteRaw(name, ModelConfigToJson(config), tensors, dtype);
  }
  std::string WriteRaw(const std::string& name, const std::string& config_json,
                       const TensorMap& tensors, DType dtype = DType::kF32) {
    const std::string dir = root_ + "/" + name;
    absl::Status s = WriteCheckpoint(dir, config_json, tensors, dtype);
    EXPECT_TRUE(s.ok()) << s;
    return dir;
  }

  static absl::StatusOr<std::unique_ptr<LoadedModel>> Load(const std::string& dir,
                                                           at::ScalarType dtype = at::kFloat,
                                                           const std::string& device_map = "cpu") {
    LoadOptions options;
    options.dtype = dtype;
    options.device_map = device_map;
    return LoadModel(dir, options);
  }

  std::string root_;
};

TEST_F(LoaderTest, LoadsTiedQwen3AndStatesTheContract) {
  const ModelConfig config = TinyQwen3Config();
  const std::string dir = Write("tied", config, RandomWeights(config));
  auto loaded = Load(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ExtractionContract& c = (*loaded)->contract;
  EXPECT_EQ((*loaded)->config, config);
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.source_architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.source_layout, "text");
  EXPECT_EQ(c.weight_prefix, "model.");
  EXPECT_EQ(c.tensors_loaded, 2 + 2 * 11);  // embedding, final norm; 11 per layer
  EXPECT_EQ(c.tensors_loaded, static_cast<int64_t>(ExpectedWeights(config).size()));
  EXPECT_EQ(c.tensors_skipped, 0);
  EXPECT_TRUE(c.skipped.empty());
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 16);
  EXPECT_EQ(c.vocab_size, 32);
  EXPECT_EQ(c.layer_types, std::vector<std::string>({"full_attention", "full_attention"}));
  EXPECT_EQ(c.compute_dtype, "float32");
  EXPECT_EQ(c.devices, std::vector<std::string>({"cpu", "cpu"}));
  // The kernels this machine runs for a dense fp32 target (the fast set, its default), and the
  // libtorch they run on.
  EXPECT_EQ(c.kernel_variant.substr(0, c.kernel_variant.find(" (libtorch ")),
            AttentionKernelName(AttentionKernel::kFlashWhereAvailable, at::kFloat, at::kCPU) +
                LinearKernelSuffix(KernelSet::kFast, at::kFloat, at::kCPU))
      << c.kernel_variant;
  EXPECT_NE(c.kernel_variant.find(" (libtorch "), std::string::npos) << c.kernel_variant;
  EXPECT_TRUE(absl::StartsWith(c.weights_digest, "xxh3-128:")) << c.weights_digest;
  EXPECT_TRUE(c.tokenizer_digest.empty());
  EXPECT_FALSE(c.specwire_version.empty());

  // The model runs and its tied lm_head is the embedding.
  DecoderModel& model = *(*loaded)->model;
  EXPECT_TRUE(model.lm_head().is_same(model.embed_tokens()));
  Outputs out = RunPrompt(**loaded);
  EXPECT_EQ(out.logits.sizes(), at::IntArrayRef({1, 8, 32}));
  EXPECT_TRUE(at::isfinite(out.logits).all().item<bool>());
}

TEST_F(LoaderTest, WeightsDigestFollowsSourceBytesOnly) {
  const ModelConfig config = TinyQwen3Config();
  TensorMap weights = RandomWeights(config);
  const std::string dir = Write("a", config, weights);
  auto f32 = Load(dir);
  auto again = Load(dir);
  auto bf16 = Load(dir, at::kBFloat16);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const std::string digest = (*f32)->contract.weights_digest;
  EXPECT_EQ((*again)->contract.weights_digest, digest);
  EXPECT_EQ((*bf16)->contract.weights_digest, digest);  // compute dtype is not content
  EXPECT_EQ((*bf16)->contract.compute_dtype, "bfloat16");
  EXPECT_EQ((*bf16)->model->embed_tokens().scalar_type(), at::kBFloat16);

  // One byte of one weight changes the digest.
  at::Tensor& w = weights.at("model.layers.1.mlp.down_proj.weight");
  w = w.clone();
  reinterpret_cast<uint8_t*>(w.data_ptr())[5] ^= 0x01;
  auto changed = Load(Write("b", config, weights));
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE((*changed)->contract.weights_digest, digest);

  // A tokenizer is digested separately.
  std::ofstream(dir + "/tokenizer.json") << R"({"model": {}})";
  auto with_tokenizer = Load(dir);
  ASSERT_TRUE(with_tokenizer.ok()) << with_tokenizer.status();
  EXPECT_EQ((*with_tokenizer)->contract.weights_digest, digest);
  EXPECT_TRUE(absl::StartsWith((*with_tokenizer)->contract.tokenizer_digest, "xxh3-128:"));
}

TEST_F(LoaderTest, UntiedCheckpointLoadsLmHead) {
  const ModelConfig config = TinyQwen3Config(/*tied=*/false);
  TensorMap weights = RandomWeights(config);
  auto loaded = Load(Write("untied", config, weights));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->contract.tensors_loaded, 3 + 2 * 11);
  EXPECT_TRUE(at::equal((*loaded)->model->lm_head(), weights.at("lm_head.weight")));
}

TEST_F(LoaderTest, TiedCheckpointWithStoredLmHeadSkipsIt) {
  const ModelConfig config = TinyQwen3Config();
  TensorMap weights = RandomWeights(config);
  weights["lm_head.weight"] = weights.at("model.embed_tokens.weight").clone();
  auto loaded = Load(Write("tied_with_head", config, weights));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ExtractionContract& c = (*loaded)->contract;
  EXPECT_EQ(c.tensors_loaded, 2 + 2 * 11);
  EXPECT_EQ(c.tensors_skipped, 1);
  ASSERT_EQ(c.skipped.size(), 1u);
  EXPECT_EQ(c.skipped[0].prefix, "lm_head.weight");
  EXPECT_EQ(c.skipped[0].count, 1);
  EXPECT_TRUE(absl::StrContains(c.skipped[0].reason, "tie_word_embeddings")) << c.skipped[0].reason;
}

TEST_F(LoaderTest, MissingTensorIsNamed) {
  const ModelConfig config = TinyQwen3Config();
  TensorMap weights = RandomWeights(config);
  weights.erase("model.layers.1.self_attn.k_norm.weight");
  auto loaded = Load(Write("missing", config, weights));
  ASSERT_FALSE(loaded.ok());
  ExpectError(loaded.status(), absl::StatusCode::kInvalidArgument,
              {"model.layers.1.self_attn.k_norm.weight", "missing", "Qwen3ForCausalLM"});
}

TEST_F(LoaderTest, WrongShapeNamesTensorAndBothShapes) {
  const ModelConfig config = TinyQwen3Config();
  TensorMap weights = RandomWeights(config);
  weights["model.layers.0.mlp.up_proj.weight"] = at::zeros({24, 15});
  auto loaded = Load(Write("shape", config, weights));
  ASSERT_FALSE(loaded.ok());
  ExpectError(loaded.status(), absl::StatusCode::kInvalidArgument,
              {"model.layers.0.mlp.up_proj.weight", "[24, 15]", "[24, 16]"});
}

TEST_F(LoaderTest, UnexpectedTensorIsAnError) {
  const ModelConfig config = TinyQwen3Config();
  TensorMap weights = RandomWeights(config);
  // Qwen3 without attention_bias has no q_proj bias.
  weights["model.layers.0.self_attn.q_proj.bias"] = at::zeros({24});
  auto loaded = Load(Write("extra", config, weights));
  ASSERT_FALSE(loaded.ok());
  ExpectError(loaded.status(), absl::StatusCode::kInvalidArgument,
              {"model.layers.0.self_attn.q_proj.bias", "unexpected"});

  // A vision tower in a checkpoint that is not a VLM package is unexpected too.
  weights.erase("model.layers.0.self_attn.q_proj.bias");
  weights["model.visual.blocks.0.w"] = at::zeros({2});
  loaded = Load(Write("extra_visual", config, weights));
  ASSERT_FALSE(loaded.ok());
  ExpectError(loaded.status(), absl::StatusCode::kInvalidArgument, {"model.visual.blocks.0.w"});
}

TEST_F(LoaderTest, MtpAndRotaryBuffersAreSkipped) {
  const ModelConfig config = TinyQwen3Config();
  TensorMap weights = RandomWeights(config);
  weights["mtp.fc.weight"] = at::zeros({16, 32});
  weights["mtp.norm.weight"] = at::ones({16});
  weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = at::ones({6});
  auto loaded = Load(Write("mtp", config, weights));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ExtractionContract& c = (*loaded)->contract;
  EXPECT_EQ(c.source_layout, "text");
  EXPECT_EQ(c.tensors_loaded, 2 + 2 * 11);
  EXPECT_EQ(c.tensors_skipped, 3);
  std::map<std::string, int64_t> counts;
  for (const SkippedTensors& s : c.skipped) {
    counts[s.prefix] = s.count;
    EXPECT_FALSE(s.reason.empty()) << s.prefix;
  }
  EXPECT_EQ(counts, (std::map<std::string, int64_t>{{"mtp.", 2}, {"rotary_emb.inv_freq", 1}}));
  // The MTP head is named and digested (a scorer fetches and caches it by that digest); the
  // config comes with the contract.
  for (const SkippedTensors& s : c.skipped) {
    if (s.prefix == "mtp.") {
      EXPECT_EQ(s.names, (std::vector<std::string>{"mtp.fc.weight", "mtp.norm.weight"}));
      EXPECT_TRUE(s.digest.starts_with("xxh3-128:")) << s.digest;
    } else {
      EXPECT_TRUE(s.names.empty() && s.digest.empty()) << s.prefix;
    }
  }
  EXPECT_NE(c.config_json.find("\"hidden_size\""), std::string::npos);
  weights["mtp.norm.weight"] = at::full({16}, 2.0);  // another head on the same trunk
  auto other = Load(Write("mtp2", config, weights));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->get()->contract.weights_digest, c.weights_digest);
  for (size_t i = 0; i < c.skipped.size(); ++i) {
    if (c.skipped[i].prefix == "mtp.") {
      EXPECT_NE(other->get()->contract.skipped[i].digest, c.skipped[i].digest);
    }
  }
}

TEST_F(LoaderTest, VlmPackagedLayoutRunsTheTextPath) {
  const ModelConfig config = TinyQwen3Config();
  const TensorMap weights = RandomWeights(config);
  auto text = Load(Write("text", config, weights));
  ASSERT_TRUE(text.ok()) << text.status();

  // The same text model packaged as a VLM: config.json with text_config, tensors under
  // model.language_model.*, plus a vision tower and an MTP head that are skipped.
  ModelConfig packaged = config;
  packaged.vlm_packaged = true;
  packaged.vlm_architecture = "Qwen3VLForConditionalGeneration";
  TensorMap vlm_weights = AsVlmLayout(weights);
  vlm_weights["model.visual.blocks.0.w"] = at::ones({4});
  vlm_weights["model.visual.merger.w"] = at::ones({4});
  vlm_weights["mtp.fc.weight"] = at::ones({16, 32});
  auto vlm = Load(Write("vlm", packaged, vlm_weights));
  ASSERT_TRUE(vlm.ok()) << vlm.status();

  const ExtractionContract& c = (*vlm)->contract;
  EXPECT_EQ(c.source_layout, "vlm");
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.source_architecture, "Qwen3VLForConditionalGeneration");
  EXPECT_EQ(c.tensors_loaded, (*text)->contract.tensors_loaded);
  EXPECT_EQ(c.tensors_skipped, 3);
  std::map<std::string, int64_t> counts;
  for (const SkippedTensors& s : c.skipped) counts[s.prefix] = s.count;
  EXPECT_EQ(counts, (std::map<std::string, int64_t>{{"model.visual.", 2}, {"mtp.", 1}}));
  EXPECT_EQ(c.weights_digest, (*text)->contract.weights_digest);  // packaging is not content
  ExpectSameOutputs(RunPrompt(**text), RunPrompt(**vlm));

  // The layout is recognised from the tensor names even when config.json is a plain text config.
  auto plain_config = Load(Write("vlm_tensors_text_config", config, vlm_weights));
  ASSERT_TRUE(plain_config.ok()) << plain_config.status();
  EXPECT_EQ((*plain_config)->contract.source_layout, "vlm");
  EXPECT_EQ((*plain_config)->contract.weight_prefix, "model.language_model.");
  EXPECT_EQ((*plain_config)->contract.weights_digest, (*text)->contract.weights_digest);

  // Missing tensors are named as the checkpoint spells them.
  vlm_weights.erase("model.language_model.norm.weight");
  auto missing = Load(Write("vlm_missing", packaged, vlm_weights));
  ASSERT_FALSE(missing.ok());
  ExpectError(missing.status(), absl::StatusCode::kInvalidArgument,
              {"model.language_model.norm.weight"});
}

TEST_F(LoaderTest, Bf16CheckpointLoadsInEitherComputeDtype) {
  const ModelConfig config = TinyQwen3Config();
  const std::string dir = Write("bf16", config, RandomWeights(config), DType::kBF16);
  auto f32 = Load(dir);
  auto bf16 = Load(dir, at::kBFloat16);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*f32)->contract.weights_digest, (*bf16)->contract.weights_digest);
  EXPECT_EQ((*f32)->model->embed_tokens().scalar_type(), at::kFloat);
  EXPECT_EQ((*bf16)->model->embed_tokens().scalar_type(), at::kBFloat16);
  // bf16 → fp32 is exact, so the two hold the same values.
  EXPECT_TRUE(
      at::equal((*f32)->model->embed_tokens(), (*bf16)->model->embed_tokens().to(at::kFloat)));
}

TEST_F(LoaderTest, ConfigErrors) {
  const ModelConfig config = TinyQwen3Config();
  const TensorMap weights = RandomWeights(config);
  std::string json = ModelConfigToJson(config);
  const size_t at = json.find("\"qwen3\"");
  ASSERT_NE(at, std::string::npos);
  json.replace(at, strlen("\"qwen3\""), "\"mistral\"");
  auto unknown = Load(WriteRaw("mistral", json, weights));
  ASSERT_FALSE(unknown.ok());
  ExpectError(unknown.status(), absl::StatusCode::kInvalidArgument,
              {"config.json", "model_type", "mistral"});

  const std::string no_config = root_ + "/no_config";
  std::filesystem::create_directories(no_config);
  auto missing = Load(no_config);
  ASSERT_FALSE(missing.ok());
  ExpectError(missing.status(), absl::StatusCode::kNotFound, {"config.json"});
}

TEST_F(LoaderTest, DeviceMapReachesTheContract) {
  const ModelConfig config = TinyQwen3Config();
  const std::string dir = Write("devmap", config, RandomWeights(config));
  auto explicit_map = Load(dir, at::kFloat, "cpu=0-0,cpu=1-1");
  ASSERT_TRUE(explicit_map.ok()) << explicit_map.status();
  EXPECT_EQ((*explicit_map)->contract.devices, std::vector<std::string>({"cpu", "cpu"}));
  auto bad = Load(dir, at::kFloat, "cpu=0-0");
  ASSERT_FALSE(bad.ok());
  ExpectError(bad.status(), absl::StatusCode::kInvalidArgument, {"layer 1"});
}

TEST(ResolveDeviceMapTest, SingleDevice) {
  auto d = ResolveDeviceMap("cpu", 4);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, std::vector<at::Device>(4, at::Device(at::kCPU)));
}

TEST(ResolveDeviceMapTest, ListSplitsIntoContiguousRuns) {
  auto d = ResolveDeviceMap("cpu,cpu", 5);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 5u);
  auto more_devices_than_layers = ResolveDeviceMap("cpu,cpu,cpu", 2);
  ASSERT_TRUE(more_devices_than_layers.ok()) << more_devices_than_layers.status();
  EXPECT_EQ(more_devices_than_layers->size(), 2u);
}

TEST(ResolveDeviceMapTest, ExplicitRanges) {
  auto d = ResolveDeviceMap("cpu=0-1,cpu=2-3", 4);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, std::vector<at::Device>(4, at::Device(at::kCPU)));
  // Order of entries does not matter.
  EXPECT_TRUE(ResolveDeviceMap("cpu=2-3,cpu=0-1", 4).ok());
}

TEST(ResolveDeviceMapTest, Errors) {
  const auto invalid = absl::StatusCode::kInvalidArgument;
  ExpectError(ResolveDeviceMap("cpu=0-2,cpu=2-3", 4).status(), invalid, {"layer 2", "twice"});
  ExpectError(ResolveDeviceMap("cpu=0-1", 4).status(), invalid, {"layer 2", "unassigned"});
  ExpectError(ResolveDeviceMap("cpu=0-4", 4).status(), invalid, {"cpu=0-4", "[0, 3]"});
  ExpectError(ResolveDeviceMap("cpu=3-1", 4).status(), invalid, {"cpu=3-1"});
  ExpectError(ResolveDeviceMap("cpu=a-b", 4).status(), invalid, {"cpu=a-b"});
  ExpectError(ResolveDeviceMap("cpu=0", 4).status(), invalid, {"cpu=0"});
  ExpectError(ResolveDeviceMap("cpu=0-1,cpu", 4).status(), invalid, {"cpu"});
  ExpectError(ResolveDeviceMap("tpu", 4).status(), invalid, {"tpu"});
  ExpectError(ResolveDeviceMap("tpu=0-3", 4).status(), invalid, {"tpu"});
  ExpectError(ResolveDeviceMap("", 4).status(), invalid, {"empty"});
  ExpectError(ResolveDeviceMap(",", 4).status(), invalid, {"empty"});
}

TEST(ResolveDeviceMapTest, CudaWithoutCudaIsAFailedPrecondition) {
  if (CudaAvailable()) GTEST_SKIP() << "this build has CUDA";
  ExpectError(ResolveDeviceMap("cuda", 2).status(), absl::StatusCode::kFailedPrecondition,
              {"cuda"});
  ExpectError(ResolveDeviceMap("cuda:1", 2).status(), absl::StatusCode::kFailedPrecondition,
              {"cuda:1"});
  ExpectError(ResolveDeviceMap("cpu=0-0,cuda:0=1-1", 2).status(),
              absl::StatusCode::kFailedPrecondition, {"cuda:0"});
}

}  // namespace
}  // namespace specwire
