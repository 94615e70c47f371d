// The extraction contract: what the extractor actually ran, stated once at the start of every
// stream so consumers can refuse features that do not belong to them (see docs/ARCHITECTURE.md, and the
// proto's ExtractionContract, which mirrors this struct field by field).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specwire {

// Layer-id convention (the one DFlash's target_layer_ids use):
//   layer k (0 <= k < num_layers)  output of decoder layer k, the residual stream before the
//                                  final norm  == transformers' output_hidden_states[k + 1]
//   embedding tap                  output of embed_tokens          == hidden_states[0]
//   final-norm tap                 model.norm(output of layer L-1) == hidden_states[L]
// The final-norm tap is NOT layer L-1's output: transformers replaces its last entry with the
// normed state.

// A group of checkpoint tensors that were not loaded, and why.
struct SkippedTensors {
  std::string prefix;  // "model.visual.", "mtp.", "lm_head.weight"
  int64_t count = 0;
  std::string reason;  // "vision tower (text path)", "tied to model.embed_tokens.weight"
  bool operator==(const SkippedTensors&) const = default;
};

struct ExtractionContract {
  std::string architecture;     // class actually run: "Qwen3_5ForCausalLM"
  std::string model_type;       // text model type: "qwen3_5_text"
  std::string source_layout;    // "text" (model.layers.*) or "vlm" (model.language_model.*)
  std::string source_architecture;  // declared by the checkpoint ("Qwen3_5ForConditionalGeneration")
  std::string weight_prefix;    // prefix mapped onto the text model: "model." / "model.language_model."
  int64_t tensors_loaded = 0;
  int64_t tensors_skipped = 0;
  std::vector<SkippedTensors> skipped;
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  std::vector<std::string> layer_types;  // per layer: full_attention / sliding_attention / linear_attention
  std::string compute_dtype;             // "float32" / "bfloat16"
  std::vector<std::string> devices;      // per layer: "cpu", "cuda:0", ...
  std::string kernel_variant;            // attention and linear-attention kernels that ran
  std::string weights_digest;            // over canonical names + source bytes of loaded tensors
  std::string tokenizer_digest;          // of tokenizer.json; empty when the checkpoint has none
  std::string specwire_version;
  // xxh3-128 of the chat template text (chat_template.jinja, else tokenizer_config.json's
  // chat_template: the string, or the "default" / first named one); empty when there is none.
  // The digest specwire_client.chat's TemplateRecord carries.
  std::string chat_template_digest;
  bool operator==(const ExtractionContract&) const = default;
};

std::string ContractToJson(const ExtractionContract& c, int indent = 2);
absl::StatusOr<ExtractionContract> ContractFromJson(absl::string_view json_text);

}  // namespace specwire
