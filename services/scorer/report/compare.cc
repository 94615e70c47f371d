#include "services/scorer/report/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

using json = nlohmann::json;

std::string Signed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%+.*f", digits, v);
  return buf;
}

// "+0.123 [−0.010, +0.250]".
std::string DeltaText(double d, const std::optional<Interval>& ci, int digits) {
  std::string t = Signed(d, digits);
  if (ci) absl::StrAppend(&t, " [", Signed(ci->lo, digits), ", ", Signed(ci->hi, digits), "]");
  return t;
}

// What an interval says: the sign of Δ when it excludes 0.
std::string Verdict(const PairedComparison& p) {
  if (!p.delta_ci) return p.prompts ? "no interval" : "no data";
  if (p.delta_ci->lo > 0) return "B better";
  if (p.delta_ci->hi < 0) return "A better";
  return "no significant difference";
}

json PairedJson(const PairedComparison& p) {
  return {{"prompts", p.prompts},
          {"tau_a", p.tau_a},
          {"tau_b", p.tau_b},
          {"delta", p.delta},
          {"delta_ci", IntervalJson(p.delta_ci)},
          {"pooled_a", p.pooled_a},
          {"pooled_b", p.pooled_b},
          {"delta_pooled", p.delta_pooled},
          {"delta_pooled_ci", IntervalJson(p.delta_pooled_ci)},
          {"b_better", p.b_better},
          {"a_better", p.a_better},
          {"ties", p.ties},
          {"verdict", Verdict(p)}};
}

std::string Name(const ScoreReport& r, const std::string& fallback) {
  if (!r.labels.drafter.empty()) return r.labels.drafter;
  if (!r.drafter_path.empty()) return r.drafter_path;
  return fallback;
}

}  // namespace

absl::StatusOr<ScoreReport> ReportFromJson(const std::string& text, const std::string& name) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object"));
  }
  if (!j.contains("summary") || !j.contains("prompts") || !j["prompts"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a specwire-score report (no summary or prompts)"));
  }
  ScoreReport r;
  std::string key;
  try {
    key = "mode";
    r.mode = j.value("mode", "");
    r.endpoint = j.value("endpoint", "");
    r.created = j.value("created", "");
    r.seconds = j.value("seconds", 0.0);
    key = "extractors";
    if (j.contains(key)) r.extractors = j[key].get<std::vector<std::string>>();
    key = "labels";
    if (j.contains(key)) {
      r.labels.drafter = j[key].value("drafter", "");
      r.labels.dataset = j[key].value("dataset", "");
      r.labels.method = j[key].value("method", "");
    }
    key = "request";
    if (j.contains(key)) {
      const json& q = j[key];
      r.drafter_path = q.value("drafter_path", "");
      r.dataset_path = q.value("dataset_path", "");
      r.max_new_tokens = q.value("max_new_tokens", int64_t{0});
      r.max_prompts = q.value("max_prompts", int64_t{0});
      r.ddtree_budgets = q.value("ddtree_budgets", std::vector<int32_t>{});
    }
    key = "contract";
    if (j.contains(key)) {
      auto c = ContractFromJson(j[key].dump());
      if (!c.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": contract: ", c.status().message()));
      }
      r.contract = *c;
    }
    key = "drafter";
    if (j.contains(key) && j[key].is_object()) {
      r.drafter.path = j[key].value("path", "");
      if (j[key].contains("config") && !j[key]["config"].is_null()) {
        r.drafter.config_json =
            j[key]["config"].is_string() ? j[key]["config"].get<std::string>() : j[key]["config"].dump(2);
      }
      r.drafter.dtype = j[key].value("dtype", "");
    }
    key = "summary";
    auto summary = AcceptanceSummaryFromJson(j[key].dump());
    if (!summary.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", summary.status().message()));
    }
    r.summary = *summary;
    for (size_t i = 0; i < j["prompts"].size(); ++i) {
      key = absl::StrCat("prompts[", i, "]");
      const json& p = j["prompts"][i];
      PromptScore s;
      s.prompt_index = p.at("prompt_index").get<int64_t>();
      s.acceptance.prompt_tokens = p.value("prompt_tokens", int64_t{0});
      s.acceptance.completion_tokens = p.value("completion_tokens", int64_t{0});
      s.finish_reason = p.value("finish_reason", "");
      s.trajectory_digest = p.value("trajectory_digest", "");
      s.acceptance.step_lengths = p.at("step_lengths").get<std::vector<int32_t>>();
      if (p.contains("ddtree_step_lengths")) {
        for (const auto& [b, l] : p["ddtree_step_lengths"].items()) {
          s.acceptance.ddtree_step_lengths[std::stoi(b)] = l.get<std::vector<int32_t>>();
        }
      }
      s.tau = MeanStepLength(s.acceptance.step_lengths);
      r.prompts.push_back(std::move(s));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", key, ": ", e.what()));
  }
  return r;
}

absl::StatusOr<ComparisonReport> CompareReports(ScoreReport a, ScoreReport b,
                                                const BootstrapOptions& bootstrap,
                                                int64_t token_window) {
  ComparisonReport c;
  c.bootstrap = bootstrap;
  auto refuse = [](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat("the two reports do not pair: ", what,
                     " (compare drafters on the same target, prompts and settings)"));
  };
  const ExtractionContract &ca = a.contract, &cb = b.contract;
  if (ca.weights_digest != cb.weights_digest) {
    return refuse(absl::StrCat("target weights differ (", ca.weights_digest, " vs ",
                               cb.weights_digest, ")"));
  }
  if (ca.tokenizer_digest != cb.tokenizer_digest) return refuse("tokenizers differ");
  if (ca.compute_dtype != cb.compute_dtype) {
    return refuse(absl::StrCat("target compute dtypes differ (", ca.compute_dtype, " vs ",
                               cb.compute_dtype, ")"));
  }
  if (a.max_new_tokens != b.max_new_tokens) {
    return refuse(absl::StrCat("max_new_tokens differ (", a.max_new_tokens, " vs ",
                               b.max_new_tokens, ")"));
  }
  // Same weights and dtype, but were the features the same? The canary fingerprints tell
  // (another device or kernel shows up as drift).
  if (!ca.canary.empty() && !cb.canary.empty()) {
    const FingerprintComparison f = CompareFingerprints(ca.canary, cb.canary);
    if (f.level == "drift" || f.level == "mismatch") {
      std::string taps;
      for (const TapComparison& t : f.taps) {
        if (t.level == "drift" || t.level == "mismatch") taps = t.tap;  // the deepest
      }
      c.notes.push_back(absl::StrCat(
          "the targets' canary fingerprints differ (", f.level,
          f.problem.empty() ? absl::StrCat(" up to ", taps) : absl::StrCat(": ", f.problem),
          "): the two reports saw other features of the same weights"));
    }
  }
  if (a.summary.block_size != b.summary.block_size) {
    c.notes.push_back(absl::StrCat("block sizes differ (", a.summary.block_size, " vs ",
                                   b.summary.block_size, "): τ compares the drafters as built"));
  }
  std::map<int64_t, const PromptScore*> by_index;
  for (const PromptScore& p : b.prompts) by_index[p.prompt_index] = &p;
  std::vector<const PromptScore*> pa, pb;
  int64_t missing = 0;
  for (const PromptScore& p : a.prompts) {
    auto it = by_index.find(p.prompt_index);
    if (it == by_index.end()) {
      ++missing;
      continue;
    }
    const PromptScore& q = *it->second;
    if (!p.trajectory_digest.empty() && !q.trajectory_digest.empty()) {
      if (p.trajectory_digest != q.trajectory_digest) {
        return refuse(absl::StrCat("prompt ", p.prompt_index, " has different trajectories (",
                                   p.trajectory_digest, " vs ", q.trajectory_digest, ")"));
      }
    } else if (p.acceptance.prompt_tokens != q.acceptance.prompt_tokens ||
               p.acceptance.completion_tokens != q.acceptance.completion_tokens) {
      return refuse(absl::StrCat("prompt ", p.prompt_index, " has ", p.acceptance.prompt_tokens,
                                 " + ", p.acceptance.completion_tokens, " tokens in A and ",
                                 q.acceptance.prompt_tokens, " + ",
                                 q.acceptance.completion_tokens, " in B"));
    }
    pa.push_back(&p);
    pb.push_back(&q);
    c.prompt_indices.push_back(p.prompt_index);
  }
  missing += static_cast<int64_t>(b.prompts.size()) - static_cast<int64_t>(pb.size());
  if (pa.empty()) return refuse("no prompt index is in both");
  if (missing > 0) {
    c.notes.push_back(absl::StrCat(missing, " prompts are in only one report: left out"));
  }
  const bool digests = std::all_of(pa.begin(), pa.end(), [](const PromptScore* p) {
    return !p->trajectory_digest.empty();
  });
  if (!digests) {
    c.notes.push_back("a report has no trajectory digests: prompts paired by token counts");
  }
  auto lists = [](const std::vector<const PromptScore*>& ps, int32_t budget) {
    std::vector<const std::vector<int32_t>*> out;
    for (const PromptScore* p : ps) {
      if (budget == 0) {
        out.push_back(&p->acceptance.step_lengths);
      } else {
        auto it = p->acceptance.ddtree_step_lengths.find(budget);
        out.push_back(it == p->acceptance.ddtree_step_lengths.end() ? nullptr : &it->second);
      }
    }
    return out;
  };
  c.dflash = ComparePaired(lists(pa, 0), lists(pb, 0), bootstrap);
  std::set<int32_t> budgets_a, budgets_b;
  for (const auto& [k, v] : a.summary.ddtree_tau) budgets_a.insert(k);
  for (const auto& [k, v] : b.summary.ddtree_tau) budgets_b.insert(k);
  const AcceptanceSummary &sa = a.summary, &sb = b.summary;
  const bool same_tree = sa.tree_method == sb.tree_method && sa.tree_depth == sb.tree_depth &&
                         sa.tree_top_k == sb.tree_top_k;
  if (!same_tree && !budgets_a.empty() && !budgets_b.empty()) {
    auto tree = [](const AcceptanceSummary& s) {
      return s.tree_method == kTreeEagle
                 ? absl::StrCat("EAGLE's tree (depth ", s.tree_depth, ", top-k ", s.tree_top_k, ")")
                 : std::string("DDTree");
    };
    c.notes.push_back(absl::StrCat("tree budgets not paired: ", tree(sa), " against ", tree(sb),
                                   " are different trees"));
  }
  for (int32_t budget : budgets_a) {
    if (!same_tree || !budgets_b.count(budget)) continue;
    BootstrapOptions o = bootstrap;
    o.seed += static_cast<uint64_t>(budget) << 32;
    c.ddtree[budget] = ComparePaired(lists(pa, budget), lists(pb, budget), o);
  }
  if (token_window > 0) {
    int64_t longest = 0;
    for (const PromptScore* p : pa) longest = std::max(longest, p->acceptance.completion_tokens);
    for (int64_t first = 1; first <= longest; first += token_window) {
      const int64_t last = first + token_window - 1;
      std::vector<std::vector<int32_t>> wa, wb;
      for (size_t i = 0; i < pa.size(); ++i) {
        wa.push_back(StepsInTokenWindow(pa[i]->acceptance.step_lengths, first, last));
        wb.push_back(StepsInTokenWindow(pb[i]->acceptance.step_lengths, first, last));
      }
      std::vector<const std::vector<int32_t>*> va, vb;
      for (size_t i = 0; i < wa.size(); ++i) {
        va.push_back(&wa[i]);
        vb.push_back(&wb[i]);
      }
      BootstrapOptions o = bootstrap;
      o.seed += static_cast<uint64_t>(c.windows.size()) + 1;
      WindowComparison w{first, last, ComparePaired(va, vb, o)};
      if (w.paired.prompts == 0) continue;
      c.windows.push_back(std::move(w));
    }
  }
  c.name_a = Name(a, "A");
  c.name_b = Name(b, "B");
  if (c.name_a == c.name_b) {
    c.name_a += " (A)";
    c.name_b += " (B)";
  }
  c.a = std::move(a);
  c.b = std::move(b);
  return c;
}

std::string ComparisonToJson(const ComparisonReport& c) {
  json j;
  j["specwire_version"] = SPECWIRE_VERSION;
  j["kind"] = "paired_comparison";
  j["a"] = {{"name", c.name_a},
            {"drafter_path", c.a.drafter_path},
            {"created", c.a.created},
            {"settings", SettingsText(c.a)}};
  j["b"] = {{"name", c.name_b},
            {"drafter_path", c.b.drafter_path},
            {"created", c.b.created},
            {"settings", SettingsText(c.b)}};
  j["delta_convention"] = "B - A";
  j["bootstrap"] = {{"resamples", c.bootstrap.resamples},
                    {"seed", c.bootstrap.seed},
                    {"confidence", c.bootstrap.confidence},
                    {"paired", true}};
  j["dflash"] = PairedJson(c.dflash);
  json dd = json::object();
  for (const auto& [b, p] : c.ddtree) dd[std::to_string(b)] = PairedJson(p);
  j["ddtree"] = dd;
  json windows = json::array();
  for (const WindowComparison& w : c.windows) {
    json x = PairedJson(w.paired);
    x["first_token"] = w.first_token;
    x["last_token"] = w.last_token;
    windows.push_back(x);
  }
  j["windows"] = windows;
  json prompts = json::array();
  for (size_t i = 0; i < c.dflash.per_prompt.size() && i < c.prompt_indices.size(); ++i) {
    prompts.push_back({{"prompt_index", c.prompt_indices[i]},
                       {"tau_a", c.dflash.per_prompt[i].first},
                       {"tau_b", c.dflash.per_prompt[i].second}});
  }
  j["prompts"] = prompts;
  j["notes"] = c.notes;
  return j.dump(2) + "\n";
}

std::string ComparisonTable(const ComparisonReport& c) {
  std::string t;
  absl::StrAppend(&t, "A  ", c.name_a, "   (", SettingsText(c.a), ")\n");
  absl::StrAppend(&t, "B  ", c.name_b, "   (", SettingsText(c.b), ")\n");
  absl::StrAppend(&t, c.dflash.prompts, " paired prompts; delta = B - A with a ",
                  Fixed(100 * c.bootstrap.confidence, 0), "% paired bootstrap interval (",
                  c.bootstrap.resamples, " resamples, seed ", c.bootstrap.seed, ")\n\n");
  char line[256];
  std::snprintf(line, sizeof(line), "  %-26s %8s %8s  %-28s %s\n", "", "A", "B", "delta",
                "verdict");
  absl::StrAppend(&t, line);
  auto row = [&](const std::string& name, double a, double b, double d,
                 const std::optional<Interval>& ci, const std::string& verdict) {
    std::snprintf(line, sizeof(line), "  %-26s %8.3f %8.3f  %-28s %s\n", name.c_str(), a, b,
                  DeltaText(d, ci, 3).c_str(), verdict.c_str());
    absl::StrAppend(&t, line);
  };
  const PairedComparison& p = c.dflash;
  row("tau (mean of means)", p.tau_a, p.tau_b, p.delta, p.delta_ci, Verdict(p));
  row("tau (pooled)", p.pooled_a, p.pooled_b, p.delta_pooled, p.delta_pooled_ci, "");
  for (const auto& [b, d] : c.ddtree) {
    row(absl::StrCat(TreeLabel(c.a.summary.tree_method, b), " tau"), d.tau_a, d.tau_b, d.delta,
        d.delta_ci, Verdict(d));
  }
  for (const WindowComparison& w : c.windows) {
    row(absl::StrCat("tokens ", w.first_token, "-", w.last_token), w.paired.tau_a, w.paired.tau_b,
        w.paired.delta, w.paired.delta_ci, Verdict(w.paired));
  }
  absl::StrAppend(&t, "\n  per prompt: B better on ", p.b_better, ", A better on ", p.a_better,
                  ", equal on ", p.ties, "\n");
  for (const std::string& n : c.notes) absl::StrAppend(&t, "  note: ", n, "\n");
  return t;
}

namespace {

constexpr int kCmpW = 640, kCmpH = 420, kCmpPad = 56;

std::string Escape(const std::string& s) { return HtmlEscape(s); }

}  // namespace

std::string PairedScatterSvg(const ComparisonReport& c) {
  double top = 1;
  for (const auto& [x, y] : c.dflash.per_prompt) top = std::max({top, x, y});
  top = std::ceil(top + 0.25);
  const double plot = kCmpH - 2 * kCmpPad;
  const double x0 = kCmpPad + 20, y0 = kCmpH - kCmpPad;
  auto X = [&](double v) { return x0 + plot * v / top; };
  auto Y = [&](double v) { return y0 - plot * v / top; };
  std::string s = absl::StrCat(
      "<svg id=\"paired-scatter\" xmlns=\"http://www.w3.org/2000/svg\" width=\"", kCmpW,
      "\" height=\"", kCmpH, "\" viewBox=\"0 0 ", kCmpW, " ", kCmpH,
      "\" role=\"img\" aria-label=\"per-prompt tau, A against B\">\n<title>Per-prompt τ: A "
      "against B</title>\n<rect x=\"0\" y=\"0\" width=\"", kCmpW, "\" height=\"", kCmpH,
      "\" fill=\"#ffffff\"/>\n<text x=\"", kCmpW / 2, "\" y=\"20\" text-anchor=\"middle\" "
      "font-size=\"14\" font-weight=\"bold\">Per-prompt τ: ",
      Escape(c.name_a), " (x) against ", Escape(c.name_b), " (y)</text>\n");
  for (int i = 0; i <= 4; ++i) {
    const double v = top * i / 4;
    absl::StrAppend(&s, "<line x1=\"", Fixed(X(0), 1), "\" x2=\"", Fixed(X(top), 1), "\" y1=\"",
                    Fixed(Y(v), 1), "\" y2=\"", Fixed(Y(v), 1), "\" stroke=\"#dddddd\"/>\n",
                    "<line x1=\"", Fixed(X(v), 1), "\" x2=\"", Fixed(X(v), 1), "\" y1=\"",
                    Fixed(Y(0), 1), "\" y2=\"", Fixed(Y(top), 1), "\" stroke=\"#dddddd\"/>\n",
                    "<text x=\"", Fixed(X(0) - 6, 1), "\" y=\"", Fixed(Y(v) + 4, 1),
                    "\" text-anchor=\"end\" font-size=\"11\">", Fixed(v, 2), "</text>\n",
                    "<text x=\"", Fixed(X(v), 1), "\" y=\"", Fixed(Y(0) + 16, 1),
                    "\" text-anchor=\"middle\" font-size=\"11\">", Fixed(v, 2), "</text>\n");
  }
  absl::StrAppend(&s, "<line class=\"diagonal\" x1=\"", Fixed(X(0), 1), "\" y1=\"",
                  Fixed(Y(0), 1), "\" x2=\"", Fixed(X(top), 1), "\" y2=\"", Fixed(Y(top), 1),
                  "\" stroke=\"#888888\" stroke-dasharray=\"6 4\"/>\n");
  for (size_t i = 0; i < c.dflash.per_prompt.size(); ++i) {
    const auto [x, y] = c.dflash.per_prompt[i];
    const char* color = y > x ? "#54a24b" : (y < x ? "#e45756" : "#4c78a8");
    absl::StrAppend(&s, "<circle class=\"point\" cx=\"", Fixed(X(x), 1), "\" cy=\"",
                    Fixed(Y(y), 1), "\" r=\"4\" fill=\"", color,
                    "\" fill-opacity=\"0.75\"><title>prompt ",
                    i < c.prompt_indices.size() ? c.prompt_indices[i] : static_cast<int64_t>(i),
                    ": A ", Fixed(x, 3), ", B ", Fixed(y, 3), "</title></circle>\n");
  }
  absl::StrAppend(&s, "<text x=\"", Fixed(X(top / 2), 1), "\" y=\"", kCmpH - 12,
                  "\" text-anchor=\"middle\" font-size=\"12\">τ of A (", Escape(c.name_a),
                  ")</text>\n<text x=\"16\" y=\"", Fixed(Y(top / 2), 1),
                  "\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 16 ",
                  Fixed(Y(top / 2), 1), ")\">τ of B (", Escape(c.name_b), ")</text>\n</svg>\n");
  return s;
}

std::string PairedDeltaSvg(const ComparisonReport& c) {
  struct Row {
    std::string label;
    const PairedComparison* p;
  };
  std::vector<Row> rows{{"DFlash τ", &c.dflash}};
  for (const auto& [b, p] : c.ddtree) rows.push_back({TreeLabel(c.a.summary.tree_method, b), &p});
  for (const WindowComparison& w : c.windows) {
    rows.push_back({absl::StrCat("tokens ", w.first_token, "-", w.last_token), &w.paired});
  }
  double span = 0.5;
  for (const Row& r : rows) {
    span = std::max(span, std::abs(r.p->delta));
    if (r.p->delta_ci) span = std::max({span, std::abs(r.p->delta_ci->lo), std::abs(r.p->delta_ci->hi)});
  }
  span = std::ceil(span * 4 + 0.5) / 4;
  const int row_h = 26, top = 40, left = 150, right = 30;
  const int h = top + row_h * static_cast<int>(rows.size()) + 40;
  const double plot_w = kCmpW - left - right;
  auto X = [&](double v) { return left + plot_w * (v + span) / (2 * span); };
  std::string s = absl::StrCat(
      "<svg id=\"paired-delta\" xmlns=\"http://www.w3.org/2000/svg\" width=\"", kCmpW,
      "\" height=\"", h, "\" viewBox=\"0 0 ", kCmpW, " ", h,
      "\" role=\"img\" aria-label=\"delta tau with paired intervals\">\n<title>Δτ (B − A) with "
      "paired intervals</title>\n<rect x=\"0\" y=\"0\" width=\"", kCmpW, "\" height=\"", h,
      "\" fill=\"#ffffff\"/>\n<text x=\"", kCmpW / 2, "\" y=\"20\" text-anchor=\"middle\" "
      "font-size=\"14\" font-weight=\"bold\">Δτ = B − A, ",
      Fixed(100 * c.bootstrap.confidence, 0), "% paired bootstrap interval</text>\n");
  absl::StrAppend(&s, "<line x1=\"", Fixed(X(0), 1), "\" x2=\"", Fixed(X(0), 1), "\" y1=\"", top - 6,
                  "\" y2=\"", h - 34, "\" stroke=\"#333333\"/>\n");
  for (int i = -2; i <= 2; ++i) {
    const double v = span * i / 2;
    absl::StrAppend(&s, "<text x=\"", Fixed(X(v), 1), "\" y=\"", h - 18,
                    "\" text-anchor=\"middle\" font-size=\"11\">", Signed(v, 2), "</text>\n");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const double y = top + row_h * static_cast<double>(i) + row_h / 2.0;
    const PairedComparison& p = *rows[i].p;
    const char* color = !p.delta_ci ? "#888888"
                        : p.delta_ci->lo > 0 ? "#54a24b"
                        : p.delta_ci->hi < 0 ? "#e45756"
                                             : "#4c78a8";
    absl::StrAppend(&s, "<text x=\"", left - 8, "\" y=\"", Fixed(y + 4, 1),
                    "\" text-anchor=\"end\" font-size=\"12\">", Escape(rows[i].label),
                    "</text>\n");
    if (p.delta_ci) {
      absl::StrAppend(&s, "<line class=\"ci\" x1=\"", Fixed(X(p.delta_ci->lo), 1), "\" x2=\"",
                      Fixed(X(p.delta_ci->hi), 1), "\" y1=\"", Fixed(y, 1), "\" y2=\"",
                      Fixed(y, 1), "\" stroke=\"", color, "\" stroke-width=\"3\"/>\n");
    }
    absl::StrAppend(&s, "<circle class=\"delta\" cx=\"", Fixed(X(p.delta), 1), "\" cy=\"",
                    Fixed(y, 1), "\" r=\"5\" fill=\"", color, "\"><title>",
                    Escape(rows[i].label), ": ", DeltaText(p.delta, p.delta_ci, 3), " over ",
                    p.prompts, " prompts</title></circle>\n");
  }
  absl::StrAppend(&s, "</svg>\n");
  return s;
}

std::string ComparisonToHtml(const ComparisonReport& c) {
  const std::string title = absl::StrCat("specwire compare: ", c.name_a, " vs ", c.name_b);
  std::string h = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
      Escape(title), "</title>\n<style>\n",
      "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}\n",
      "table{border-collapse:collapse;margin:0.5em 0 1.5em}\n",
      "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}\n",
      "th{background:#f3f3f3}\n td.num{text-align:right;font-variant-numeric:tabular-nums}\n",
      "</style>\n</head>\n<body>\n<h1>", Escape(title), "</h1>\n");
  absl::StrAppend(&h, "<p><strong>A</strong> ", Escape(c.name_a), ": ", Escape(SettingsText(c.a)),
                  "<br><strong>B</strong> ", Escape(c.name_b), ": ", Escape(SettingsText(c.b)),
                  "</p>\n<p>", c.dflash.prompts,
                  " prompts paired on identical trajectories; Δ = B − A with a ",
                  Fixed(100 * c.bootstrap.confidence, 0),
                  "% paired bootstrap interval over prompts (", c.bootstrap.resamples,
                  " resamples, seed ", c.bootstrap.seed, ").</p>\n");
  absl::StrAppend(&h, "<section id=\"comparison\">\n<h2>Δτ</h2>\n<table>\n<tr><th></th><th>A</th>"
                      "<th>B</th><th>Δ (B − A)</th><th>interval</th><th>verdict</th></tr>\n");
  auto row = [&](const std::string& name, double a, double b, double d,
                 const std::optional<Interval>& ci, const std::string& verdict) {
    absl::StrAppend(&h, "<tr><th>", Escape(name), "</th><td class=\"num\">", Fixed(a, 4),
                    "</td><td class=\"num\">", Fixed(b, 4), "</td><td class=\"num\">",
                    Signed(d, 4), "</td><td class=\"num ci\">",
                    ci ? absl::StrCat(Signed(ci->lo, 4), " – ", Signed(ci->hi, 4)) : "",
                    "</td><td>", Escape(verdict), "</td></tr>\n");
  };
  const PairedComparison& p = c.dflash;
  row("τ (mean of means)", p.tau_a, p.tau_b, p.delta, p.delta_ci, Verdict(p));
  row("τ (pooled)", p.pooled_a, p.pooled_b, p.delta_pooled, p.delta_pooled_ci, "");
  for (const auto& [b, d] : c.ddtree) {
    row(absl::StrCat(TreeLabel(c.a.summary.tree_method, b), " τ"), d.tau_a, d.tau_b, d.delta,
        d.delta_ci, Verdict(d));
  }
  for (const WindowComparison& w : c.windows) {
    row(absl::StrCat("τ, completion tokens ", w.first_token, "–", w.last_token), w.paired.tau_a,
        w.paired.tau_b, w.paired.delta, w.paired.delta_ci, Verdict(w.paired));
  }
  absl::StrAppend(&h, "</table>\n<p>Per prompt: B better on ", p.b_better, ", A better on ",
                  p.a_better, ", equal on ", p.ties, ".</p>\n");
  for (const std::string& n : c.notes) absl::StrAppend(&h, "<p class=\"note\">", Escape(n), "</p>\n");
  absl::StrAppend(&h, "</section>\n<section id=\"charts\">\n<h2>Charts</h2>\n<figure>\n",
                  PairedDeltaSvg(c),
                  "<figcaption>Green: B better (the interval excludes 0); red: A better; blue: no "
                  "significant difference.</figcaption>\n</figure>\n<figure>\n",
                  PairedScatterSvg(c),
                  "<figcaption>One point per prompt; above the diagonal B drafts that prompt "
                  "better.</figcaption>\n</figure>\n</section>\n</body>\n</html>\n");
  return h;
}

}  // namespace specwire
