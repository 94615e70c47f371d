// Tiny random targets for the model tests (no checkpoint): a hybrid Qwen3.5 and a dense Qwen3.
// Agreement with transformers is the parity tier's job; these exercise the layers' own paths.
#pragma once

#include <ATen/ATen.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_config.h"
#include "common/models/decoder.h"
#include "common/models/llama.h"
#include "common/models/qwen3_5.h"

namespace specwire {
namespace testing {

// The device the tiny targets run on: SPECWIRE_TEST_DEVICE ("cuda", "cuda:1"; default cpu), so
// that a GPU host reruns the decoding, session and packing tests on its device
// (scripts/gpu_decode.sh).
inline at::Device TestDevice() {
  const char* env = std::getenv("SPECWIRE_TEST_DEVICE");
  return env != nullptr && *env != '\0' ? at::Device(std::string(env)) : at::Device(at::kCPU);
}

// A tiny hybrid: 3 GatedDeltaNet layers, then one gated full-attention layer, then one more GDN.
inline ModelConfig TinyHybridConfig() {
  ModelConfig c;
  c.family = ModelFamily::kQwen3_5;
  c.model_type = "qwen3_5_text";
  c.architecture = "Qwen3_5ForCausalLM";
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 5;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.qk_norm = true;
  c.attn_output_gate = true;
  c.rope.theta = 10000.0;
  c.rope.partial_rotary_factor = 0.25;
  c.layer_types = {LayerType::kLinearAttention, LayerType::kLinearAttention,
                   LayerType::kLinearAttention, LayerType::kFullAttention,
                   LayerType::kLinearAttention};
  c.linear_conv_kernel_dim = 4;
  c.linear_key_head_dim = 8;
  c.linear_value_head_dim = 8;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  return c;
}

inline std::unique_ptr<DecoderModel> RandomTinyHybrid(at::ScalarType dtype = at::kFloat,
                                                      uint64_t seed = 42,
                                                      ModelConfig config = TinyHybridConfig()) {
  auto built = BuildQwen3_5Model(config, dtype);
  TORCH_CHECK(built.ok(), built.status().ToString());
  std::unique_ptr<DecoderModel> model = std::move(built).value();
  at::manual_seed(seed);
  model->ForEachWeight([](const WeightSlot& s) {
    if (s.name.ends_with("A_log")) {
      *s.slot = at::log(at::rand(s.shape) * 15 + 1);  // decay rates exp(A) in [1, 16)
    } else if (s.name.ends_with("norm.weight") || s.name.ends_with("dt_bias")) {
      *s.slot = at::randn(s.shape) * 0.3;
    } else {
      *s.slot = at::randn(s.shape) * 0.2;
    }
  });
  model->Prepare(std::vector<at::Device>(config.num_layers, TestDevice()));
  return model;
}

// A dense Qwen3 (q/k norms, grouped-query attention), `layers` deep.
inline std::unique_ptr<DecoderModel> RandomTinyDense(at::ScalarType dtype = at::kFloat,
                                                     uint64_t seed = 7, int64_t layers = 3) {
  absl::StatusOr<ModelConfig> parsed = ParseModelConfig(absl::StrCat(
      R"({"model_type": "qwen3", "vocab_size": 128, "hidden_size": 64,
          "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "tie_word_embeddings": false, "num_hidden_layers": )",
      layers, "}"));
  TORCH_CHECK(parsed.ok(), parsed.status().ToString());
  const ModelConfig& c = *parsed;
  auto model = BuildLlamaFamilyModel(c, dtype);
  at::manual_seed(seed);
  model->ForEachWeight([](const WeightSlot& s) {
    at::Tensor t = at::randn(s.shape);
    *s.slot = s.shape.size() == 1 ? 1.0 + 0.1 * t : t / std::sqrt(double(s.shape.back()));
  });
  model->Prepare(std::vector<at::Device>(layers, TestDevice()));
  return model;
}

}  // namespace testing
}  // namespace specwire
