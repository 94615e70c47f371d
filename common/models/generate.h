// Greedy generation with a KV cache: the target's own completion of a prompt, which the scorer
// replays the drafter against (and the basis of the Generate RPC).
#pragma once

#include <cstdint>
#include <functional>
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

// Callback after every emitted token; returning false stops generation (cancellation).
using TokenCallback = std::function<bool(int64_t token)>;

// INVALID_ARGUMENT for an empty prompt or a token id outside the vocabulary.
absl::StatusOr<GenerateResult> GreedyGenerate(DecoderModel& model, std::span<const int64_t> prompt,
                                              const GenerateOptions& options,
                                              const TokenCallback& on_token = nullptr);

}  // namespace specwire
