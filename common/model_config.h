// The target model's architecture, parsed from a Hugging Face config.json in one place.
//
// One struct covers every supported family; fields a family does not use keep their defaults.
// Defaults are those of the transformers config classes (v5), so a config that omits a key means
// what it means to transformers. Keys without a meaningful default (sizes) are required.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specwire {

enum class ModelFamily {
  kLlama,   // LlamaForCausalLM: plain RMSNorm, optional attention/MLP biases
  kQwen2,   // Qwen2ForCausalLM: q/k/v biases, no q/k norm
  kQwen3,   // Qwen3ForCausalLM: per-head q/k RMSNorm, no biases
  kQwen3_5  // Qwen3_5ForCausalLM: hybrid Gated DeltaNet + gated full attention, (1 + w) norms
};

enum class LayerType {
  kFullAttention,     // "full_attention"
  kSlidingAttention,  // "sliding_attention": keys within `sliding_window` positions
  kLinearAttention    // "linear_attention": Gated DeltaNet
};
const char* LayerTypeName(LayerType t);

struct RopeConfig {
  std::string type = "default";  // "default", "linear", "llama3" or "yarn"
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // fraction of head_dim that is rotated (Qwen3.5: 0.25)
  double factor = 1.0;                 // linear / llama3 / yarn
  double low_freq_factor = 1.0;        // llama3
  double high_freq_factor = 4.0;       // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3 / yarn
  // yarn (transformers' _compute_yarn_parameters). attention_factor scales cos and sin: the
  // config's value, else derived from factor (and mscale / mscale_all_dim when both are set).
  double attention_factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  // mRoPE sections of Qwen3.5 ([11, 11, 10]). Text-only input gives all three rows the same
  // positions, which makes interleaved mRoPE exactly 1-D RoPE; kept for the contract only.
  std::vector<int64_t> mrope_section;
  bool operator==(const RopeConfig&) const = default;
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kQwen3;
  std::string model_type;    // of the text model: "qwen3", "llama", "qwen3_5_text", ...
  std::string architecture;  // the class that runs: "Qwen3ForCausalLM", "Qwen3_5ForCausalLM", ...
  // The checkpoint is a vision-language package (config.json with text_config): the text model's
  // tensors live under model.language_model.* and vision / MTP tensors are skipped.
  bool vlm_packaged = false;
  std::string vlm_architecture;  // as declared in the VLM config ("Qwen3_5ForConditionalGeneration")

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // default: num_heads
  int64_t head_dim = 0;      // default: hidden_size / num_heads (Qwen3: 128)
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // biases on q/k/v (Qwen2: always; Llama: also on o_proj)
  bool o_proj_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;           // Qwen3 / Qwen3.5
  bool attn_output_gate = false;  // Qwen3.5: q_proj holds [query | gate] per head
  int64_t max_position_embeddings = 0;
  RopeConfig rope;
  std::vector<LayerType> layer_types;  // num_layers entries
  int64_t sliding_window = 0;          // for kSlidingAttention layers

  // Gated DeltaNet (Qwen3.5 linear-attention layers).
  int64_t linear_conv_kernel_dim = 4;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;

  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype;  // as declared ("bfloat16"); informational

  // Keys only a target's forward reads (a drafter's config gives them other meanings): attention
  // made bidirectional (`is_causal: false`), and hidden_states[L] left un-normed
  // (`tie_last_hidden_states: false`). CheckTargetConfig refuses both.
  bool is_causal = true;
  bool tie_last_hidden_states = true;

  int64_t rotary_dim() const;  // 2·ceil(int(head_dim × partial_rotary_factor) / 2), the dims rotated
  bool operator==(const ModelConfig&) const = default;
};

// Parses config.json text. `source` names the file in error messages. INVALID_ARGUMENT for bad
// JSON, a missing required key, a wrong type, an unknown model_type or an unsupported feature
// (rope type, activation), each naming the key and value.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source = "config.json");

// What ParseModelConfig accepts for any Qwen3-style layer stack but transformers' CausalLM
// target classes cannot run as specwire would: bidirectional attention, an un-normed
// hidden_states[L], sliding layers of Qwen2 / Qwen3 without a window. INVALID_ARGUMENT naming
// the key; the loader calls it for every target.
absl::Status CheckTargetConfig(const ModelConfig& c, absl::string_view source = "config.json");

// Applies generation_config.json: its eos_token_id (an id or a list) replaces config.json's, as
// transformers' generate() uses the generation config. Absent keys leave `c` unchanged.
absl::Status ApplyGenerationConfig(absl::string_view json_text, ModelConfig& c,
                                   absl::string_view source = "generation_config.json");

// Writes the config back in transformers' format; ParseModelConfig(ModelConfigToJson(c)) == c.
std::string ModelConfigToJson(const ModelConfig& c);

const char* ModelFamilyName(ModelFamily f);

}  // namespace specwire
