// Reports of a scoring job: a JSON document (every summary field, per-prompt step lengths, the
// extraction contract, the drafter's config), a self-contained HTML page with three inline SVG
// charts (per-position acceptance, τ histogram over 1..B, DDTree budget curve; no external JS or
// CSS), and the text table specwire-score prints. Plain types only (no torch, no protobuf).
#pragma once

#include <string>
#include <vector>

#include "common/contract.h"
#include "services/scorer/acceptance.h"
#include "services/scorer/score_job.h"

namespace specwire {

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
  double seconds = 0;
  std::string created;  // UTC, ISO 8601
};

std::string ReportToJson(const ScoreReport& report);
std::string ReportToHtml(const ScoreReport& report);
// The final table: τ (mean of means, pooled), DDTree-N τ, acceptance rate, per-position rates.
std::string SummaryTable(const ScoreReport& report);

// The charts, each one <svg> element (ids "per-position-acceptance", "tau-histogram",
// "ddtree-budget-curve").
std::string PerPositionSvg(const AcceptanceSummary& s);
std::string TauHistogramSvg(const AcceptanceSummary& s);
std::string DDTreeCurveSvg(const AcceptanceSummary& s);

std::string HtmlEscape(const std::string& text);

}  // namespace specwire
