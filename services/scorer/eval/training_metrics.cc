#include "services/scorer/eval/training_metrics.h"

#include <algorithm>

#include "common/rpc/metric_families.h"

namespace specwire {

TrainingMetrics::TrainingMetrics(std::shared_ptr<prometheus::Registry> registry,
                                 RegressionOptions regression)
    : registry_(std::move(registry)),
      tau_(GaugeFamily(*registry_, "specwire_checkpoint_tau",
                       "Mean acceptance length τ of a drafter checkpoint on an eval set "
                       "(kind: mean_of_means = dflash's τ, pooled = tokens / steps).")),
      ddtree_tau_(GaugeFamily(*registry_, "specwire_checkpoint_ddtree_tau",
                              "DDTree-N τ (mean of means) of a drafter checkpoint.")),
      acceptance_(GaugeFamily(*registry_, "specwire_checkpoint_acceptance",
                              "Conditional acceptance at draft position k (1..B-1) of a "
                              "checkpoint.")),
      failed_(GaugeFamily(*registry_, "specwire_checkpoint_failed",
                          "1 when a checkpoint could not be scored (the error is in the results "
                          "database).")),
      latest_step_(GaugeFamily(*registry_, "specwire_checkpoint_latest_step",
                               "Highest training step of a run scored successfully.")),
      latest_tau_(GaugeFamily(*registry_, "specwire_checkpoint_latest_tau",
                              "τ (kind as specwire_checkpoint_tau) at the latest step of a run.")),
      previous_tau_(GaugeFamily(*registry_, "specwire_checkpoint_previous_tau",
                                "τ at the step before the latest one of a run.")),
      latest_ddtree_tau_(GaugeFamily(*registry_, "specwire_checkpoint_latest_ddtree_tau",
                                     "DDTree-N τ at the latest step of a run.")),
      latest_acceptance_(GaugeFamily(*registry_, "specwire_checkpoint_latest_acceptance",
                                     "Conditional per-position acceptance at the latest step of "
                                     "a run.")),
      delta_tau_(GaugeFamily(*registry_, "specwire_checkpoint_delta_tau",
                             "Paired Δτ = latest − previous checkpoint of a run on one eval set "
                             "(mean of means over the prompts with identical trajectories, steps "
                             "in the first window_tokens completion tokens); bound: estimate, lo, "
                             "hi of its bootstrap interval.")),
      delta_prompts_(GaugeFamily(*registry_, "specwire_checkpoint_delta_tau_prompts",
                                 "Prompts paired in specwire_checkpoint_delta_tau.")),
      regression_(regression),
      evaluations_(CounterFamily(*registry_, "specwire_checkpoint_evaluations_total",
                                 "Checkpoint scorings done by this process (one per checkpoint and "
                                 "eval set), by outcome.")),
      polls_(CounterFamily(*registry_, "specwire_watch_polls_total",
                           "Scans of the watched checkpoint directory.")
                 .Add({})) {}

namespace {

// Position k (0-based) was drafted by no step (known only when the counts were kept).
bool Unreached(const AcceptanceSummary& s, size_t k) {
  return k < s.per_position_reached.size() && s.per_position_reached[k] == 0;
}

}  // namespace

PairedComparison RegressionCheck(const CheckpointResult& previous, const CheckpointResult& latest,
                                 const RegressionOptions& options) {
  std::map<int64_t, const PromptSteps*> by_index;
  for (const PromptSteps& p : latest.prompts) by_index[p.prompt_index] = &p;
  const int64_t block = std::max(previous.summary.block_size, latest.summary.block_size);
  std::vector<std::vector<int32_t>> a, b;
  for (const PromptSteps& p : previous.prompts) {
    auto it = by_index.find(p.prompt_index);
    if (it == by_index.end()) continue;
    const PromptSteps& q = *it->second;
    const bool same = !p.trajectory_digest.empty() && p.trajectory_digest == q.trajectory_digest;
    // Different generation lengths: the steps that start in the window see the same context and
    // the same truth, and are not cut by either end, when both trajectories agree on (and
    // reach) the prompt, the window and one block more.
    const size_t need = static_cast<size_t>(p.prompt_tokens + options.window_tokens + block + 1);
    const bool same_prefix = p.prompt_tokens > 0 && p.prompt_tokens == q.prompt_tokens &&
                             p.trajectory.size() >= need && q.trajectory.size() >= need &&
                             std::equal(p.trajectory.begin(), p.trajectory.begin() + need,
                                        q.trajectory.begin());
    if (!same && !same_prefix) continue;
    a.push_back(StepsInTokenWindow(p.step_lengths, 1, options.window_tokens));
    b.push_back(StepsInTokenWindow(it->second->step_lengths, 1, options.window_tokens));
  }
  std::vector<const std::vector<int32_t>*> va, vb;
  for (size_t i = 0; i < a.size(); ++i) {
    va.push_back(&a[i]);
    vb.push_back(&b[i]);
  }
  return ComparePaired(va, vb, options.bootstrap);
}

void TrainingMetrics::WatchPolled() { polls_.Increment(); }

void TrainingMetrics::Record(const CheckpointResult& r, bool fresh) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fresh)
    evaluations_.Add({{"run", r.run}, {"dataset", r.dataset}, {"status", r.status}}).Increment();
  const std::string step = std::to_string(r.step);
  const std::map<std::string, std::string> key = {
      {"run", r.run}, {"step", step}, {"dataset", r.dataset}};
  if (r.status != "ok") {
    failed_.Add(key).Set(1);
    return;
  }
  if (failed_.Has(key)) failed_.Remove(&failed_.Add(key));
  auto with = [&](const char* name, const std::string& value) {
    auto labels = key;
    labels[name] = value;
    return labels;
  };
  tau_.Add(with("kind", "mean_of_means")).Set(r.summary.tau_mean_of_means);
  tau_.Add(with("kind", "pooled")).Set(r.summary.tau_pooled);
  for (const auto& [budget, tau] : r.summary.ddtree_tau) {
    ddtree_tau_.Add(with("budget", std::to_string(budget))).Set(tau.first);
  }
  for (size_t k = 0; k < r.summary.per_position_acceptance.size(); ++k) {
    if (Unreached(r.summary, k)) continue;  // no data is not a rate of 0
    acceptance_.Add(with("position", std::to_string(k + 1)))
        .Set(r.summary.per_position_acceptance[k]);
  }
  ok_[{r.run, r.dataset}][r.step] = r;
  UpdateLatest(r.run, r.dataset);
}

void TrainingMetrics::UpdateLatest(const std::string& run, const std::string& dataset) {
  const auto& steps = ok_[{run, dataset}];
  if (steps.empty()) return;
  int64_t latest_step = 0;
  for (const auto& [key, by_step] : ok_) {
    if (key.first == run && !by_step.empty()) {
      latest_step = std::max(latest_step, by_step.rbegin()->first);
    }
  }
  latest_step_.Add({{"run", run}}).Set(static_cast<double>(latest_step));
  const std::map<std::string, std::string> key = {{"run", run}, {"dataset", dataset}};
  auto with = [&](const char* name, const std::string& value) {
    auto labels = key;
    labels[name] = value;
    return labels;
  };
  const AcceptanceSummary& latest = steps.rbegin()->second.summary;
  latest_tau_.Add(with("kind", "mean_of_means")).Set(latest.tau_mean_of_means);
  latest_tau_.Add(with("kind", "pooled")).Set(latest.tau_pooled);
  for (const auto& [budget, tau] : latest.ddtree_tau) {
    latest_ddtree_tau_.Add(with("budget", std::to_string(budget))).Set(tau.first);
  }
  for (size_t k = 0; k < latest.per_position_acceptance.size(); ++k) {
    auto labels = with("position", std::to_string(k + 1));
    if (Unreached(latest, k)) {
      if (latest_acceptance_.Has(labels)) latest_acceptance_.Remove(&latest_acceptance_.Add(labels));
      continue;
    }
    latest_acceptance_.Add(labels).Set(latest.per_position_acceptance[k]);
  }
  if (steps.size() >= 2) {
    const CheckpointResult& previous_row = std::next(steps.rbegin())->second;
    const AcceptanceSummary& previous = previous_row.summary;
    previous_tau_.Add(with("kind", "mean_of_means")).Set(previous.tau_mean_of_means);
    previous_tau_.Add(with("kind", "pooled")).Set(previous.tau_pooled);
    const PairedComparison d =
        RegressionCheck(previous_row, steps.rbegin()->second, regression_);
    for (const char* bound : {"estimate", "lo", "hi"}) {
      auto labels = with("bound", bound);
      if (d.prompts == 0 || (!d.delta_ci && std::string(bound) != "estimate")) {
        if (delta_tau_.Has(labels)) delta_tau_.Remove(&delta_tau_.Add(labels));
        continue;
      }
      const double v = std::string(bound) == "estimate" ? d.delta
                       : std::string(bound) == "lo"     ? d.delta_ci->lo
                                                        : d.delta_ci->hi;
      delta_tau_.Add(labels).Set(v);
    }
    delta_prompts_.Add(key).Set(static_cast<double>(d.prompts));
  }
}

}  // namespace specwire
