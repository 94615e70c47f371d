#include "services/scorer/report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace specwire {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

namespace {

using json = nlohmann::json;

// The drafter section: everything known about it, and its config.json as an object.
json DrafterJson(const ScoreReport& r) {
  json d;
  d["path"] = r.drafter_path.empty() ? r.drafter.path : r.drafter_path;
  json config = nullptr;
  if (!r.drafter.config_json.empty()) {
    config = json::parse(r.drafter.config_json, nullptr, false);
    if (config.is_discarded()) config = r.drafter.config_json;  // kept as text
  }
  d["config"] = config;
  d["loaded_by_scorer"] = r.drafter_loaded;
  if (r.drafter_loaded) {
    d["method"] = r.drafter.method;
    d["format"] = r.drafter.format;
    d["tree"] = r.drafter.tree;
    d["autoregressive"] = r.drafter.autoregressive;
    d["block_size"] = r.drafter.block_size;
    d["num_layers"] = r.drafter.num_layers;
    d["hidden_size"] = r.drafter.hidden_size;
    d["target_hidden_size"] = r.drafter.target_hidden_size;
    d["fc_in_features"] = r.drafter.fc_in_features;
    d["num_target_layers"] = r.drafter.num_target_layers;
    d["target_layer_ids"] = r.drafter.target_layer_ids;
    d["mask_token_id"] = r.drafter.mask_token_id;
    d["vocab_size"] = r.drafter.vocab_size;
    d["dtype"] = r.drafter.dtype;
    d["device"] = r.drafter.device;
  } else {
    d["block_size"] = r.summary.block_size;
    if (!r.drafter.method.empty()) d["method"] = r.drafter.method;
    if (!r.drafter.format.empty()) d["format"] = r.drafter.format;
    if (!r.drafter.dtype.empty()) d["dtype"] = r.drafter.dtype;
    if (!r.drafter.device.empty()) d["device"] = r.drafter.device;
  }
  return d;
}

// --- SVG ---------------------------------------------------------------------------------------

constexpr int kW = 640, kH = 300;
constexpr int kLeft = 56, kRight = 16, kTop = 42, kBottom = 46;
constexpr int kPlotW = kW - kLeft - kRight, kPlotH = kH - kTop - kBottom;

std::string SvgOpen(const std::string& id, const std::string& title) {
  return absl::StrCat("<svg id=\"", id, "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"", kW,
                      "\" height=\"", kH, "\" viewBox=\"0 0 ", kW, " ", kH,
                      "\" role=\"img\" aria-label=\"", HtmlEscape(title), "\">\n<title>",
                      HtmlEscape(title), "</title>\n<rect x=\"0\" y=\"0\" width=\"", kW,
                      "\" height=\"", kH, "\" fill=\"#ffffff\"/>\n<text x=\"", kW / 2,
                      "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">",
                      HtmlEscape(title), "</text>\n");
}

// Y axis with 5 gridlines from 0 to y_max, and the axis titles.
std::string Axes(double y_max, const std::string& y_label, const std::string& x_label,
                 int y_digits) {
  std::string s;
  for (int i = 0; i <= 4; ++i) {
    const double v = y_max * i / 4.0;
    const double y = kTop + kPlotH - kPlotH * i / 4.0;
    absl::StrAppend(&s, "<line x1=\"", kLeft, "\" x2=\"", kLeft + kPlotW, "\" y1=\"", Fixed(y, 1),
                    "\" y2=\"", Fixed(y, 1), "\" stroke=\"#dddddd\"/>\n<text x=\"", kLeft - 6,
                    "\" y=\"", Fixed(y + 4, 1), "\" text-anchor=\"end\" font-size=\"11\">",
                    Fixed(v, y_digits), "</text>\n");
  }
  absl::StrAppend(&s, "<line x1=\"", kLeft, "\" x2=\"", kLeft, "\" y1=\"", kTop, "\" y2=\"",
                  kTop + kPlotH, "\" stroke=\"#333333\"/>\n<line x1=\"", kLeft, "\" x2=\"",
                  kLeft + kPlotW, "\" y1=\"", kTop + kPlotH, "\" y2=\"", kTop + kPlotH,
                  "\" stroke=\"#333333\"/>\n");
  absl::StrAppend(&s, "<text x=\"", kLeft + kPlotW / 2, "\" y=\"", kH - 8,
                  "\" text-anchor=\"middle\" font-size=\"12\">", HtmlEscape(x_label), "</text>\n");
  absl::StrAppend(&s, "<text x=\"14\" y=\"", kTop + kPlotH / 2,
                  "\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 14 ",
                  kTop + kPlotH / 2, ")\">", HtmlEscape(y_label), "</text>\n");
  return s;
}

struct Bar {
  Bar(std::string l, double v, std::string t, std::string vl)
      : label(std::move(l)), value(v), tooltip(std::move(t)), value_label(std::move(vl)) {}
  std::string label;
  double value = 0;
  std::string tooltip;
  std::string value_label;  // printed above the bar when there are few bars
  std::optional<Interval> ci;  // drawn as a whisker
  bool no_data = false;        // drawn as a "no data" mark instead of a bar
};

std::string BarChart(const std::string& id, const std::string& title, const std::vector<Bar>& bars,
                     double y_max, const std::string& y_label, const std::string& x_label,
                     int y_digits, const std::string& color) {
  std::string s = SvgOpen(id, title);
  if (y_max <= 0) y_max = 1;
  absl::StrAppend(&s, Axes(y_max, y_label, x_label, y_digits));
  const double slot = bars.empty() ? kPlotW : static_cast<double>(kPlotW) / bars.size();
  const double width = std::max(1.0, slot * 0.75);
  // Label every k-th bar so labels never collide.
  const size_t every = std::max<size_t>(1, static_cast<size_t>(std::ceil(bars.size() / 32.0)));
  for (size_t i = 0; i < bars.size(); ++i) {
    const double v = std::clamp(bars[i].value, 0.0, y_max);
    const double h = kPlotH * v / y_max;
    const double x = kLeft + slot * i + (slot - width) / 2;
    const double y = kTop + kPlotH - h;
    if (bars[i].no_data) {
      absl::StrAppend(&s, "<text class=\"no-data\" x=\"", Fixed(x + width / 2, 1), "\" y=\"",
                      kTop + kPlotH - 6, "\" text-anchor=\"middle\" font-size=\"9\" "
                      "fill=\"#999999\">n/a<title>", HtmlEscape(bars[i].tooltip),
                      "</title></text>\n");
    } else {
      absl::StrAppend(&s, "<rect class=\"bar\" x=\"", Fixed(x, 1), "\" y=\"", Fixed(y, 1),
                      "\" width=\"", Fixed(width, 1), "\" height=\"", Fixed(h, 1),
                      "\" fill=\"", color, "\"><title>", HtmlEscape(bars[i].tooltip),
                      "</title></rect>\n");
    }
    if (bars[i].ci) {
      auto y_of = [&](double v) { return kTop + kPlotH - kPlotH * std::clamp(v, 0.0, y_max) / y_max; };
      const double cx = x + width / 2, y_lo = y_of(bars[i].ci->lo), y_hi = y_of(bars[i].ci->hi);
      const double cap = std::min(6.0, width / 3);
      absl::StrAppend(&s, "<path class=\"ci\" d=\"M", Fixed(cx, 1), " ", Fixed(y_lo, 1), "V",
                      Fixed(y_hi, 1), "M", Fixed(cx - cap, 1), " ", Fixed(y_lo, 1), "H",
                      Fixed(cx + cap, 1), "M", Fixed(cx - cap, 1), " ", Fixed(y_hi, 1), "H",
                      Fixed(cx + cap, 1), "\" stroke=\"#222222\" stroke-width=\"1.2\" "
                      "fill=\"none\"/>\n");
    }
    if (bars.size() <= 32 && !bars[i].value_label.empty()) {
      absl::StrAppend(&s, "<text x=\"", Fixed(x + width / 2, 1), "\" y=\"", Fixed(y - 4, 1),
                      "\" text-anchor=\"middle\" font-size=\"10\" fill=\"#444444\">",
                      HtmlEscape(bars[i].value_label), "</text>\n");
    }
    if (i % every == 0) {
      absl::StrAppend(&s, "<text x=\"", Fixed(x + width / 2, 1), "\" y=\"", kTop + kPlotH + 14,
                      "\" text-anchor=\"middle\" font-size=\"11\">", HtmlEscape(bars[i].label),
                      "</text>\n");
    }
  }
  if (bars.empty()) {
    absl::StrAppend(&s, "<text x=\"", kLeft + kPlotW / 2, "\" y=\"", kTop + kPlotH / 2,
                    "\" text-anchor=\"middle\" font-size=\"12\">no data</text>\n");
  }
  absl::StrAppend(&s, "</svg>\n");
  return s;
}

// An axis top at or above v whose quarter gridlines fall on round integers: 4 × a step of
// 1, 2 or 5 × 10^k.
double NiceCeil(double v) {
  const double quarter = std::max(v / 4.0, 1.0);
  const double p = std::pow(10.0, std::floor(std::log10(quarter)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= quarter) return 4 * m * p;
  }
  return 40 * p;
}

}  // namespace

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string IntervalText(const std::optional<Interval>& ci, int digits) {
  if (!ci) return "";
  return absl::StrCat(" [", Fixed(ci->lo, digits), ", ", Fixed(ci->hi, digits), "]");
}

// "" when the target and the drafter compute in one dtype (or one is unknown); else the note
// every report prints: τ measured under two precisions is not the τ of either.
std::string DtypeNote(const ScoreReport& r) {
  const std::string& target = r.contract.compute_dtype;
  const std::string& drafter = r.drafter.dtype;
  if (target.empty() || drafter.empty() || target == drafter) return "";
  return absl::StrCat("the target computes in ", target, " (the extractor's --dtype) and the "
                      "drafter in ", drafter, " (the scorer's --dtype): this τ compares with runs "
                      "under the same pair only");
}

std::string SettingsText(const ScoreReport& r) {
  const AcceptanceSummary& s = r.summary;
  std::string dtype = r.contract.compute_dtype.empty() ? "?" : r.contract.compute_dtype;
  if (!r.drafter.dtype.empty() && r.drafter.dtype != dtype) {
    absl::StrAppend(&dtype, " target / ", r.drafter.dtype, " drafter");
  }
  std::string t = absl::StrCat("max_new_tokens ", r.max_new_tokens, ", block size ", s.block_size,
                               ", dtype ", dtype, ", ", s.responses, " prompts");
  if (s.options.bootstrap.resamples > 0) {
    absl::StrAppend(&t, "; ", Fixed(100 * s.options.bootstrap.confidence, 0),
                    "% bootstrap intervals over prompts (", s.options.bootstrap.resamples,
                    " resamples, seed ", s.options.bootstrap.seed, ")");
  }
  return t;
}

CapacityPlan ReportCapacity(const ScoreReport& r) {
  std::map<int32_t, double> pooled;
  for (const auto& [b, tau] : r.summary.ddtree_tau) pooled[b] = tau.second;
  CapacityOptions options = r.capacity;
  // A chain drafts autoregressively: one drafter forward per draft, and per tree level.
  if (r.drafter.autoregressive || r.summary.tree_method == kTreeEagle) options.autoregressive = true;
  const int32_t tree_forwards =
      r.summary.tree_method == kTreeEagle ? std::max(1, r.summary.tree_depth) : 1;
  return PlanCapacity(r.summary.steps, r.summary.num_accepted_tokens_per_pos, pooled, options,
                      tree_forwards);
}

std::string PerPositionSvg(const AcceptanceSummary& s) {
  std::vector<Bar> bars;
  for (size_t k = 0; k < s.per_position_acceptance.size(); ++k) {
    const int64_t accepted =
        k < s.num_accepted_tokens_per_pos.size() ? s.num_accepted_tokens_per_pos[k] : 0;
    const int64_t reached = k < s.per_position_reached.size() ? s.per_position_reached[k] : 0;
    Bar b{std::to_string(k + 1), s.per_position_acceptance[k],
          absl::StrCat("position ", k + 1, ": ",
                       reached ? Fixed(s.per_position_acceptance[k], 3) : "no data", " (",
                       accepted, " of ", reached, " reached)"),
          reached ? Fixed(s.per_position_acceptance[k], 2) : ""};
    b.no_data = reached == 0;
    bars.push_back(b);
  }
  return BarChart("per-position-acceptance",
                  "Per-position acceptance (conditional on the earlier positions)", bars, 1.0,
                  "P(accepted | earlier accepted)", "draft position", 2, "#4c78a8");
}

std::string TokenWindowSvg(const AcceptanceSummary& s) {
  std::vector<Bar> bars;
  for (const TokenWindow& w : s.windows) {
    Bar b{absl::StrCat(w.first_token, "-", w.last_token), w.tau.mean_of_means,
          absl::StrCat("completion tokens ", w.first_token, "-", w.last_token, ": tau ",
                       w.tau.steps ? Fixed(w.tau.mean_of_means, 3) : "no data",
                       IntervalText(w.tau.mean_of_means_ci, 3), " over ", w.tau.responses,
                       " prompts, ", w.tau.steps, " steps"),
          w.tau.steps ? Fixed(w.tau.mean_of_means, 2) : ""};
    b.ci = w.tau.mean_of_means_ci;
    b.no_data = w.tau.steps == 0;
    bars.push_back(b);
  }
  return BarChart("tau-by-token-window", "τ by completion-token window (mean of means, 95% CI)",
                  bars, std::max(1, s.block_size), "τ (tokens per step)",
                  "completion tokens (window of the step's first token)", 1, "#72b7b2");
}

std::string CapacitySvg(const CapacityPlan& plan) {
  std::vector<Bar> bars;
  double top = 1;
  for (const CapacityRow& row : plan.draft_lengths) {
    bars.push_back({std::to_string(row.k), row.speedup,
                    absl::StrCat("k = ", row.k, ": ", Fixed(row.expected_tokens, 3),
                                 " tokens per step, cost ", Fixed(row.step_cost, 3),
                                 ", speed-up ", Fixed(row.speedup, 3)),
                    Fixed(row.speedup, 2)});
    top = std::max(top, row.speedup);
  }
  return BarChart("capacity-speedup", "Expected speed-up by draft length k (cost model below)",
                  bars, std::ceil(top + 0.25), "speed-up over plain decoding",
                  "draft tokens per step (k)", 1, "#b279a2");
}

std::string TauHistogramSvg(const AcceptanceSummary& s) {
  std::vector<Bar> bars;
  int64_t top = 0;
  for (int64_t c : s.histogram) top = std::max(top, c);
  for (size_t i = 0; i < s.histogram.size(); ++i) {
    const double share = s.steps ? static_cast<double>(s.histogram[i]) / s.steps : 0.0;
    bars.push_back({std::to_string(i + 1), static_cast<double>(s.histogram[i]),
                    absl::StrCat("length ", i + 1, ": ", s.histogram[i], " steps (",
                                 Fixed(100 * share, 1), "%)"),
                    std::to_string(s.histogram[i])});
  }
  return BarChart(
      "tau-histogram", absl::StrCat("Acceptance length per step (1..", s.block_size, ")"), bars,
      NiceCeil(static_cast<double>(top)), "steps", "tokens per step (a + 1)", 0, "#f58518");
}

std::string DDTreeCurveSvg(const AcceptanceSummary& s) {
  const std::string title = s.tree_method == kTreeEagle
                                ? absl::StrCat("EAGLE tree (depth ", s.tree_depth, ", top-k ",
                                               s.tree_top_k, "): τ by node budget")
                                : "DDTree-N: τ by node budget";
  std::string out = SvgOpen("ddtree-budget-curve", title);
  double y_max = std::max(1.0, s.tau_mean_of_means);
  for (const auto& [b, tau] : s.ddtree_tau) y_max = std::max({y_max, tau.first, tau.second});
  y_max = std::ceil(y_max + 0.5);
  absl::StrAppend(&out, Axes(y_max, "τ (tokens per step)", "node budget N (log scale)", 1));
  auto y_of = [&](double v) { return kTop + kPlotH - kPlotH * std::clamp(v, 0.0, y_max) / y_max; };
  // DFlash (a single block of B − 1 drafts) as the reference line.
  const double yd = y_of(s.tau_mean_of_means);
  absl::StrAppend(&out, "<line class=\"dflash\" x1=\"", kLeft, "\" x2=\"", kLeft + kPlotW,
                  "\" y1=\"", Fixed(yd, 1), "\" y2=\"", Fixed(yd, 1),
                  "\" stroke=\"#888888\" stroke-dasharray=\"6 4\"/>\n<text x=\"", kLeft + 6,
                  "\" y=\"", Fixed(yd - 5, 1),
                  "\" text-anchor=\"start\" font-size=\"11\" fill=\"#555555\">chain τ ",
                  Fixed(s.tau_mean_of_means, 2), "</text>\n");
  if (s.ddtree_tau.empty()) {
    absl::StrAppend(
        &out, "<text x=\"", kLeft + kPlotW / 2, "\" y=\"", kTop + kPlotH / 2,
        "\" text-anchor=\"middle\" font-size=\"12\">no tree budgets scored</text>\n</svg>\n");
    return out;
  }
  const double lo = std::log2(static_cast<double>(s.ddtree_tau.begin()->first));
  const double hi = std::log2(static_cast<double>(s.ddtree_tau.rbegin()->first));
  // Points start right of the DFlash label.
  auto x_of = [&](int32_t b) {
    if (hi <= lo) return kLeft + kPlotW / 2.0;
    return kLeft + 110 + (kPlotW - 130) * (std::log2(static_cast<double>(b)) - lo) / (hi - lo);
  };
  std::string points;
  for (const auto& [b, tau] : s.ddtree_tau) {
    absl::StrAppend(&points, points.empty() ? "" : " ", Fixed(x_of(b), 1), ",",
                    Fixed(y_of(tau.first), 1));
  }
  absl::StrAppend(&out, "<polyline points=\"", points,
                  "\" fill=\"none\" stroke=\"#54a24b\" stroke-width=\"2\"/>\n");
  for (const auto& [b, tau] : s.ddtree_tau) {
    const double x = x_of(b), y = y_of(tau.first);
    absl::StrAppend(
        &out, "<circle class=\"point\" cx=\"", Fixed(x, 1), "\" cy=\"", Fixed(y, 1),
        "\" r=\"4\" fill=\"#54a24b\"><title>", TreeLabel(s.tree_method, b), ": τ ",
        Fixed(tau.first, 3), " (pooled ",
        Fixed(tau.second, 3), ")</title></circle>\n<text x=\"", Fixed(x, 1), "\" y=\"",
        kTop + kPlotH + 14, "\" text-anchor=\"middle\" font-size=\"11\">", b, "</text>\n<text x=\"",
        Fixed(x, 1), "\" y=\"", Fixed(y - 8, 1), "\" text-anchor=\"middle\" font-size=\"11\">",
        Fixed(tau.first, 2), "</text>\n");
  }
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

std::string ReportToJson(const ScoreReport& r) {
  json j;
  j["specwire_version"] = SPECWIRE_VERSION;
  j["created"] = r.created;
  j["mode"] = r.mode;
  j["endpoint"] = r.endpoint;
  j["extractors"] = r.extractors;
  j["labels"] = {
      {"drafter", r.labels.drafter}, {"dataset", r.labels.dataset}, {"method", r.labels.method}};
  j["request"] = {{"drafter_path", r.drafter_path},
                  {"dataset_path", r.dataset_path},
                  {"max_new_tokens", r.max_new_tokens},
                  {"max_prompts", r.max_prompts},
                  {"ddtree_budgets", r.ddtree_budgets}};
  j["contract"] = json::parse(ContractToJson(r.contract));
  j["chat_template"] =
      r.chat_template_record.empty() ? json(nullptr) : json::parse(r.chat_template_record);
  j["drafter"] = DrafterJson(r);
  // Everything the numbers depend on, in one place (what a results table row cites).
  j["provenance"] = json::parse(ScoreProvenanceJson(r.contract, r.drafter.dtype,
                                                    r.chat_template_record,
                                                    r.inputs.dataset_digest,
                                                    r.inputs.drafter_digest));
  j["summary"] = json::parse(AcceptanceSummaryToJson(r.summary));
  j["settings"] = {{"max_new_tokens", r.max_new_tokens},
                   {"block_size", r.summary.block_size},
                   {"target_dtype", r.contract.compute_dtype},
                   {"drafter_dtype", r.drafter.dtype},
                   {"dtype_note", DtypeNote(r)},
                   {"prompts", r.summary.responses},
                   {"text", SettingsText(r)}};
  const CapacityPlan plan = ReportCapacity(r);
  json rows = json::array(), trees = json::array();
  for (const CapacityRow& row : plan.draft_lengths) {
    rows.push_back({{"k", row.k},
                    {"expected_tokens_per_step", row.expected_tokens},
                    {"step_cost", row.step_cost},
                    {"speedup", row.speedup}});
  }
  for (const CapacityRow& row : plan.tree_budgets) {
    trees.push_back({{"budget", row.k},
                     {"expected_tokens_per_step", row.expected_tokens},
                     {"step_cost", row.step_cost},
                     {"speedup", row.speedup}});
  }
  j["capacity"] = {
      {"cost_model",
       {{"drafter_cost", plan.options.drafter_cost},
        {"verify_cost_per_token", plan.options.verify_cost_per_token},
        {"autoregressive", plan.options.autoregressive},
        {"step_cost", "1 + verify_cost_per_token * k + drafter_cost * (autoregressive ? k : 1), "
                      "in target decode forwards"}}},
      {"unconditional_acceptance", plan.unconditional},
      {"draft_lengths", rows},
      {"tree_budgets", trees},
      {"recommended_k", plan.recommended_k},
      {"recommended_speedup", plan.recommended_speedup},
      {"vllm_speculative_config",
       plan.recommended_k > 0 ? json::parse(VllmSyntheticConfigJson(plan, plan.recommended_k))
                              : json(nullptr)}};
  json prompts = json::array();
  for (const PromptScore& p : r.prompts) {
    json dd = json::object();
    for (const auto& [b, lengths] : p.acceptance.ddtree_step_lengths)
      dd[std::to_string(b)] = lengths;
    json entry = {{"prompt_index", p.prompt_index},
                  {"prompt_tokens", p.acceptance.prompt_tokens},
                  {"completion_tokens", p.acceptance.completion_tokens},
                  {"finish_reason", p.finish_reason},
                  {"trajectory_digest", p.trajectory_digest},
                  // No steps (the first completion token was a stop token): no τ.
                  {"tau", p.acceptance.step_lengths.empty() ? json(nullptr) : json(p.tau)},
                  {"step_lengths", p.acceptance.step_lengths},
                  {"ddtree_step_lengths", dd}};
    // What the target answered (absent for a prompt resumed from a results journal).
    if (std::vector<int64_t> c = CompletionTokens(p); !c.empty()) {
      entry["completion_token_ids"] = std::move(c);
    }
    if (const std::optional<PredictedAcceptance>& pa = p.acceptance.predicted) {
      json cuts = json::array();
      for (const auto& [cutoff, lengths] : pa->cut_step_lengths) {
        cuts.push_back({{"cutoff", cutoff}, {"step_lengths", lengths}});
      }
      entry["predicted_acceptance"] = {
          {"accepted", pa->accepted}, {"predicted", pa->predicted}, {"cutoffs", cuts}};
    }
    prompts.push_back(std::move(entry));
  }
  j["prompts"] = prompts;
  j["seconds"] = r.seconds;
  return j.dump(2) + "\n";
}

std::string SummaryTable(const ScoreReport& r) {
  const AcceptanceSummary& s = r.summary;
  std::string t;
  absl::StrAppend(&t, "drafter ", r.labels.drafter, " | dataset ", r.labels.dataset, " | method ",
                  r.labels.method, "\n");
  absl::StrAppend(&t, "target  ", r.contract.architecture, " (", r.contract.num_layers,
                  " layers, hidden ", r.contract.hidden_size, ", ", r.contract.compute_dtype,
                  ")\n");
  absl::StrAppend(&t, "prompts ", s.responses, ", steps ", s.steps, ", block size ", s.block_size,
                  "\n");
  absl::StrAppend(&t, "settings: ", SettingsText(r), "\n");
  if (const std::string note = DtypeNote(r); !note.empty()) absl::StrAppend(&t, "note: ", note, "\n");
  absl::StrAppend(&t, "\n");
  auto row = [&](const std::string& name, const std::string& value) {
    std::string padded = name;
    padded.resize(std::max<size_t>(padded.size(), 28), ' ');
    absl::StrAppend(&t, "  ", padded, value, "\n");
  };
  row("tau (mean of means)",
      absl::StrCat(Fixed(s.tau_mean_of_means, 3), IntervalText(s.tau_mean_of_means_ci, 3)));
  row("tau (pooled)", absl::StrCat(Fixed(s.tau_pooled, 3), IntervalText(s.tau_pooled_ci, 3)));
  for (const auto& [b, tau] : s.ddtree_tau) {
    auto ci = s.ddtree_tau_ci.find(b);
    const bool has = ci != s.ddtree_tau_ci.end();
    row(absl::StrCat(TreeLabel(s.tree_method, b), " tau"),
        absl::StrCat(Fixed(tau.first, 3), has ? IntervalText(ci->second.first, 3) : "",
                     "  (pooled ", Fixed(tau.second, 3),
                     has ? IntervalText(ci->second.second, 3) : "", ")"));
  }
  row("acceptance rate", absl::StrCat(Fixed(s.acceptance_rate, 4), "  (", s.num_accepted_tokens,
                                      " / ", s.num_draft_tokens, " draft tokens)"));
  if (s.live) {
    const LiveSummary& l = *s.live;
    row("loop", absl::StrCat("live (", l.rule, ", T ", Fixed(l.setting.temperature, 2),
                             " top_p ", Fixed(l.setting.top_p, 2), " top_k ", l.setting.top_k,
                             ", seed ", l.seed, "): ", l.verify_calls, " verifications, drafter ",
                             Fixed(l.drafter_seconds, 2), " s, target ",
                             Fixed(l.target_seconds, 2), " s"));
    if (l.self_check_prompts > 0) {
      row("live = replay (self-check)",
          absl::StrCat(l.self_check_matching, " of ", l.self_check_prompts,
                       " prompts step for step",
                       l.self_check_mismatches.empty()
                           ? ""
                           : absl::StrCat("; differ: ", absl::StrJoin(l.self_check_mismatches,
                                                                      ", "))));
    }
  }
  absl::StrAppend(&t, "\n  per-position acceptance (conditional; accepted / reached)\n");
  for (size_t k = 0; k < s.per_position_acceptance.size(); ++k) {
    const int64_t reached = k < s.per_position_reached.size() ? s.per_position_reached[k] : 0;
    const int64_t accepted =
        k < s.num_accepted_tokens_per_pos.size() ? s.num_accepted_tokens_per_pos[k] : 0;
    char line[96];
    if (reached == 0) {
      std::snprintf(line, sizeof(line), "    pos %2zu  no data (0 / 0)\n", k + 1);
      absl::StrAppend(&t, line);
      continue;
    }
    const double p = s.per_position_acceptance[k];
    std::string bar(static_cast<size_t>(std::lround(std::clamp(p, 0.0, 1.0) * 40)), '#');
    std::snprintf(line, sizeof(line), "    pos %2zu  %.4f  %-16s", k + 1, p,
                  absl::StrCat("(", accepted, " / ", reached, ")").c_str());
    absl::StrAppend(&t, line, bar, "\n");
  }
  if (!s.windows.empty()) {
    absl::StrAppend(&t, "\n  tau by completion-token window (step's first token)\n");
    for (const TokenWindow& w : s.windows) {
      char line[160];
      std::snprintf(line, sizeof(line), "    tokens %5lld-%-5lld  ",
                    static_cast<long long>(w.first_token), static_cast<long long>(w.last_token));
      absl::StrAppend(&t, line,
                      w.tau.steps ? absl::StrCat(Fixed(w.tau.mean_of_means, 3),
                                                 IntervalText(w.tau.mean_of_means_ci, 3))
                                  : "no data",
                      "  (", w.tau.responses, " prompts, ", w.tau.steps, " steps)\n");
    }
  }
  if (!s.temperature.empty()) {
    absl::StrAppend(&t, "\n  teacher-forced acceptance at T > 0 (tau_prob = 1 + sum_i prod_j<=i "
                        "alpha_j; assumes every position is verified on the trajectory's "
                        "context)\n");
    for (const TemperatureSummary& x : s.temperature) {
      absl::StrAppend(&t, "    T ", Fixed(x.setting.temperature, 2), " top_p ",
                      Fixed(x.setting.top_p, 2), " top_k ", x.setting.top_k, "  ", x.rule,
                      ": tau_prob ", Fixed(x.tau_prob, 3), IntervalText(x.tau_prob_ci, 3),
                      "  (pooled ", Fixed(x.tau_prob_pooled, 3), ", ", x.blocks, " blocks)\n");
    }
  }
  if (s.predicted_acceptance) {
    const PredictedAcceptanceSummary& p = *s.predicted_acceptance;
    absl::StrAppend(&t, "\n  predicted acceptance (the drafter's confidence head) against the "
                        "observed, per draft position (blocks that reached it)\n");
    for (const CalibrationRow& row : p.calibration) {
      char line[128];
      std::snprintf(line, sizeof(line),
                    "    pos %2d  predicted %.4f  observed %.4f  gap %+.4f  (%lld blocks)\n",
                    row.position, row.predicted, row.observed, row.predicted - row.observed,
                    static_cast<long long>(row.blocks));
      absl::StrAppend(&t, line);
    }
    for (const CutoffTau& c : p.cutoffs) {
      absl::StrAppend(&t, "    verify while predicted survival >= ", Fixed(c.cutoff, 2),
                      ": tau ", Fixed(c.tau.mean_of_means, 3),
                      IntervalText(c.tau.mean_of_means_ci, 3), "  (pooled ",
                      Fixed(c.tau.pooled, 3), ", ", c.tau.steps, " steps)\n");
    }
  }
  const CapacityPlan plan = ReportCapacity(r);
  if (plan.recommended_k > 0) {
    absl::StrAppend(&t, "\n  capacity: recommended k = ", plan.recommended_k, " draft tokens (",
                    Fixed(plan.draft_lengths[plan.recommended_k - 1].expected_tokens, 3),
                    " tokens per step, speed-up ", Fixed(plan.recommended_speedup, 3),
                    " at drafter cost ", Fixed(plan.options.drafter_cost, 3),
                    ", verify cost per token ", Fixed(plan.options.verify_cost_per_token, 3),
                    ")\n  vLLM: --speculative-config '",
                    VllmSyntheticConfigJson(plan, plan.recommended_k), "'\n");
  }
  return t;
}

std::string ReportToHtml(const ScoreReport& r) {
  const AcceptanceSummary& s = r.summary;
  const std::string title =
      absl::StrCat("specwire score: ", r.labels.drafter, " on ", r.labels.dataset);
  std::string h;
  absl::StrAppend(
      &h, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
      HtmlEscape(title), "</title>\n<style>\n",
      "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}\n",
      "table{border-collapse:collapse;margin:0.5em 0 1.5em}\n",
      "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}\n",
      "th{background:#f3f3f3}\n td.num{text-align:right;font-variant-numeric:tabular-nums}\n",
      "figure{margin:1em 0}\n pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:12px}\n",
      ".steps{font-family:monospace;font-size:11px;word-break:break-all}\n",
      "</style>\n</head>\n<body>\n<h1>", HtmlEscape(title), "</h1>\n");
  absl::StrAppend(&h, "<p>", HtmlEscape(r.created), " &middot; ", HtmlEscape(r.mode), " (",
                  HtmlEscape(r.endpoint), ") &middot; method ", HtmlEscape(r.labels.method),
                  " &middot; specwire ", SPECWIRE_VERSION, "</p>\n");

  auto kv = [](const std::string& k, const std::string& v) {
    return absl::StrCat("<tr><th>", HtmlEscape(k), "</th><td class=\"num\">", HtmlEscape(v),
                        "</td></tr>\n");
  };
  absl::StrAppend(&h, "<p id=\"settings\"><strong>Settings:</strong> ",
                  HtmlEscape(SettingsText(r)), "</p>\n");
  absl::StrAppend(&h, "<section id=\"summary\">\n<h2>Summary</h2>\n<table>\n",
                  "<tr><th></th><th>value</th><th>95% interval</th></tr>\n");
  auto kci = [](const std::string& k, const std::string& v, const std::optional<Interval>& ci) {
    return absl::StrCat("<tr><th>", HtmlEscape(k), "</th><td class=\"num\">", HtmlEscape(v),
                        "</td><td class=\"num ci\">",
                        ci ? HtmlEscape(absl::StrCat(Fixed(ci->lo, 4), " – ", Fixed(ci->hi, 4)))
                           : "",
                        "</td></tr>\n");
  };
  absl::StrAppend(&h, kci("τ (mean of means)", Fixed(s.tau_mean_of_means, 4), s.tau_mean_of_means_ci),
                  kci("τ (pooled)", Fixed(s.tau_pooled, 4), s.tau_pooled_ci));
  for (const auto& [b, tau] : s.ddtree_tau) {
    auto ci = s.ddtree_tau_ci.find(b);
    const bool has = ci != s.ddtree_tau_ci.end();
    absl::StrAppend(&h,
                    kci(absl::StrCat(TreeLabel(s.tree_method, b), " τ (mean of means)"),
                        Fixed(tau.first, 4),
                        has ? ci->second.first : std::nullopt),
                    kci(absl::StrCat(TreeLabel(s.tree_method, b), " τ (pooled)"),
                        Fixed(tau.second, 4),
                        has ? ci->second.second : std::nullopt));
  }
  for (const TemperatureSummary& x : s.temperature) {
    absl::StrAppend(&h, kci(absl::StrCat("τ_prob T=", Fixed(x.setting.temperature, 2),
                                         " top_p=", Fixed(x.setting.top_p, 2), " top_k=",
                                         x.setting.top_k, " (", x.rule, ")"),
                            Fixed(x.tau_prob, 4), x.tau_prob_ci));
  }
  auto kv3 = [&](const std::string& k, const std::string& v) { return kci(k, v, std::nullopt); };
  absl::StrAppend(
      &h, kv3("responses", std::to_string(s.responses)), kv3("steps", std::to_string(s.steps)),
      kv3("block size", std::to_string(s.block_size)),
      kv3("drafts (num_drafts)", std::to_string(s.num_drafts)),
      kv3("draft tokens (num_draft_tokens)", std::to_string(s.num_draft_tokens)),
      kv3("accepted tokens (num_accepted_tokens)", std::to_string(s.num_accepted_tokens)),
      kv3("acceptance rate", Fixed(s.acceptance_rate, 4)),
      kv3("max_new_tokens", std::to_string(r.max_new_tokens)),
      kv3("seconds", Fixed(r.seconds, 2)));
  absl::StrAppend(&h, "</table>\n</section>\n");

  absl::StrAppend(&h, "<section id=\"charts\">\n<h2>Charts</h2>\n<figure>\n", PerPositionSvg(s),
                  "<figcaption>P(draft position k accepted | positions &lt; k "
                  "accepted); n/a: no step reached the position.</figcaption>\n</figure>\n",
                  "<figure>\n", TauHistogramSvg(s),
                  "<figcaption>Steps by committed tokens (accepted drafts + the bonus "
                  "token).</figcaption>\n</figure>\n",
                  "<figure>\n", DDTreeCurveSvg(s),
                  "<figcaption>", s.tree_method == kTreeEagle ? "EAGLE's top-k tree" : "DDTree-N",
                  " τ (mean of means) per node budget; dashed: the chain's "
                  "τ.</figcaption>\n</figure>\n",
                  "</section>\n");

  absl::StrAppend(&h, "<section id=\"per-position\">\n<h2>Per-position acceptance</h2>\n<table>\n",
                  "<tr><th>draft position</th><th>conditional acceptance</th><th>accepted "
                  "(num_accepted_tokens_per_pos)</th><th>reached</th><th>P(a ≥ k)</th></tr>\n");
  for (size_t k = 0; k < s.per_position_acceptance.size(); ++k) {
    const int64_t reached = k < s.per_position_reached.size() ? s.per_position_reached[k] : 0;
    const int64_t accepted =
        k < s.num_accepted_tokens_per_pos.size() ? s.num_accepted_tokens_per_pos[k] : 0;
    absl::StrAppend(&h, "<tr><td class=\"num\">", k + 1, "</td><td class=\"num\">",
                    reached ? Fixed(s.per_position_acceptance[k], 4) : "no data",
                    "</td><td class=\"num\">", accepted, "</td><td class=\"num\">", reached,
                    "</td><td class=\"num\">",
                    s.steps ? Fixed(static_cast<double>(accepted) / s.steps, 4) : "no data",
                    "</td></tr>\n");
  }
  absl::StrAppend(&h, "</table>\n</section>\n");

  absl::StrAppend(&h, "<section id=\"token-windows\">\n<h2>τ by completion-token window</h2>\n",
                  "<p>Later tokens of a completion are easier to draft, so τ depends on the "
                  "generation length: compare τ at the same window. A step belongs to the window "
                  "of the first token it commits (token 1 comes from the prefill). The last "
                  "window of a generation also holds the steps max_new_tokens cut short: compare "
                  "windows that end a block or more before it.</p>\n");
  if (s.windows.empty()) {
    absl::StrAppend(&h, "<p>No windows (token_window 0, or no steps).</p>\n");
  } else {
    absl::StrAppend(&h, "<figure>\n", TokenWindowSvg(s), "</figure>\n<table>\n",
                    "<tr><th>tokens</th><th>prompts</th><th>steps</th><th>τ (mean of means)</th>"
                    "<th>95% interval</th><th>τ (pooled)</th></tr>\n");
    for (const TokenWindow& w : s.windows) {
      absl::StrAppend(&h, "<tr><td>", w.first_token, "–", w.last_token, "</td><td class=\"num\">",
                      w.tau.responses, "</td><td class=\"num\">", w.tau.steps,
                      "</td><td class=\"num\">", w.tau.steps ? Fixed(w.tau.mean_of_means, 4) : "no data",
                      "</td><td class=\"num ci\">", HtmlEscape(IntervalText(w.tau.mean_of_means_ci, 4)),
                      "</td><td class=\"num\">", w.tau.steps ? Fixed(w.tau.pooled, 4) : "no data",
                      "</td></tr>\n");
    }
    absl::StrAppend(&h, "</table>\n");
  }
  absl::StrAppend(&h, "</section>\n");

  if (!s.temperature.empty()) {
    absl::StrAppend(
        &h, "<section id=\"temperature\">\n<h2>Teacher-forced acceptance at T &gt; 0</h2>\n",
        "<p>At each step of the greedy replay, α<sub>k</sub> = Σ min(p<sub>k</sub>, "
        "q<sub>k</sub>) between the target's distribution p at draft position k (final norm + "
        "lm_head, the sampling setting applied) and the drafter's q; τ_prob = 1 + Σ<sub>i</sub> "
        "Π<sub>j≤i</sub> α<sub>j</sub>. <strong>Teacher-forced:</strong> every position is "
        "verified on the trajectory's context, which assumes the sampled path stays on the "
        "greedy trajectory; the real sampled path differs once a token differs. Rules: "
        "<code>argmax_draft</code> drafts the argmax with a one-hot q (α = p(x̂), how vLLM "
        "verifies DFlash v1); <code>draft_distribution</code> uses the drafter's own q at the "
        "same setting.</p>\n<table>\n<tr><th>T</th><th>top_p</th><th>top_k</th><th>rule</th>"
        "<th>blocks</th><th>τ_prob</th><th>95% interval</th><th>pooled</th><th>α per "
        "position</th></tr>\n");
    for (const TemperatureSummary& x : s.temperature) {
      std::vector<std::string> alpha;
      for (size_t k = 0; k < x.alpha.size(); ++k) {
        alpha.push_back(k < x.alpha_blocks.size() && x.alpha_blocks[k] ? Fixed(x.alpha[k], 3)
                                                                        : "n/a");
      }
      absl::StrAppend(&h, "<tr><td class=\"num\">", Fixed(x.setting.temperature, 2),
                      "</td><td class=\"num\">", Fixed(x.setting.top_p, 2),
                      "</td><td class=\"num\">", x.setting.top_k, "</td><td>",
                      HtmlEscape(x.rule), "</td><td class=\"num\">", x.blocks,
                      "</td><td class=\"num\">", Fixed(x.tau_prob, 4), "</td><td class=\"num ci\">",
                      HtmlEscape(IntervalText(x.tau_prob_ci, 4)), "</td><td class=\"num\">",
                      Fixed(x.tau_prob_pooled, 4), "</td><td class=\"steps\">",
                      absl::StrJoin(alpha, " "), "</td></tr>\n");
    }
    absl::StrAppend(&h, "</table>\n</section>\n");
  }

  if (s.predicted_acceptance) {
    const PredictedAcceptanceSummary& p = *s.predicted_acceptance;
    absl::StrAppend(
        &h, "<section id=\"predicted-acceptance\">\n<h2>Predicted acceptance</h2>\n",
        "<p>The drafter's own prediction of each draft's acceptance (DSpark's confidence head) "
        "on the greedy replay's blocks, against what was accepted: per draft position, the "
        "blocks whose earlier drafts were all accepted, their mean prediction and the share "
        "that accepted the draft there. Below, τ of an adaptive verify length: each step "
        "verifies the leading drafts whose predicted survival c<sub>1</sub> · … · "
        "c<sub>L</sub> stays at or above the cutoff.</p>\n<table>\n<tr><th>draft "
        "position</th><th>blocks</th><th>predicted</th><th>observed</th><th>gap</th></tr>\n");
    for (const CalibrationRow& row : p.calibration) {
      absl::StrAppend(&h, "<tr><td class=\"num\">", row.position, "</td><td class=\"num\">",
                      row.blocks, "</td><td class=\"num\">", Fixed(row.predicted, 4),
                      "</td><td class=\"num\">", Fixed(row.observed, 4),
                      "</td><td class=\"num\">", Fixed(row.predicted - row.observed, 4),
                      "</td></tr>\n");
    }
    absl::StrAppend(&h, "</table>\n");
    if (!p.cutoffs.empty()) {
      absl::StrAppend(&h, "<table>\n<tr><th>cutoff</th><th>steps</th><th>τ (mean of "
                          "means)</th><th>95% interval</th><th>τ (pooled)</th></tr>\n");
      for (const CutoffTau& c : p.cutoffs) {
        absl::StrAppend(&h, "<tr><td class=\"num\">", Fixed(c.cutoff, 2),
                        "</td><td class=\"num\">", c.tau.steps, "</td><td class=\"num\">",
                        Fixed(c.tau.mean_of_means, 4), "</td><td class=\"num ci\">",
                        HtmlEscape(IntervalText(c.tau.mean_of_means_ci, 4)),
                        "</td><td class=\"num\">", Fixed(c.tau.pooled, 4), "</td></tr>\n");
      }
      absl::StrAppend(&h, "</table>\n");
    }
    absl::StrAppend(&h, "</section>\n");
  }

  const CapacityPlan plan = ReportCapacity(r);
  absl::StrAppend(
      &h, "<section id=\"capacity\">\n<h2>Capacity planning</h2>\n",
      "<p>Expected tokens per step with k draft tokens: 1 + Σ<sub>i≤k</sub> P(a ≥ i), from the "
      "per-position counts (assumes the first k drafts are those of the full block). Cost of a "
      "step in target decode forwards: 1 + ", Fixed(plan.options.verify_cost_per_token, 3),
      " · k (verification) + ", Fixed(plan.options.drafter_cost, 3),
      plan.options.autoregressive ? " · k" : "", " (drafting",
      plan.options.autoregressive ? ", one forward per draft token" : ", one forward per block",
      "). Set with --plan_drafter_cost, --plan_verify_cost_per_token, "
      "--plan_autoregressive.</p>\n");
  if (plan.recommended_k > 0) {
    absl::StrAppend(&h, "<p id=\"recommendation\"><strong>Recommended k = ", plan.recommended_k,
                    "</strong> (expected speed-up ", Fixed(plan.recommended_speedup, 3),
                    "). vLLM's synthetic acceptance mode for it: <code>--speculative-config '",
                    HtmlEscape(VllmSyntheticConfigJson(plan, plan.recommended_k)),
                    "'</code></p>\n<figure>\n", CapacitySvg(plan), "</figure>\n");
  }
  absl::StrAppend(&h, "<table>\n<tr><th>k</th><th>tokens per step</th><th>step cost</th>"
                      "<th>speed-up</th></tr>\n");
  for (const CapacityRow& row : plan.draft_lengths) {
    absl::StrAppend(&h, "<tr><td class=\"num\">", row.k, "</td><td class=\"num\">",
                    Fixed(row.expected_tokens, 4), "</td><td class=\"num\">",
                    Fixed(row.step_cost, 4), "</td><td class=\"num\">", Fixed(row.speedup, 4),
                    "</td></tr>\n");
  }
  for (const CapacityRow& row : plan.tree_budgets) {
    absl::StrAppend(&h, "<tr><td class=\"num\">", TreeLabel(s.tree_method, row.k),
                    "</td><td class=\"num\">",
                    Fixed(row.expected_tokens, 4), "</td><td class=\"num\">",
                    Fixed(row.step_cost, 4), "</td><td class=\"num\">", Fixed(row.speedup, 4),
                    "</td></tr>\n");
  }
  absl::StrAppend(&h, "</table>\n</section>\n");

  const ExtractionContract& c = r.contract;
  absl::StrAppend(
      &h, "<section id=\"contract\">\n<h2>Extraction contract</h2>\n<table>\n",
      kv("architecture", c.architecture), kv("model_type", c.model_type),
      kv("source_layout", c.source_layout), kv("num_layers", std::to_string(c.num_layers)),
      kv("hidden_size", std::to_string(c.hidden_size)),
      kv("vocab_size", std::to_string(c.vocab_size)), kv("compute_dtype", c.compute_dtype),
      kv("kernel_variant", c.kernel_variant), kv("weights_digest", c.weights_digest),
      kv("tokenizer_digest", c.tokenizer_digest), kv("devices", absl::StrJoin(c.devices, ", ")),
      kv("specwire_version", c.specwire_version),
      kv("extractors", absl::StrJoin(r.extractors, ", ")), "</table>\n</section>\n");

  absl::StrAppend(&h, "<section id=\"drafter\">\n<h2>Drafter</h2>\n<table>\n",
                  kv("path", r.drafter_path.empty() ? r.drafter.path : r.drafter_path));
  if (r.drafter_loaded) {
    absl::StrAppend(&h, kv("block_size", std::to_string(r.drafter.block_size)),
                    kv("layers", std::to_string(r.drafter.num_layers)),
                    kv("hidden_size", std::to_string(r.drafter.hidden_size)),
                    kv("num_target_layers", std::to_string(r.drafter.num_target_layers)),
                    kv("target_layer_ids", absl::StrJoin(r.drafter.target_layer_ids, ", ")),
                    kv("mask_token_id", std::to_string(r.drafter.mask_token_id)));
  }
  if (!r.drafter.dtype.empty()) {
    absl::StrAppend(&h, kv("dtype / device", r.drafter.dtype + " / " + r.drafter.device));
  }
  if (const std::string note = DtypeNote(r); !note.empty()) {
    absl::StrAppend(&h, kv("note", note));
  }
  absl::StrAppend(&h, "</table>\n");
  if (!r.drafter.config_json.empty()) {
    absl::StrAppend(&h, "<details><summary>config.json</summary>\n<pre>",
                    HtmlEscape(r.drafter.config_json), "</pre>\n</details>\n");
  }
  absl::StrAppend(&h, "</section>\n");

  absl::StrAppend(
      &h,
      "<section id=\"prompts\">\n<h2>Prompts</h2>\n<table>\n<tr><th>#</th><th>prompt tokens</th>",
      "<th>completion tokens</th><th>finish</th><th>τ</th><th>steps</th>");
  // The budgets the prompts were scored with (none for a family without a tree).
  std::set<int32_t> budgets;
  for (const PromptScore& p : r.prompts) {
    for (const auto& [b, lengths] : p.acceptance.ddtree_step_lengths) budgets.insert(b);
  }
  for (int32_t b : budgets) {
    absl::StrAppend(&h, "<th>", TreeLabel(r.summary.tree_method, b), " τ</th>");
  }
  absl::StrAppend(&h, "<th>step lengths</th></tr>\n");
  for (const PromptScore& p : r.prompts) {
    absl::StrAppend(&h, "<tr><td class=\"num\">", p.prompt_index, "</td><td class=\"num\">",
                    p.acceptance.prompt_tokens, "</td><td class=\"num\">",
                    p.acceptance.completion_tokens, "</td><td>", HtmlEscape(p.finish_reason),
                    "</td><td class=\"num\">",
                    p.acceptance.step_lengths.empty() ? "no steps" : Fixed(p.tau, 3),
                    "</td><td class=\"num\">",
                    p.acceptance.step_lengths.size(), "</td>");
    for (int32_t b : budgets) {
      auto it = p.acceptance.ddtree_step_lengths.find(b);
      absl::StrAppend(
          &h, "<td class=\"num\">",
          it == p.acceptance.ddtree_step_lengths.end() ? "" : Fixed(MeanStepLength(it->second), 3),
          "</td>");
    }
    absl::StrAppend(&h, "<td class=\"steps\">", absl::StrJoin(p.acceptance.step_lengths, " "),
                    "</td></tr>\n");
  }
  absl::StrAppend(&h, "</table>\n</section>\n</body>\n</html>\n");
  return h;
}

}  // namespace specwire
