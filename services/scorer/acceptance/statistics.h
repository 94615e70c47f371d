// The uncertainty and the planning numbers around τ (no torch, no protobuf):
//
//   bootstrap intervals  percentile bootstrap over responses (the unit that is sampled: a prompt
//                        and its completion), seeded, the resample count a setting. Responses
//                        without steps are left out, as in τ itself.
//   paired comparison    two step lists per prompt (two drafters on the same trajectories):
//                        Δτ = τ_B − τ_A with a paired bootstrap interval (prompts resampled
//                        jointly, so the prompts' own difficulty cancels).
//   token windows        τ of the steps whose first committed token lies in completion tokens
//                        [first, last] (1-based; token 1 comes from the prefill, so the first
//                        step commits from token 2): later tokens of a completion are easier to
//                        draft, so a τ is only comparable at the same window.
//   capacity planning    from the unconditional rates P(a ≥ i), the expected tokens per step of
//                        a draft of k tokens, 1 + Σ_{i≤k} P(a ≥ i), and a recommended k under a
//                        cost model (see CapacityOptions); vLLM's synthetic acceptance rates.
//
// All positions are 1-based draft positions: position 1 is the first drafted token after the
// anchor (the report, the CLI table, the Prometheus labels and the exports use the same numbers).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace specwire {

struct BootstrapOptions {
  int32_t resamples = 1000;  // 0: no intervals
  uint64_t seed = 0;
  double confidence = 0.95;
};

// A two-sided percentile interval; absent when there is nothing to resample.
struct Interval {
  double lo = 0;
  double hi = 0;
};

// [lo, hi], or null when absent (the reports' JSON).
nlohmann::json IntervalJson(const std::optional<Interval>& i);

// τ of one list of step lengths per response, both ways, with intervals.
struct TauEstimate {
  int64_t responses = 0;  // with at least one step
  int64_t steps = 0;
  double mean_of_means = 0;  // dflash's τ
  double pooled = 0;         // committed tokens / steps
  std::optional<Interval> mean_of_means_ci;
  std::optional<Interval> pooled_ci;
};

TauEstimate EstimateTau(const std::vector<const std::vector<int32_t>*>& lists,
                        const BootstrapOptions& options);

// The deterministic generator behind every resample (SplitMix64): the same seed gives the same
// intervals on every machine.
class BootstrapRng {
 public:
  explicit BootstrapRng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n) (n ≥ 1).
  uint64_t Below(uint64_t n);

 private:
  uint64_t state_;
};

// The (1 − confidence)/2 and (1 + confidence)/2 quantiles of `values` (sorted in place), linear
// interpolation between order statistics (numpy's default).
Interval PercentileInterval(std::vector<double>& values, double confidence);

// --- paired comparison ---------------------------------------------------------------------------

struct PairedComparison {
  int64_t prompts = 0;  // pairs where both sides have steps
  int64_t b_better = 0, a_better = 0, ties = 0;  // per-prompt τ
  double tau_a = 0, tau_b = 0, delta = 0;        // mean of means over the pairs; Δ = B − A
  double pooled_a = 0, pooled_b = 0, delta_pooled = 0;
  std::optional<Interval> delta_ci;
  std::optional<Interval> delta_pooled_ci;
  std::vector<std::pair<double, double>> per_prompt;  // (τ_A, τ_B) of each pair, in order
};

// a[i] and b[i] are the step lists of prompt i under drafters A and B (same size).
PairedComparison ComparePaired(const std::vector<const std::vector<int32_t>*>& a,
                               const std::vector<const std::vector<int32_t>*>& b,
                               const BootstrapOptions& options);

// --- token windows ------------------------------------------------------------------------------

// The steps of `steps` whose first committed completion token lies in [first, last].
std::vector<int32_t> StepsInTokenWindow(const std::vector<int32_t>& steps, int64_t first,
                                        int64_t last);

struct TokenWindow {
  int64_t first_token = 0;  // 1-based completion token indices, inclusive
  int64_t last_token = 0;
  TauEstimate tau;
};

// Windows of `window` tokens ([1, W], [W+1, 2W], ...) up to the last one holding a step.
std::vector<TokenWindow> TauByTokenWindow(const std::vector<const std::vector<int32_t>*>& lists,
                                          int64_t window, const BootstrapOptions& options);

// --- capacity planning --------------------------------------------------------------------------

// Time of one decoding step in units of one target decode forward:
//   step(k) = 1 + verify_cost_per_token · k + drafter_cost · (autoregressive ? k : 1)
// (a block drafter such as DFlash drafts every position in one forward; an autoregressive one,
// EAGLE-style, runs one forward per draft token). Speed-up over plain decoding = E_k / step(k).
struct CapacityOptions {
  double drafter_cost = 0.1;
  double verify_cost_per_token = 0.01;
  bool autoregressive = false;
};

struct CapacityRow {
  int32_t k = 0;                  // draft tokens per step (or tree budget)
  double expected_tokens = 0;     // committed tokens per step
  double step_cost = 0;           // in target decode forwards
  double speedup = 0;             // expected_tokens / step_cost
};

struct CapacityPlan {
  CapacityOptions options;
  std::vector<double> unconditional;  // P(a ≥ i), i = 1..B−1
  std::vector<CapacityRow> draft_lengths;  // k = 1..B−1
  std::vector<CapacityRow> tree_budgets;   // per node budget: E = the tree's pooled τ
  int32_t recommended_k = 0;               // 0 without data
  double recommended_speedup = 0;
};

// accepted_per_pos[i−1] = steps whose a ≥ i (vLLM's num_accepted_tokens_per_pos); steps > 0.
// ddtree_pooled: tree budget → pooled τ (tokens per step, what throughput sees); a tree costs
// tree_drafter_forwards drafter forwards (DDTree: 1; EAGLE's tree: its depth) and its budget's
// verification.
CapacityPlan PlanCapacity(int64_t steps, const std::vector<int64_t>& accepted_per_pos,
                          const std::map<int32_t, double>& ddtree_pooled,
                          const CapacityOptions& options, int32_t tree_drafter_forwards = 1);

// vLLM's synthetic acceptance mode for k draft tokens, as a --speculative-config fragment:
// {"num_speculative_tokens": k, "rejection_sample_method": "synthetic",
//  "synthetic_acceptance_rates": [P(a ≥ 1), ..., P(a ≥ k)]} (per-position unconditional rates,
// non-increasing, as vLLM requires).
std::string VllmSyntheticConfigJson(const CapacityPlan& plan, int32_t k);

}  // namespace specwire
