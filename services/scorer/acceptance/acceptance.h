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
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/scorer/acceptance/statistics.h"

namespace specwire {

// A sampling setting of the target (and of the drafter's q under "draft_distribution").
struct SamplingSetting {
  double temperature = 1;  // 0: greedy (one-hot at the argmax)
  double top_p = 1;        // (0, 1]
  int32_t top_k = 0;       // 0: every token
  bool operator==(const SamplingSetting&) const = default;
};

// The verification rules teacher-forced acceptance can assume.
inline constexpr const char* kRuleArgmaxDraft = "argmax_draft";
inline constexpr const char* kRuleDraftDistribution = "draft_distribution";

// The tree a job grows at each step, per node budget N (ScoreRequest.ddtree_budgets), as the
// drafter's family verifies one: DFlash's DDTree-N over a block's parallel marginals, or EAGLE's
// top-k tree (EAGLE-2's dynamic tree) for EAGLE-3 with total_tokens = N. DFlash2's selector walks
// one path: it grows none.
inline constexpr const char* kTreeDDTree = "ddtree";
inline constexpr const char* kTreeEagle = "eagle";

struct TreeSettings {
  std::string method;            // kTreeDDTree | kTreeEagle | "" (no tree)
  std::vector<int32_t> budgets;  // node budgets N
  int32_t depth = 0;             // EAGLE: levels of drafts (≤ the chain's drafts); DDTree: 0
  int32_t top_k = 0;             // EAGLE: children per expanded node; DDTree: 0
  // EAGLE's default breadth (SGLang's speculative_eagle_topk for EAGLE-3 Llama drafters).
  static constexpr int32_t kDefaultEagleTopK = 8;
  static constexpr int32_t kMaxSetting = 64;  // depth and top-k at most
};

// A tree's name in tables and charts: "DDTree-8", "EAGLE-tree-8".
std::string TreeLabel(const std::string& method, int32_t budget);

// One response's teacher-forced acceptance at one setting under one rule (the proto's
// TemperatureAcceptance says what it means).
struct SampledAcceptance {
  SamplingSetting setting;
  std::string rule;
  std::vector<double> block_tau;     // τ_prob = 1 + Σ_i Π_{j≤i} α_j per DFlash step
  std::vector<double> alpha_sum;     // per draft position k = 1..B−1: Σ α over the blocks
  std::vector<int64_t> alpha_blocks;  //   that drafted it (within the trajectory)
};

// A family's own prediction of each draft's acceptance (DSpark's confidence head) beside its
// greedy chain, for one response: each chain step's accepted drafts a and predictions
// c_1 .. c_{len − 1}, and for each cutoff the steps of an adaptive verify length: a step
// verifies the leading L drafts whose predicted survival c_1 · … · c_L stays at or above the
// cutoff, and produces min(a, L) + 1.
struct PredictedAcceptance {
  std::vector<int32_t> accepted;               // per chain step: a
  std::vector<std::vector<float>> predicted;   // per chain step: c_1 .. c_{len − 1}
  std::map<double, std::vector<int32_t>> cut_step_lengths;  // per cutoff
};

// One response's replay.
struct ResponseAcceptance {
  std::vector<int32_t> step_lengths;  // a + 1 per drafting step, in order
  // The job's tree (TreeSettings: DDTree-N or EAGLE's top-k tree): accepted path length + 1 per
  // step, for each node budget N.
  std::map<int32_t, std::vector<int32_t>> ddtree_step_lengths;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::vector<SampledAcceptance> sampled;  // one per (setting, rule) asked for
  std::optional<PredictedAcceptance> predicted;  // families that predict their acceptance
};

// The predictions against what happened, over the responses: per draft position k, the blocks
// that reached it (every earlier draft accepted), their mean predicted c_k and the share of them
// whose draft k was accepted; per cutoff, τ of the adaptive verify length.
struct CalibrationRow {
  int32_t position = 0;  // 1-based draft position
  int64_t blocks = 0;
  double predicted = 0;
  double observed = 0;
};
struct CutoffTau {
  double cutoff = 0;
  TauEstimate tau;
};
struct PredictedAcceptanceSummary {
  std::vector<CalibrationRow> calibration;  // positions some block reached
  std::vector<CutoffTau> cutoffs;           // ascending
};
// Cutoffs as a flag gives them: comma-separated survival probabilities in [0, 1], "" or "none"
// for none; sorted, without repeats. INVALID_ARGUMENT naming `flag` and the entry.
absl::StatusOr<std::vector<double>> ParseSurvivalCutoffs(const std::string& text,
                                                         const std::string& flag);
// nullopt when no response carries a prediction.
std::optional<PredictedAcceptanceSummary> SummarizePredicted(
    const std::vector<const PredictedAcceptance*>& responses, const BootstrapOptions& bootstrap);

// Teacher-forced acceptance at one (setting, rule) over the responses.
struct TemperatureSummary {
  SamplingSetting setting;
  std::string rule;
  int64_t blocks = 0;
  double tau_prob = 0;         // mean over responses of their mean block τ_prob
  std::optional<Interval> tau_prob_ci;
  double tau_prob_pooled = 0;  // mean over all blocks
  std::vector<double> alpha;   // mean α per draft position (0 where no block drafted it)
  std::vector<int64_t> alpha_blocks;
};

// How a summary is computed beyond the counts: its intervals and its token windows.
struct SummaryOptions {
  BootstrapOptions bootstrap;
  int64_t token_window = 64;  // τ by completion-token window of this many tokens; 0: none
};

// What a job's live loop did (ScoreRequest.live), beside the summary of its step lengths.
struct LiveSummary {
  SamplingSetting setting{0, 1, 0};
  std::string rule;
  uint64_t seed = 0;
  int64_t verify_calls = 0;
  int64_t drafted_tokens = 0;
  int64_t accepted_tokens = 0;
  double drafter_seconds = 0;
  double target_seconds = 0;
  // Greedy self-check: prompts also replayed on their Generate trajectory, and how many of them
  // gave the same trajectory and the same step lengths (live τ = replay τ step for step).
  int64_t self_check_prompts = 0;
  int64_t self_check_matching = 0;
  std::vector<int64_t> self_check_mismatches;  // prompt indices
};

struct AcceptanceSummary {
  int32_t block_size = 0;
  int64_t responses = 0;
  int64_t steps = 0;
  double tau_mean_of_means = 0;  // dflash's τ
  double tau_pooled = 0;
  std::vector<int64_t> histogram;               // index L-1 for length L, size B
  std::vector<double> per_position_acceptance;  // size B-1, conditional (0 where not reached)
  std::vector<int64_t> per_position_reached;    // size B-1: steps that drafted position k with
                                                // every earlier one accepted (the denominator)
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> num_accepted_tokens_per_pos;  // size B-1
  double acceptance_rate = 0;                        // num_accepted_tokens / num_draft_tokens
  // DDTree budget → (τ mean of means, τ pooled).
  std::map<int32_t, std::pair<double, double>> ddtree_tau;
  // Bootstrap intervals over responses (absent with 0 resamples or no steps).
  std::optional<Interval> tau_mean_of_means_ci;
  std::optional<Interval> tau_pooled_ci;
  std::map<int32_t, std::pair<std::optional<Interval>, std::optional<Interval>>> ddtree_tau_ci;
  // τ by completion-token window (DFlash steps).
  std::vector<TokenWindow> windows;
  // Teacher-forced acceptance at T > 0, per (setting, rule) in the order asked for.
  std::vector<TemperatureSummary> temperature;
  // The family's own acceptance prediction against the observed (DSpark), when it has one.
  std::optional<PredictedAcceptanceSummary> predicted_acceptance;
  SummaryOptions options;  // what the intervals and windows were computed with
  // The tree behind ddtree_tau (its budgets are the map's keys): set by the job, which knows
  // the drafter; DDTree for summaries that do not say.
  std::string tree_method = kTreeDDTree;
  int32_t tree_depth = 0;
  int32_t tree_top_k = 0;
  // "replay" (the greedy replay of Generate trajectories) or "live" (the real loop through
  // extractor sessions; `live` says how).
  std::string loop = "replay";
  std::optional<LiveSummary> live;
};

// Every step length must lie in [1, block_size] (the replay guarantees it; see
// ValidateAcceptance for input from elsewhere). Responses without steps (the first completion
// token was already a stop token) count in `responses` but not in the τ means, as in dflash's
// benchmark where np.mean of an empty list is nan. Rates with a zero denominator are 0.
AcceptanceSummary Summarize(const std::vector<ResponseAcceptance>& responses, int32_t block_size,
                            const SummaryOptions& options = {});

// INVALID_ARGUMENT naming the response, the list (DFlash or DDTree-N) and the step when a step
// length lies outside [1, block_size] or block_size < 2.
absl::Status ValidateAcceptance(const std::vector<ResponseAcceptance>& responses,
                                int32_t block_size);

// The summary as one JSON object (keys as the struct's fields; ddtree_tau as
// {"<budget>": {"tau_mean_of_means": .., "tau_pooled": .., "..._ci": [lo, hi]}}; an interval as
// [lo, hi] or null; per_position_acceptance entries null where no step reached the position).
std::string AcceptanceSummaryToJson(const AcceptanceSummary& summary);

// The summary's "predicted_acceptance": {"calibration": [{"position", "blocks", "predicted",
// "observed", "gap" (predicted − observed)}], "cutoffs": [{"cutoff", "responses", "steps",
// "tau_mean_of_means", "tau_mean_of_means_ci", "tau_pooled", "tau_pooled_ci"}]}.
nlohmann::json PredictedAcceptanceJson(const PredictedAcceptanceSummary& predicted);

// The same object back (reports compared by specwire-score --compare). INVALID_ARGUMENT naming
// the key on a malformed document.
absl::StatusOr<AcceptanceSummary> AcceptanceSummaryFromJson(const std::string& text);

}  // namespace specwire
