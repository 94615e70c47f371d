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
  // Every tensor's name, for the group a client drafts with ("mtp.": the checkpoint's own
  // multi-token-prediction head, fetched by GetTensors); empty for the others.
  std::vector<std::string> names;
  std::string digest;  // over the named tensors' names and bytes (as weights_digest); "" without
  bool operator==(const SkippedTensors&) const = default;
};

// Statistics of one tap's canonical states on the canary input (fp64 over every element): enough
// to tell rounding from drift between two servers or checkpoints without moving tensors.
struct TapFingerprint {
  std::string tap;  // "embedding" | "layer.{k}" | "final_norm"
  double mean = 0;
  double std = 0;
  double rms = 0;
  // Projections onto fixed ±1 patterns (SplitMix64 signs), scaled by 1/sqrt(elements): each is
  // about rms in size, and two runs' projections differ by about rms × their relative error.
  std::vector<double> sketch;
  bool operator==(const TapFingerprint&) const = default;
};

// The canary: the fixed token ids CanaryTokens(vocab, n) run through the target at load, every
// tap fingerprinted. Empty (no taps) when it was not computed.
struct CanaryFingerprint {
  std::vector<int64_t> token_ids;
  std::string compute_dtype;
  std::vector<TapFingerprint> taps;
  bool empty() const { return taps.empty(); }
  bool operator==(const CanaryFingerprint&) const = default;
};

inline constexpr int kCanarySketches = 8;

// The canary input: n ids spread over the vocabulary ((7919 i + 11) mod vocab).
std::vector<int64_t> CanaryTokens(int64_t vocab_size, int64_t n);

// Two fingerprints compared tap by tap: the relative difference of the rms and the largest
// sketch difference over the rms; `level` is "identical" (bit-equal statistics), "rounding"
// (≤ the rounding of the coarser compute dtype), "drift" (≤ 100× that) or "mismatch".
struct TapComparison {
  std::string tap;
  double rms_relative = 0;
  double sketch_relative = 0;
  std::string level;
};
struct FingerprintComparison {
  std::vector<TapComparison> taps;
  std::string level;   // the worst tap's
  double threshold = 0;  // the rounding threshold used
  std::string problem;   // non-empty when the two cannot be compared (other canary, other taps)
};
FingerprintComparison CompareFingerprints(const CanaryFingerprint& a, const CanaryFingerprint& b);

std::string CanaryToJson(const CanaryFingerprint& c, int indent = -1);
// A canary from its JSON, or from a JSON object holding one under "canary" (a contract,
// specwire-cli fingerprint's output) or under "contract" (a scorer report).
absl::StatusOr<CanaryFingerprint> CanaryFromJson(absl::string_view json_text);

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
  // The canary fingerprint of this target as loaded (computed at load; empty when disabled).
  CanaryFingerprint canary;
  // The checkpoint's config.json as the extractor read it (what a client builds the target's
  // own MTP head from); empty from extractors that predate it.
  std::string config_json;
  bool operator==(const ExtractionContract&) const = default;
};

std::string ContractToJson(const ExtractionContract& c, int indent = 2);
absl::StatusOr<ExtractionContract> ContractFromJson(absl::string_view json_text);

}  // namespace specwire
