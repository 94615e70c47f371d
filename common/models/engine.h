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
#include "common/models/batch_layout.h"
#include "common/extractor_api.h"

namespace specwire {

// Hidden states of one sequence, on the CPU in the requested dtype, each [T, hidden].
struct SequenceStates {
  at::Tensor embedding;                  // when requested
  std::map<int64_t, at::Tensor> layers;  // layer id → state
  at::Tensor final_norm;                 // when requested
};

class ExtractionEngine {
 public:
  static absl::StatusOr<std::unique_ptr<ExtractionEngine>> Load(const std::string& model_dir,
                                                                const LoadOptions& options);
  explicit ExtractionEngine(std::unique_ptr<LoadedModel> model);

  const ExtractionContract& contract() const { return model_->contract; }
  // The layout Extract uses by default; the contract's kernel_variant says which it is and
  // whether it is batch-invariant on this device.
  void SetBatchLayout(BatchLayout layout);
  // "auto" (DefaultBatchLayout) or a layout's name; INVALID_ARGUMENT names `field`.
  absl::Status SetBatchLayout(absl::string_view name, absl::string_view field);
  // The batch-invariant layout of the model's device: packed on the CPU; per_sequence on CUDA,
  // where the packed forward's rows are not bit-identical to the sequence alone (cuBLAS chooses
  // its kernel, and so its summation order, by the row count; measured on an H200).
  BatchLayout DefaultBatchLayout() const;
  BatchLayout batch_layout() const { return layout_; }
  // Tokens one packed forward holds at most (default kPackedRows). A GPU needs more rows than a
  // CPU to reach its matrix-product rate; the states do not depend on it.
  void SetPackedRows(int64_t rows) { packed_rows_ = rows < 1 ? 1 : rows; }
  int64_t packed_rows() const { return packed_rows_; }
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
  int64_t packed_rows_ = kPackedRows;
  std::map<std::string, std::string> digests_;  // tensor name → digest, computed on first use
};

}  // namespace specwire
