// Acceptance statistics of a drafter on greedy trajectories (no torch, no protobuf).
//
// Conventions (the proto's AcceptanceSummary, dflash's benchmark):
//   acceptance length of a step = a + 1, where a = leading draft tokens equal to the trajectory
//     (the bonus token is counted), so it lies in [1, B].
//   τ per response = mean of its step lengths; τ (dflash's convention) = mean over responses of
//     their τ; τ pooled = all committed tokens / all steps (token-weighted).
//   Histogram over 1..B of step lengths.
//   Per-position conditional acceptance: p_k = P(draft position k accepted | positions < k
//     accepted), k = 1..B-1 (draft position 1 is the first drafted token after the anchor).
//   vLLM's counters: num_drafts (steps), num_draft_tokens (steps × (B-1)), num_accepted_tokens
//     (Σ a), num_accepted_tokens_per_pos[k-1] (steps whose a >= k).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace specwire {

// One response's replay.
struct ResponseAcceptance {
  std::vector<int32_t> step_lengths;  // a + 1 per drafting step, in order
  // DDTree-N: accepted path length + 1 per step, for each node budget N.
  std::map<int32_t, std::vector<int32_t>> ddtree_step_lengths;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

struct AcceptanceSummary {
  int32_t block_size = 0;
  int64_t responses = 0;
  int64_t steps = 0;
  double tau_mean_of_means = 0;  // dflash's τ
  double tau_pooled = 0;
  std::vector<int64_t> histogram;               // index L-1 for length L, size B
  std::vector<double> per_position_acceptance;  // size B-1, conditional
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> num_accepted_tokens_per_pos;  // size B-1
  double acceptance_rate = 0;                        // num_accepted_tokens / num_draft_tokens
  // DDTree budget → (τ mean of means, τ pooled).
  std::map<int32_t, std::pair<double, double>> ddtree_tau;
};

// Every step length must lie in [1, block_size] (the replay guarantees it; see
// ValidateAcceptance for input from elsewhere). Responses without steps (the first completion
// token was already a stop token) count in `responses` but not in the τ means, as in dflash's
// benchmark where np.mean of an empty list is nan. Rates with a zero denominator are 0.
AcceptanceSummary Summarize(const std::vector<ResponseAcceptance>& responses, int32_t block_size);

// INVALID_ARGUMENT naming the response, the list (DFlash or DDTree-N) and the step when a step
// length lies outside [1, block_size] or block_size < 2.
absl::Status ValidateAcceptance(const std::vector<ResponseAcceptance>& responses,
                                int32_t block_size);

// The summary as one JSON object (keys as the struct's fields; ddtree_tau as
// {"<budget>": {"tau_mean_of_means": .., "tau_pooled": ..}}).
std::string AcceptanceSummaryToJson(const AcceptanceSummary& summary);

}  // namespace specwire
