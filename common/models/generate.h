// Greedy generation with a KV cache: the target's own completion of a prompt, which the scorer
// replays the drafter against (and the basis of the Generate RPC).
//
// One canonical schedule of the arithmetic, whoever runs it: the prompt is prefilled in chunks of
// kPrefillChunkTokens (each a forward continuing the cache), and every later token comes from
// DecoderModel::DecodeStep, whose per-sequence numbers do not depend on how many sequences share
// the step. GreedyGenerate (one sequence) and the extractor's continuous batching
// (services/extractor/scheduler.h: many sequences joining and leaving) therefore emit the same
// tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/models/decoder.h"

namespace specwire {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  // Generation stops after emitting any of these (the stop token is part of the completion, as
  // in transformers' generate()), or any of config.eos_token_ids when use_config_eos is set.
  std::vector<int64_t> stop_token_ids;
  bool use_config_eos = true;  // add config.eos_token_ids to stop_token_ids
};

struct GenerateResult {
  std::vector<int64_t> tokens;  // completion only
  std::string finish_reason;    // "stop_token", "max_new_tokens" or "cancelled" (callback)
};

// Prompt tokens per prefill forward.
inline constexpr int64_t kPrefillChunkTokens = 256;
// Prompt + completion tokens of one sequence at most (its cache is allocated up front).
inline constexpr int64_t kMaxSequenceTokens = 1 << 20;

// One greedy generation in progress. Not thread-safe; torch errors propagate as c10::Error
// (callers at the edge use RunGuarded).
class GreedySequence {
 public:
  // INVALID_ARGUMENT for an empty prompt, a token id outside the vocabulary, a negative
  // max_new_tokens, or prompt + max_new_tokens over kMaxSequenceTokens. Allocates the cache.
  static absl::StatusOr<std::unique_ptr<GreedySequence>> Start(DecoderModel& model,
                                                               std::span<const int64_t> prompt,
                                                               const GenerateOptions& options);

  // Prompt tokens not yet in the cache.
  int64_t pending_prompt_tokens() const { return prompt_len_ - prefilled_; }
  // Runs the next prefill chunk; the last one emits the first token. Needs pending tokens.
  void PrefillChunk();
  // The whole prompt is in the cache and generation has not stopped: DecodeStep may take it.
  bool decoding() const { return pending_prompt_tokens() == 0 && !finished(); }
  bool finished() const { return finished_; }
  // Stops it (a cancelled request or a refused token): finish_reason "cancelled".
  void Cancel();

  const std::vector<int64_t>& prompt() const { return prompt_; }
  const GenerateResult& result() const { return result_; }
  // The logits [vocab] the last token was taken from (on the model's output device, its dtype).
  const at::Tensor& last_logits() const { return last_logits_; }
  GenerateResult TakeResult() { return std::move(result_); }
  // Tokens the cache holds room for (prompt + max_new_tokens).
  int64_t capacity() const { return cache_->capacity; }

 private:
  friend void DecodeStep(DecoderModel& model, const std::vector<GreedySequence*>& batch);
  GreedySequence(DecoderModel& model, std::span<const int64_t> prompt, const GenerateOptions& o);
  void Emit(const at::Tensor& logits_row, int64_t next);  // the argmax token; stop checks

  DecoderModel& model_;
  std::vector<int64_t> prompt_;
  int64_t prompt_len_ = 0;
  int64_t prefilled_ = 0;
  int64_t max_new_tokens_ = 0;
  std::vector<int64_t> stops_;
  std::unique_ptr<ModelCache> cache_;
  GenerateResult result_;
  at::Tensor last_logits_;
  bool finished_ = false;
};

// One decoding step of every sequence in `batch` (each decoding()): one more token each.
void DecodeStep(DecoderModel& model, const std::vector<GreedySequence*>& batch);

// Callback after every emitted token; returning false stops generation (cancellation).
using TokenCallback = std::function<bool(int64_t token)>;

// One sequence from prompt to stop. INVALID_ARGUMENT as GreedySequence::Start.
absl::StatusOr<GenerateResult> GreedyGenerate(DecoderModel& model, std::span<const int64_t> prompt,
                                              const GenerateOptions& options,
                                              const TokenCallback& on_token = nullptr);

// Bytes of a batch-1 cache: fixed + per_token · capacity (measured from the model's own caches).
struct CacheCost {
  int64_t fixed = 0;
  int64_t per_token = 0;
  int64_t Bytes(int64_t capacity) const { return fixed + per_token * capacity; }
};
CacheCost MeasureCacheCost(const DecoderModel& model);

}  // namespace specwire
