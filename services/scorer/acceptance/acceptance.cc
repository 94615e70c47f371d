#include "services/scorer/acceptance/acceptance.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

// τ of one list of step lengths per response: (mean of per-response means, pooled).
std::pair<double, double> Tau(const std::vector<const std::vector<int32_t>*>& lists) {
  double sum_of_means = 0;
  int64_t with_steps = 0, steps = 0, tokens = 0;
  for (const std::vector<int32_t>* l : lists) {
    if (l->empty()) continue;
    int64_t s = 0;
    for (int32_t v : *l) s += v;
    sum_of_means += static_cast<double>(s) / static_cast<double>(l->size());
    ++with_steps;
    steps += static_cast<int64_t>(l->size());
    tokens += s;
  }
  return {with_steps ? sum_of_means / static_cast<double>(with_steps) : 0.0,
          steps ? static_cast<double>(tokens) / static_cast<double>(steps) : 0.0};
}

// Teacher-forced acceptance per (setting, rule), in the order of first appearance.
std::vector<TemperatureSummary> SummarizeSampled(const std::vector<ResponseAcceptance>& responses,
                                                 const BootstrapOptions& bootstrap) {
  std::vector<TemperatureSummary> out;
  std::vector<std::vector<double>> means;  // per entry of out: each response's mean τ_prob
  std::vector<double> block_sums;
  for (const ResponseAcceptance& r : responses) {
    for (const SampledAcceptance& a : r.sampled) {
      size_t i = 0;
      while (i < out.size() && !(out[i].setting == a.setting && out[i].rule == a.rule)) ++i;
      if (i == out.size()) {
        TemperatureSummary t;
        t.setting = a.setting;
        t.rule = a.rule;
        out.push_back(std::move(t));
        means.emplace_back();
        block_sums.push_back(0);
      }
      TemperatureSummary& t = out[i];
      if (!a.block_tau.empty()) {
        double sum = 0;
        for (double v : a.block_tau) sum += v;
        means[i].push_back(sum / static_cast<double>(a.block_tau.size()));
        block_sums[i] += sum;
        t.blocks += static_cast<int64_t>(a.block_tau.size());
      }
      if (t.alpha.size() < a.alpha_sum.size()) {
        t.alpha.resize(a.alpha_sum.size(), 0.0);
        t.alpha_blocks.resize(a.alpha_sum.size(), 0);
      }
      for (size_t k = 0; k < a.alpha_sum.size() && k < a.alpha_blocks.size(); ++k) {
        t.alpha[k] += a.alpha_sum[k];  // a sum until the end
        t.alpha_blocks[k] += a.alpha_blocks[k];
      }
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    TemperatureSummary& t = out[i];
    for (size_t k = 0; k < t.alpha.size(); ++k) {
      t.alpha[k] = t.alpha_blocks[k] ? t.alpha[k] / static_cast<double>(t.alpha_blocks[k]) : 0.0;
    }
    if (t.blocks > 0) t.tau_prob_pooled = block_sums[i] / static_cast<double>(t.blocks);
    if (means[i].empty()) continue;
    double sum = 0;
    for (double m : means[i]) sum += m;
    t.tau_prob = sum / static_cast<double>(means[i].size());
    if (bootstrap.resamples > 0) {
      BootstrapRng rng(bootstrap.seed + 0x5bd1e995ull * (i + 1));
      std::vector<double> resampled(bootstrap.resamples);
      const uint64_t n = means[i].size();
      for (int32_t b = 0; b < bootstrap.resamples; ++b) {
        double s2 = 0;
        for (uint64_t j = 0; j < n; ++j) s2 += means[i][rng.Below(n)];
        resampled[b] = s2 / static_cast<double>(n);
      }
      t.tau_prob_ci = PercentileInterval(resampled, bootstrap.confidence);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<double>> ParseSurvivalCutoffs(const std::string& text,
                                                         const std::string& flag) {
  std::vector<double> out;
  if (text.empty() || text == "none") return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v) || !(v >= 0 && v <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": \"", part, "\" is not a survival probability in [0, 1]"));
    }
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<PredictedAcceptanceSummary> SummarizePredicted(
    const std::vector<const PredictedAcceptance*>& responses, const BootstrapOptions& bootstrap) {
  std::vector<int64_t> reached, accepted;
  std::vector<double> predicted;
  std::map<double, std::vector<const std::vector<int32_t>*>> cuts;
  bool any = false;
  for (const PredictedAcceptance* r : responses) {
    if (r == nullptr) continue;
    any = true;
    for (size_t s = 0; s < r->accepted.size() && s < r->predicted.size(); ++s) {
      const std::vector<float>& c = r->predicted[s];
      if (reached.size() < c.size()) {
        reached.resize(c.size(), 0);
        accepted.resize(c.size(), 0);
        predicted.resize(c.size(), 0.0);
      }
      for (size_t k = 1; k <= c.size() && r->accepted[s] >= static_cast<int32_t>(k) - 1; ++k) {
        ++reached[k - 1];
        predicted[k - 1] += c[k - 1];
        if (r->accepted[s] >= static_cast<int32_t>(k)) ++accepted[k - 1];
      }
    }
    for (const auto& [cutoff, lengths] : r->cut_step_lengths) cuts[cutoff].push_back(&lengths);
  }
  if (!any) return std::nullopt;
  PredictedAcceptanceSummary out;
  for (size_t k = 0; k < reached.size(); ++k) {
    if (reached[k] == 0) continue;
    out.calibration.push_back({static_cast<int32_t>(k + 1), reached[k],
                               predicted[k] / static_cast<double>(reached[k]),
                               static_cast<double>(accepted[k]) / static_cast<double>(reached[k])});
  }
  uint64_t i = 0;
  for (const auto& [cutoff, lists] : cuts) {
    BootstrapOptions o = bootstrap;
    o.seed += 0x9e3779b97f4a7c15ull * ++i;  // independent of the chain's resamples
    out.cutoffs.push_back({cutoff, EstimateTau(lists, o)});
  }
  return out;
}

AcceptanceSummary Summarize(const std::vector<ResponseAcceptance>& responses, int32_t block_size,
                            const SummaryOptions& options) {
  AcceptanceSummary s;
  s.options = options;
  s.block_size = block_size;
  s.responses = static_cast<int64_t>(responses.size());
  const int32_t B = std::max(block_size, 1);
  s.histogram.assign(B, 0);
  s.num_accepted_tokens_per_pos.assign(B - 1, 0);
  s.per_position_acceptance.assign(B - 1, 0.0);
  s.per_position_reached.assign(B - 1, 0);

  std::vector<const std::vector<int32_t>*> dflash_lists;
  for (const ResponseAcceptance& r : responses) {
    dflash_lists.push_back(&r.step_lengths);
    for (int32_t len : r.step_lengths) {
      const int32_t L = std::clamp(len, 1, B);  // precondition: already in range
      ++s.steps;
      ++s.histogram[L - 1];
      const int32_t a = L - 1;  // accepted draft tokens
      s.num_accepted_tokens += a;
      for (int32_t k = 1; k <= a; ++k) ++s.num_accepted_tokens_per_pos[k - 1];
    }
  }
  std::tie(s.tau_mean_of_means, s.tau_pooled) = Tau(dflash_lists);
  if (options.bootstrap.resamples > 0) {
    const TauEstimate e = EstimateTau(dflash_lists, options.bootstrap);
    s.tau_mean_of_means_ci = e.mean_of_means_ci;
    s.tau_pooled_ci = e.pooled_ci;
  }
  s.windows = TauByTokenWindow(dflash_lists, options.token_window, options.bootstrap);

  // vLLM's counters: one draft per step of B − 1 tokens.
  s.num_drafts = s.steps;
  s.num_draft_tokens = s.steps * (B - 1);
  s.acceptance_rate =
      s.num_draft_tokens ? static_cast<double>(s.num_accepted_tokens) / s.num_draft_tokens : 0.0;
  // P(position k accepted | positions < k accepted) = #(a ≥ k) / #(a ≥ k − 1).
  for (int32_t k = 1; k <= B - 1; ++k) {
    const int64_t reached = k == 1 ? s.steps : s.num_accepted_tokens_per_pos[k - 2];
    s.per_position_reached[k - 1] = reached;
    s.per_position_acceptance[k - 1] =
        reached ? static_cast<double>(s.num_accepted_tokens_per_pos[k - 1]) / reached : 0.0;
  }

  std::map<int32_t, std::vector<const std::vector<int32_t>*>> ddtree_lists;
  for (const ResponseAcceptance& r : responses) {
    for (const auto& [budget, lengths] : r.ddtree_step_lengths) {
      ddtree_lists[budget].push_back(&lengths);
    }
  }
  for (const auto& [budget, lists] : ddtree_lists) {
    s.ddtree_tau[budget] = Tau(lists);
    if (options.bootstrap.resamples > 0) {
      BootstrapOptions o = options.bootstrap;
      o.seed += static_cast<uint64_t>(budget) << 32;  // independent of the DFlash resamples
      const TauEstimate e = EstimateTau(lists, o);
      s.ddtree_tau_ci[budget] = {e.mean_of_means_ci, e.pooled_ci};
    }
  }
  s.temperature = SummarizeSampled(responses, options.bootstrap);
  std::vector<const PredictedAcceptance*> predicted;
  for (const ResponseAcceptance& r : responses) {
    if (r.predicted) predicted.push_back(&*r.predicted);
  }
  if (!predicted.empty()) s.predicted_acceptance = SummarizePredicted(predicted, options.bootstrap);
  return s;
}

std::string TreeLabel(const std::string& method, int32_t budget) {
  return absl::StrCat(method == kTreeEagle ? "EAGLE-tree-" : "DDTree-", budget);
}

absl::Status ValidateAcceptance(const std::vector<ResponseAcceptance>& responses,
                                int32_t block_size) {
  if (block_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be at least 2, got ", block_size));
  }
  auto check = [&](size_t r, const std::string& list, const std::vector<int32_t>& lengths) {
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < 1 || lengths[i] > block_size) {
        return absl::InvalidArgumentError(absl::StrCat("responses[", r, "].", list, "[", i,
                                                       "] = ", lengths[i], " is outside [1, ",
                                                       block_size, "]"));
      }
    }
    return absl::OkStatus();
  };
  for (size_t r = 0; r < responses.size(); ++r) {
    absl::Status st = check(r, "step_lengths", responses[r].step_lengths);
    if (!st.ok()) return st;
    for (const auto& [budget, lengths] : responses[r].ddtree_step_lengths) {
      st = check(r, absl::StrCat("ddtree_step_lengths[", budget, "]"), lengths);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::optional<Interval>> IntervalFromJson(const nlohmann::json& j,
                                                         const std::string& key) {
  if (j.is_null()) return std::optional<Interval>();
  if (!j.is_array() || j.size() != 2 || !j[0].is_number() || !j[1].is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary.", key, ": expected [lo, hi] or null"));
  }
  return std::optional<Interval>(Interval{j[0].get<double>(), j[1].get<double>()});
}

}  // namespace

nlohmann::json PredictedAcceptanceJson(const PredictedAcceptanceSummary& p) {
  nlohmann::json calibration = nlohmann::json::array();
  for (const CalibrationRow& row : p.calibration) {
    calibration.push_back({{"position", row.position},
                           {"blocks", row.blocks},
                           {"predicted", row.predicted},
                           {"observed", row.observed},
                           {"gap", row.predicted - row.observed}});
  }
  nlohmann::json cutoffs = nlohmann::json::array();
  for (const CutoffTau& c : p.cutoffs) {
    cutoffs.push_back({{"cutoff", c.cutoff},
                       {"responses", c.tau.responses},
                       {"steps", c.tau.steps},
                       {"tau_mean_of_means", c.tau.mean_of_means},
                       {"tau_mean_of_means_ci", IntervalJson(c.tau.mean_of_means_ci)},
                       {"tau_pooled", c.tau.pooled},
                       {"tau_pooled_ci", IntervalJson(c.tau.pooled_ci)}});
  }
  return {{"calibration", calibration}, {"cutoffs", cutoffs}};
}

std::string AcceptanceSummaryToJson(const AcceptanceSummary& s) {
  nlohmann::json j;
  j["block_size"] = s.block_size;
  j["responses"] = s.responses;
  j["steps"] = s.steps;
  j["tau_mean_of_means"] = s.tau_mean_of_means;
  j["tau_mean_of_means_ci"] = IntervalJson(s.tau_mean_of_means_ci);
  j["tau_pooled"] = s.tau_pooled;
  j["tau_pooled_ci"] = IntervalJson(s.tau_pooled_ci);
  j["confidence"] = s.options.bootstrap.confidence;
  j["bootstrap_resamples"] = s.options.bootstrap.resamples;
  j["bootstrap_seed"] = s.options.bootstrap.seed;
  j["histogram"] = s.histogram;
  nlohmann::json rates = nlohmann::json::array();
  for (size_t k = 0; k < s.per_position_acceptance.size(); ++k) {
    const bool reached = k < s.per_position_reached.size() && s.per_position_reached[k] > 0;
    rates.push_back(reached ? nlohmann::json(s.per_position_acceptance[k]) : nlohmann::json());
  }
  j["per_position_acceptance"] = rates;
  j["per_position_reached"] = s.per_position_reached;
  j["num_drafts"] = s.num_drafts;
  j["num_draft_tokens"] = s.num_draft_tokens;
  j["num_accepted_tokens"] = s.num_accepted_tokens;
  j["num_accepted_tokens_per_pos"] = s.num_accepted_tokens_per_pos;
  j["acceptance_rate"] = s.acceptance_rate;
  nlohmann::json dd = nlohmann::json::object();
  for (const auto& [budget, tau] : s.ddtree_tau) {
    nlohmann::json e = {{"tau_mean_of_means", tau.first}, {"tau_pooled", tau.second}};
    auto ci = s.ddtree_tau_ci.find(budget);
    e["tau_mean_of_means_ci"] = ci == s.ddtree_tau_ci.end() ? nullptr : IntervalJson(ci->second.first);
    e["tau_pooled_ci"] = ci == s.ddtree_tau_ci.end() ? nullptr : IntervalJson(ci->second.second);
    dd[std::to_string(budget)] = e;
  }
  j["ddtree_tau"] = dd;
  j["token_window"] = s.options.token_window;
  nlohmann::json windows = nlohmann::json::array();
  for (const TokenWindow& w : s.windows) {
    windows.push_back({{"first_token", w.first_token},
                       {"last_token", w.last_token},
                       {"responses", w.tau.responses},
                       {"steps", w.tau.steps},
                       {"tau_mean_of_means", w.tau.mean_of_means},
                       {"tau_mean_of_means_ci", IntervalJson(w.tau.mean_of_means_ci)},
                       {"tau_pooled", w.tau.pooled},
                       {"tau_pooled_ci", IntervalJson(w.tau.pooled_ci)}});
  }
  j["windows"] = windows;
  nlohmann::json temperature = nlohmann::json::array();
  for (const TemperatureSummary& t : s.temperature) {
    temperature.push_back({{"temperature", t.setting.temperature},
                           {"top_p", t.setting.top_p},
                           {"top_k", t.setting.top_k},
                           {"rule", t.rule},
                           {"teacher_forced", true},
                           {"blocks", t.blocks},
                           {"tau_prob", t.tau_prob},
                           {"tau_prob_ci", IntervalJson(t.tau_prob_ci)},
                           {"tau_prob_pooled", t.tau_prob_pooled},
                           {"alpha", t.alpha},
                           {"alpha_blocks", t.alpha_blocks}});
  }
  j["temperature"] = temperature;
  if (s.predicted_acceptance) {
    j["predicted_acceptance"] = PredictedAcceptanceJson(*s.predicted_acceptance);
  }
  j["tree"] = {{"method", s.tree_method}, {"depth", s.tree_depth}, {"top_k", s.tree_top_k}};
  j["loop"] = s.loop;
  if (s.live) {
    const LiveSummary& l = *s.live;
    j["live"] = {{"temperature", l.setting.temperature},
                 {"top_p", l.setting.top_p},
                 {"top_k", l.setting.top_k},
                 {"rule", l.rule},
                 {"seed", l.seed},
                 {"verify_calls", l.verify_calls},
                 {"drafted_tokens", l.drafted_tokens},
                 {"accepted_tokens", l.accepted_tokens},
                 {"drafter_seconds", l.drafter_seconds},
                 {"target_seconds", l.target_seconds},
                 {"self_check_prompts", l.self_check_prompts},
                 {"self_check_matching", l.self_check_matching},
                 {"self_check_mismatches", l.self_check_mismatches}};
  }
  return j.dump();
}

absl::StatusOr<AcceptanceSummary> AcceptanceSummaryFromJson(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("summary: not a JSON object");
  }
  AcceptanceSummary s;
  std::string key;
  try {
    auto get = [&](const char* k, auto& v) {
      key = k;
      if (j.contains(k) && !j[k].is_null()) j[k].get_to(v);
    };
    get("block_size", s.block_size);
    get("responses", s.responses);
    get("steps", s.steps);
    get("tau_mean_of_means", s.tau_mean_of_means);
    get("tau_pooled", s.tau_pooled);
    get("histogram", s.histogram);
    get("per_position_reached", s.per_position_reached);
    get("num_drafts", s.num_drafts);
    get("num_draft_tokens", s.num_draft_tokens);
    get("num_accepted_tokens", s.num_accepted_tokens);
    get("num_accepted_tokens_per_pos", s.num_accepted_tokens_per_pos);
    get("acceptance_rate", s.acceptance_rate);
    get("confidence", s.options.bootstrap.confidence);
    get("bootstrap_resamples", s.options.bootstrap.resamples);
    get("bootstrap_seed", s.options.bootstrap.seed);
    get("token_window", s.options.token_window);
    key = "per_position_acceptance";
    if (j.contains(key)) {
      for (const auto& v : j[key]) s.per_position_acceptance.push_back(v.is_null() ? 0.0 : v.get<double>());
    }
    for (const char* k : {"tau_mean_of_means_ci", "tau_pooled_ci"}) {
      if (!j.contains(k)) continue;
      auto ci = IntervalFromJson(j[k], k);
      if (!ci.ok()) return ci.status();
      (std::string(k) == "tau_pooled_ci" ? s.tau_pooled_ci : s.tau_mean_of_means_ci) = *ci;
    }
    key = "ddtree_tau";
    if (j.contains(key)) {
      for (const auto& [budget, v] : j[key].items()) {
        const int32_t b = std::stoi(budget);
        s.ddtree_tau[b] = {v.value("tau_mean_of_means", 0.0), v.value("tau_pooled", 0.0)};
        auto m = IntervalFromJson(v.value("tau_mean_of_means_ci", nlohmann::json()),
                                  "ddtree_tau." + budget + ".tau_mean_of_means_ci");
        if (!m.ok()) return m.status();
        auto p = IntervalFromJson(v.value("tau_pooled_ci", nlohmann::json()),
                                  "ddtree_tau." + budget + ".tau_pooled_ci");
        if (!p.ok()) return p.status();
        if (*m || *p) s.ddtree_tau_ci[b] = {*m, *p};
      }
    }
    key = "windows";
    if (j.contains(key)) {
      for (const auto& w : j[key]) {
        TokenWindow t;
        t.first_token = w.at("first_token").get<int64_t>();
        t.last_token = w.at("last_token").get<int64_t>();
        t.tau.responses = w.value("responses", int64_t{0});
        t.tau.steps = w.value("steps", int64_t{0});
        t.tau.mean_of_means = w.value("tau_mean_of_means", 0.0);
        t.tau.pooled = w.value("tau_pooled", 0.0);
        auto m = IntervalFromJson(w.value("tau_mean_of_means_ci", nlohmann::json()), "windows");
        if (!m.ok()) return m.status();
        auto p = IntervalFromJson(w.value("tau_pooled_ci", nlohmann::json()), "windows");
        if (!p.ok()) return p.status();
        t.tau.mean_of_means_ci = *m;
        t.tau.pooled_ci = *p;
        s.windows.push_back(t);
      }
    }
    key = "temperature";
    if (j.contains(key)) {
      for (const auto& v : j[key]) {
        TemperatureSummary t;
        t.setting.temperature = v.at("temperature").get<double>();
        t.setting.top_p = v.value("top_p", 1.0);
        t.setting.top_k = v.value("top_k", 0);
        t.rule = v.at("rule").get<std::string>();
        t.blocks = v.value("blocks", int64_t{0});
        t.tau_prob = v.value("tau_prob", 0.0);
        t.tau_prob_pooled = v.value("tau_prob_pooled", 0.0);
        auto ci = IntervalFromJson(v.value("tau_prob_ci", nlohmann::json()), "temperature");
        if (!ci.ok()) return ci.status();
        t.tau_prob_ci = *ci;
        t.alpha = v.value("alpha", std::vector<double>{});
        t.alpha_blocks = v.value("alpha_blocks", std::vector<int64_t>{});
        s.temperature.push_back(t);
      }
    }
    key = "predicted_acceptance";
    if (j.contains(key) && !j[key].is_null()) {
      PredictedAcceptanceSummary p;
      for (const auto& row : j[key].at("calibration")) {
        p.calibration.push_back({row.at("position").get<int32_t>(), row.at("blocks").get<int64_t>(),
                                 row.at("predicted").get<double>(),
                                 row.at("observed").get<double>()});
      }
      for (const auto& c : j[key].at("cutoffs")) {
        CutoffTau t;
        t.cutoff = c.at("cutoff").get<double>();
        t.tau.responses = c.value("responses", int64_t{0});
        t.tau.steps = c.value("steps", int64_t{0});
        t.tau.mean_of_means = c.at("tau_mean_of_means").get<double>();
        t.tau.pooled = c.at("tau_pooled").get<double>();
        auto m = IntervalFromJson(c.value("tau_mean_of_means_ci", nlohmann::json()), key);
        if (!m.ok()) return m.status();
        auto pooled = IntervalFromJson(c.value("tau_pooled_ci", nlohmann::json()), key);
        if (!pooled.ok()) return pooled.status();
        t.tau.mean_of_means_ci = *m;
        t.tau.pooled_ci = *pooled;
        p.cutoffs.push_back(t);
      }
      s.predicted_acceptance = std::move(p);
    }
    key = "tree";
    if (j.contains(key)) {
      s.tree_method = j[key].at("method").get<std::string>();
      s.tree_depth = j[key].value("depth", 0);
      s.tree_top_k = j[key].value("top_k", 0);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("summary.", key, ": ", e.what()));
  }
  return s;
}

}  // namespace specwire
