// Paired comparison of two scoring reports (specwire-score --compare A B): two drafters, two
// checkpoints, or a checkpoint and a baseline, on the same prompts and the same greedy
// trajectories. Δτ = τ_B − τ_A with a paired bootstrap interval (statistics.h), for DFlash, every
// DDTree budget both scored, and every completion-token window; the per-prompt scatter in the
// HTML page. Plain types only.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/scorer/report/report.h"
#include "services/scorer/acceptance/statistics.h"

namespace specwire {

// A report written by ReportToJson, read back (`name` is what errors call it: its path).
// INVALID_ARGUMENT naming the file and key on a document that is not one.
absl::StatusOr<ScoreReport> ReportFromJson(const std::string& text, const std::string& name);

struct WindowComparison {
  int64_t first_token = 0, last_token = 0;
  PairedComparison paired;
};

struct ComparisonReport {
  ScoreReport a, b;
  std::string name_a, name_b;  // labels shown (drafter labels, else the paths)
  BootstrapOptions bootstrap;
  PairedComparison dflash;
  // Budgets both reports scored with the same tree (summary.tree_method, depth, top-k).
  std::map<int32_t, PairedComparison> ddtree;
  std::vector<WindowComparison> windows;
  std::vector<int64_t> prompt_indices;  // the paired prompts, in order
  std::vector<std::string> notes;       // what was left out and why
};

// Pairs the prompts of `a` and `b` by index. FAILED_PRECONDITION when the two were not scored on
// the same target (weights, tokenizer, compute dtype), with different max_new_tokens or block
// sizes, or when a paired prompt's trajectory differs (its digest, or its token counts where a
// report has no digest): such numbers do not pair.
absl::StatusOr<ComparisonReport> CompareReports(ScoreReport a, ScoreReport b,
                                                const BootstrapOptions& bootstrap,
                                                int64_t token_window);

std::string ComparisonToJson(const ComparisonReport& c);
std::string ComparisonToHtml(const ComparisonReport& c);
std::string ComparisonTable(const ComparisonReport& c);
// Per-prompt τ_A (x) against τ_B (y), the diagonal drawn: id "paired-scatter".
std::string PairedScatterSvg(const ComparisonReport& c);
// Δτ with its interval for DFlash, each DDTree budget and each window: id "paired-delta".
std::string PairedDeltaSvg(const ComparisonReport& c);

}  // namespace specwire
