// Reports of a scoring job: a JSON document (every summary field, per-prompt step lengths, the
// extraction contract, the drafter's config), a self-contained HTML page with three inline SVG
// charts (per-position acceptance, τ histogram over 1..B, DDTree budget curve; no external JS or
// CSS), and the text table specwire-score prints. Plain types only (no torch, no protobuf).
#pragma once

#include <string>
#include <vector>

#include "common/contract.h"
#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/job/score_job.h"

namespace specwire {

// What a report's numbers came from beyond the contract: digests of the inputs this side could
// read (empty where it could not: a dataset on the scorer's host).
struct ReportInputs {
  std::string dataset_digest;  // of --dataset or --prompts_file, xxh3-128 of its bytes
  std::string drafter_digest;  // CheckpointDigest of the drafter directory (config + weights)
};

struct ScoreReport {
  std::string mode;                     // "in-process" (extractors called directly) | "scorer"
  std::string endpoint;                 // the scorer's address, or the extractor spec
  std::vector<std::string> extractors;  // addresses that served the job (when known)
  // The request (prompts are reported per result, not repeated here).
  std::string drafter_path;
  std::string dataset_path;
  int64_t max_new_tokens = 0;
  int64_t max_prompts = 0;
  std::vector<int32_t> ddtree_budgets;
  ScoreLabels labels;
  ExtractionContract contract;
  // The drafter: `drafter` is complete in-process; through a scorer only path and config_json
  // (read where the client can see the directory) are known.
  bool drafter_loaded = false;
  DrafterSpec drafter;
  std::vector<PromptScore> prompts;  // by prompt index
  AcceptanceSummary summary;
  CapacityOptions capacity;  // the cost model of the capacity plan
  std::string chat_template_record;  // the prompts' (canonical JSON), "" when none
  ReportInputs inputs;
  double seconds = 0;
  std::string created;  // UTC, ISO 8601
};

std::string ReportToJson(const ScoreReport& report);
std::string ReportToHtml(const ScoreReport& report);
// The final table: τ (mean of means, pooled), DDTree-N τ, acceptance rate, per-position rates.
std::string SummaryTable(const ScoreReport& report);

// The charts, each one <svg> element (ids "per-position-acceptance", "tau-histogram",
// "ddtree-budget-curve", ...).
std::string PerPositionSvg(const AcceptanceSummary& s);
std::string TauHistogramSvg(const AcceptanceSummary& s);
std::string DDTreeCurveSvg(const AcceptanceSummary& s);
std::string TokenWindowSvg(const AcceptanceSummary& s);  // id "tau-by-token-window"
std::string CapacitySvg(const CapacityPlan& plan);       // id "capacity-speedup"

std::string HtmlEscape(const std::string& text);
// `v` with `digits` decimals ("%.*f").
std::string Fixed(double v, int digits);

// "τ 4.050 [3.912, 4.187]" pieces: " [lo, hi]" or "" without an interval.
std::string IntervalText(const std::optional<Interval>& ci, int digits);
// The settings every headline τ is printed beside: max_new_tokens, block size, dtype, prompts.
std::string SettingsText(const ScoreReport& report);
// The capacity plan of a report (statistics.h's PlanCapacity over its summary).
CapacityPlan ReportCapacity(const ScoreReport& report);

}  // namespace specwire
