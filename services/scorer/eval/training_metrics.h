// Prometheus gauges of continuous evaluation: acceptance per drafter checkpoint, labelled by run,
// training step and eval set, re-exported from the results database at start-up so a restarted
// scorer serves the whole history again (deploy/grafana/dashboards/specwire-training.json).
//
//   specwire_checkpoint_tau{run, step, dataset, kind="mean_of_means"|"pooled"}
//   specwire_checkpoint_ddtree_tau{run, step, dataset, budget}                  (mean of means)
//   specwire_checkpoint_acceptance{run, step, dataset, position}     conditional, 1..B-1
//   specwire_checkpoint_failed{run, step, dataset}                   1 for a failed checkpoint
//   specwire_checkpoint_latest_step{run}                             highest step scored ok
//   specwire_checkpoint_latest_tau{run, dataset}                     τ at that step, and at the
//   specwire_checkpoint_previous_tau{run, dataset}                   step before it
//   specwire_checkpoint_delta_tau{run, dataset, bound}               the regression check: paired
//       Δτ = latest − previous (mean of means) over the prompts whose trajectories are identical
//       in both, on the steps in completion tokens [1, window]; bound = "estimate" | "lo" | "hi"
//       (the paired bootstrap interval). Absent when the two cannot be paired (no common
//       trajectory), which deploy/prometheus/rules/training.yml alerts on too.
//   specwire_checkpoint_delta_tau_prompts{run, dataset}              prompts paired
//   specwire_checkpoint_latest_ddtree_tau{run, dataset, budget}
//   specwire_checkpoint_latest_acceptance{run, dataset, position}
//   specwire_checkpoint_evaluations_total{run, dataset, status}      scorings by this process
//   specwire_watch_polls_total                                       watch-directory scans
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "services/scorer/eval/results_db.h"

namespace specwire {

// The regression check of the latest checkpoint against the one before it. Fixed prompts (the
// eval set), fixed trajectories (paired by digest) and a fixed token window: a change of
// generation length cannot fake a regression.
struct RegressionOptions {
  int64_t window_tokens = 64;  // completion tokens [1, window]
  BootstrapOptions bootstrap;
};

// Paired Δτ = latest − previous under `options` (what specwire_checkpoint_delta_tau exports).
PairedComparison RegressionCheck(const CheckpointResult& previous, const CheckpointResult& latest,
                                 const RegressionOptions& options);

class TrainingMetrics {
 public:
  explicit TrainingMetrics(std::shared_ptr<prometheus::Registry> registry,
                           RegressionOptions regression = {});

  // A row from the database (start-up) or just recorded; `fresh`: scored by this process.
  void Record(const CheckpointResult& r, bool fresh);
  void WatchPolled();

 private:
  void UpdateLatest(const std::string& run, const std::string& dataset);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& tau_;
  prometheus::Family<prometheus::Gauge>& ddtree_tau_;
  prometheus::Family<prometheus::Gauge>& acceptance_;
  prometheus::Family<prometheus::Gauge>& failed_;
  prometheus::Family<prometheus::Gauge>& latest_step_;
  prometheus::Family<prometheus::Gauge>& latest_tau_;
  prometheus::Family<prometheus::Gauge>& previous_tau_;
  prometheus::Family<prometheus::Gauge>& latest_ddtree_tau_;
  prometheus::Family<prometheus::Gauge>& latest_acceptance_;
  prometheus::Family<prometheus::Gauge>& delta_tau_;
  prometheus::Family<prometheus::Gauge>& delta_prompts_;
  RegressionOptions regression_;
  prometheus::Family<prometheus::Counter>& evaluations_;
  prometheus::Counter& polls_;
  std::mutex mu_;
  // (run, dataset) → step → the ok rows, for the latest / previous / delta gauges.
  std::map<std::pair<std::string, std::string>, std::map<int64_t, CheckpointResult>> ok_;
};

}  // namespace specwire
