// The extraction engine: a loaded target plus the two operations the extractor offers — hidden
// states of token sequences and greedy completions. Thread-compatible, not thread-safe: the
// service runs it on its own worker thread(s); offline tools call it directly.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/models/decoder.h"
#include "common/models/generate.h"
#include "common/models/loader.h"
#include "services/extractor/work.h"

namespace specwire {

// Hidden states of one sequence, on the CPU in the requested dtype, each [T, hidden].
struct SequenceStates {
  at::Tensor embedding;                  // when requested
  std::map<int64_t, at::Tensor> layers;  // layer id → state
  at::Tensor final_norm;                 // when requested
};

// How Extract lays out several sequences.
enum class BatchLayout {
  // The sequences packed one after another, without padding, into forwards of up to
  // kPackedRows tokens: the matrix products run once over every sequence's rows (on
  // DecoderModel::InvariantRows rows, where a row's rounding does not depend on the row count),
  // attention and the recurrences per sequence. A sequence's hidden states are bit-identical
  // whatever else shares the request or the batch (fp32 and bf16). The canonical extraction
  // path and the default.
  kPacked,
  // Each sequence runs through its own forward, unpadded: bit-identical whatever shares the batch
  // by construction (no row is ever shared), at the cost of one smaller forward per sequence.
  kPerSequence,
  // Right-padded forwards over groups of similar length (padding at most doubles a group's
  // tokens): a sequence's low bits depend on what else is in the batch (bf16: up to ~1e-2
  // relative). For throughput comparisons.
  kPadded,
};

// Tokens one packed forward holds at most (a longer sequence runs alone).
inline constexpr int64_t kPackedRows = 2048;

// "packed" | "per_sequence" | "padded"; INVALID_ARGUMENT names `field`.
absl::StatusOr<BatchLayout> ParseBatchLayout(absl::string_view name, absl::string_view field);
const char* BatchLayoutName(BatchLayout layout);

class ExtractionEngine {
 public:
  static absl::StatusOr<std::unique_ptr<ExtractionEngine>> Load(const std::string& model_dir,
                                                                const LoadOptions& options);
  explicit ExtractionEngine(std::unique_ptr<LoadedModel> model);

  const ExtractionContract& contract() const { return model_->contract; }
  // The layout Extract uses by default; the contract's kernel_variant says which it is.
  void SetBatchLayout(BatchLayout layout);
  BatchLayout batch_layout() const { return layout_; }
  const ModelConfig& config() const { return model_->config; }
  DecoderModel& model() { return *model_->model; }

  // Checks a request against the model: non-empty sequences, token ids inside the vocabulary,
  // layer ids inside [0, num_layers), something to capture. INVALID_ARGUMENT names the field.
  absl::Status Validate(const std::vector<std::vector<int64_t>>& sequences,
                        const CaptureSpec& capture) const;

  // Runs the sequences (see BatchLayout) and returns each sequence's requested states converted
  // to `out_dtype` on the CPU.
  absl::StatusOr<std::vector<SequenceStates>> Extract(
      const std::vector<std::vector<int64_t>>& sequences, const CaptureSpec& capture,
      at::ScalarType out_dtype);
  absl::StatusOr<std::vector<SequenceStates>> Extract(
      const std::vector<std::vector<int64_t>>& sequences, const CaptureSpec& capture,
      at::ScalarType out_dtype, BatchLayout layout);

  absl::StatusOr<GenerateResult> Generate(const std::vector<int64_t>& prompt,
                                          const GenerateOptions& options,
                                          const TokenCallback& on_token = nullptr);

  // Runs the canary input (CanaryTokens(vocab, n)) through every tap and stores its fingerprint
  // in the contract (contract().canary).
  absl::Status ComputeCanary(int64_t n);

  // A target tensor by canonical name ("model.embed_tokens.weight", "lm_head.weight",
  // "model.norm.weight", "model.layers.0...."), exactly as stored in the checkpoint (a tied
  // lm_head is the embedding). The bytes live as long as the engine. NOT_FOUND names the tensor.
  absl::StatusOr<TensorBytes> StoredTensor(const std::string& name);

 private:
  std::unique_ptr<LoadedModel> model_;
  BatchLayout layout_ = BatchLayout::kPacked;
  std::map<std::string, std::string> digests_;  // tensor name → digest, computed on first use
};

}  // namespace specwire
