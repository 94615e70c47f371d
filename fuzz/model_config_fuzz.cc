// config.json (and generation_config.json) parsing on arbitrary text: an error, or a config that
// ModelConfigToJson writes back to the same config (the round trip the header promises).
#include <cstdint>
#include <string>

#include "common/model_config.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specwire;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ParseModelConfig(text);
  if (!config.ok()) {
    fuzz::CheckError(config.status());
    FUZZ_CHECK(config.status().code() == absl::StatusCode::kInvalidArgument, "code %d: %s",
               static_cast<int>(config.status().code()),
               std::string(config.status().message()).c_str());
  } else {
    FUZZ_CHECK(static_cast<int64_t>(config->layer_types.size()) == config->num_layers,
               "%zu layer types for %lld layers", config->layer_types.size(),
               static_cast<long long>(config->num_layers));
    const std::string json = ModelConfigToJson(*config);
    auto again = ParseModelConfig(json);
    FUZZ_CHECK(again.ok(), "the written config does not parse: %s\n%s",
               std::string(again.status().message()).c_str(), json.c_str());
    FUZZ_CHECK(*again == *config, "the round trip changed the config:\n%s", json.c_str());
  }
  // The same text as a generation config, applied to a valid config.
  static const ModelConfig base = [] {
    auto c = ParseModelConfig(
        R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 8, "max_position_embeddings": 128, "eos_token_id": 3})");
    FUZZ_CHECK(c.ok(), "base config: %s", std::string(c.status().message()).c_str());
    return *c;
  }();
  ModelConfig c = base;
  absl::Status applied = ApplyGenerationConfig(text, c);
  if (!applied.ok()) {
    fuzz::CheckError(applied);
  } else {
    ModelConfig rest = c;
    rest.eos_token_ids = base.eos_token_ids;
    FUZZ_CHECK(rest == base, "generation_config changed more than eos_token_ids");
  }
  return 0;
}
