#include "services/scorer/acceptance/statistics.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "common/splitmix.h"
#include "nlohmann/json.hpp"

namespace specwire {

nlohmann::json IntervalJson(const std::optional<Interval>& i) {
  if (!i) return nullptr;
  return nlohmann::json::array({i->lo, i->hi});
}

namespace {

struct ResponseSums {
  double mean = 0;  // τ of the response
  int64_t steps = 0;
  int64_t tokens = 0;
};

std::vector<ResponseSums> SumsOf(const std::vector<const std::vector<int32_t>*>& lists) {
  std::vector<ResponseSums> out;
  for (const std::vector<int32_t>* l : lists) {
    if (l == nullptr || l->empty()) continue;
    ResponseSums r;
    for (int32_t v : *l) r.tokens += v;
    r.steps = static_cast<int64_t>(l->size());
    r.mean = static_cast<double>(r.tokens) / static_cast<double>(r.steps);
    out.push_back(r);
  }
  return out;
}

bool WantIntervals(const BootstrapOptions& o, size_t n) {
  return o.resamples > 0 && n > 0 && o.confidence > 0 && o.confidence < 1;
}

}  // namespace

uint64_t BootstrapRng::Next() {
  const uint64_t z = SplitMix64(state_);
  state_ += kSplitMixIncrement;
  return z;
}

uint64_t BootstrapRng::Below(uint64_t n) {
  // Lemire's multiply-shift with rejection: exactly uniform.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
    if (static_cast<uint64_t>(m) >= threshold) return static_cast<uint64_t>(m >> 64);
  }
}

Interval PercentileInterval(std::vector<double>& values, double confidence) {
  std::sort(values.begin(), values.end());
  auto quantile = [&](double q) {
    const double pos = q * static_cast<double>(values.size() - 1);
    const size_t i = static_cast<size_t>(std::floor(pos));
    const size_t j = std::min(i + 1, values.size() - 1);
    return values[i] + (values[j] - values[i]) * (pos - static_cast<double>(i));
  };
  const double tail = (1 - confidence) / 2;
  return {quantile(tail), quantile(1 - tail)};
}

TauEstimate EstimateTau(const std::vector<const std::vector<int32_t>*>& lists,
                        const BootstrapOptions& options) {
  const std::vector<ResponseSums> r = SumsOf(lists);
  TauEstimate e;
  e.responses = static_cast<int64_t>(r.size());
  int64_t tokens = 0;
  double sum_of_means = 0;
  for (const ResponseSums& x : r) {
    e.steps += x.steps;
    tokens += x.tokens;
    sum_of_means += x.mean;
  }
  if (r.empty()) return e;
  e.mean_of_means = sum_of_means / static_cast<double>(r.size());
  e.pooled = static_cast<double>(tokens) / static_cast<double>(e.steps);
  if (!WantIntervals(options, r.size())) return e;
  BootstrapRng rng(options.seed);
  std::vector<double> means(options.resamples), pooled(options.resamples);
  const uint64_t n = r.size();
  for (int32_t b = 0; b < options.resamples; ++b) {
    double s = 0;
    int64_t st = 0, tk = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const ResponseSums& x = r[rng.Below(n)];
      s += x.mean;
      st += x.steps;
      tk += x.tokens;
    }
    means[b] = s / static_cast<double>(n);
    pooled[b] = static_cast<double>(tk) / static_cast<double>(st);
  }
  e.mean_of_means_ci = PercentileInterval(means, options.confidence);
  e.pooled_ci = PercentileInterval(pooled, options.confidence);
  return e;
}

PairedComparison ComparePaired(const std::vector<const std::vector<int32_t>*>& a,
                               const std::vector<const std::vector<int32_t>*>& b,
                               const BootstrapOptions& options) {
  PairedComparison c;
  std::vector<std::pair<ResponseSums, ResponseSums>> pairs;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    std::vector<ResponseSums> x = SumsOf({a[i]}), y = SumsOf({b[i]});
    if (x.empty() || y.empty()) continue;
    pairs.emplace_back(x[0], y[0]);
  }
  c.prompts = static_cast<int64_t>(pairs.size());
  if (pairs.empty()) return c;
  auto stats = [](const auto& sample_of, uint64_t n) {
    double sa = 0, sb = 0;
    int64_t sta = 0, tka = 0, stb = 0, tkb = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const auto& [x, y] = sample_of(i);
      sa += x.mean;
      sb += y.mean;
      sta += x.steps;
      tka += x.tokens;
      stb += y.steps;
      tkb += y.tokens;
    }
    const double dn = static_cast<double>(n);
    return std::array<double, 4>{sa / dn, sb / dn, static_cast<double>(tka) / sta,
                                 static_cast<double>(tkb) / stb};
  };
  const uint64_t n = pairs.size();
  const auto full = stats([&](uint64_t i) -> const auto& { return pairs[i]; }, n);
  c.tau_a = full[0];
  c.tau_b = full[1];
  c.delta = c.tau_b - c.tau_a;
  c.pooled_a = full[2];
  c.pooled_b = full[3];
  c.delta_pooled = c.pooled_b - c.pooled_a;
  for (const auto& [x, y] : pairs) {
    c.per_prompt.emplace_back(x.mean, y.mean);
    if (y.mean > x.mean) {
      ++c.b_better;
    } else if (x.mean > y.mean) {
      ++c.a_better;
    } else {
      ++c.ties;
    }
  }
  if (!WantIntervals(options, n)) return c;
  BootstrapRng rng(options.seed);
  std::vector<double> d(options.resamples), dp(options.resamples);
  std::vector<uint64_t> idx(n);
  for (int32_t r = 0; r < options.resamples; ++r) {
    for (uint64_t i = 0; i < n; ++i) idx[i] = rng.Below(n);
    const auto s = stats([&](uint64_t i) -> const auto& { return pairs[idx[i]]; }, n);
    d[r] = s[1] - s[0];
    dp[r] = s[3] - s[2];
  }
  c.delta_ci = PercentileInterval(d, options.confidence);
  c.delta_pooled_ci = PercentileInterval(dp, options.confidence);
  return c;
}

std::vector<int32_t> StepsInTokenWindow(const std::vector<int32_t>& steps, int64_t first,
                                        int64_t last) {
  std::vector<int32_t> out;
  int64_t token = 2;  // the first step commits completion token 2 onwards
  for (int32_t len : steps) {
    if (token >= first && token <= last) out.push_back(len);
    if (token > last) break;
    token += len;
  }
  return out;
}

std::vector<TokenWindow> TauByTokenWindow(const std::vector<const std::vector<int32_t>*>& lists,
                                          int64_t window, const BootstrapOptions& options) {
  std::vector<TokenWindow> out;
  if (window <= 0) return out;
  // The last token any step starts at.
  int64_t last_start = 0;
  for (const std::vector<int32_t>* l : lists) {
    if (l == nullptr || l->empty()) continue;
    int64_t token = 2;
    for (size_t i = 0; i + 1 < l->size(); ++i) token += (*l)[i];
    last_start = std::max(last_start, token);
  }
  for (int64_t first = 1; first <= last_start; first += window) {
    const int64_t last = first + window - 1;
    std::vector<std::vector<int32_t>> in(lists.size());
    std::vector<const std::vector<int32_t>*> views;
    for (size_t i = 0; i < lists.size(); ++i) {
      if (lists[i] != nullptr) in[i] = StepsInTokenWindow(*lists[i], first, last);
      views.push_back(&in[i]);
    }
    BootstrapOptions o = options;
    o.seed = options.seed + static_cast<uint64_t>(out.size()) + 1;  // independent per window
    out.push_back({first, last, EstimateTau(views, o)});
  }
  return out;
}

CapacityPlan PlanCapacity(int64_t steps, const std::vector<int64_t>& accepted_per_pos,
                          const std::map<int32_t, double>& ddtree_pooled,
                          const CapacityOptions& options, int32_t tree_drafter_forwards) {
  CapacityPlan p;
  p.options = options;
  if (steps <= 0) return p;
  auto cost = [&](int32_t k, int32_t drafter_forwards) {
    return 1 + options.verify_cost_per_token * k + options.drafter_cost * drafter_forwards;
  };
  double expected = 1;
  for (size_t i = 0; i < accepted_per_pos.size(); ++i) {
    const double u = static_cast<double>(accepted_per_pos[i]) / static_cast<double>(steps);
    p.unconditional.push_back(u);
    expected += u;
    const int32_t k = static_cast<int32_t>(i + 1);
    CapacityRow row{k, expected, cost(k, options.autoregressive ? k : 1), 0};
    row.speedup = row.expected_tokens / row.step_cost;
    p.draft_lengths.push_back(row);
    if (row.speedup > p.recommended_speedup) {  // the smallest k on ties
      p.recommended_speedup = row.speedup;
      p.recommended_k = k;
    }
  }
  for (const auto& [budget, tau] : ddtree_pooled) {
    CapacityRow row{budget, tau, cost(budget, tree_drafter_forwards), 0};
    row.speedup = row.step_cost > 0 ? row.expected_tokens / row.step_cost : 0;
    p.tree_budgets.push_back(row);
  }
  return p;
}

std::string VllmSyntheticConfigJson(const CapacityPlan& plan, int32_t k) {
  k = std::clamp<int32_t>(k, 0, static_cast<int32_t>(plan.unconditional.size()));
  std::vector<double> rates(plan.unconditional.begin(), plan.unconditional.begin() + k);
  nlohmann::json j = {{"num_speculative_tokens", k},
                      {"rejection_sample_method", "synthetic"},
                      {"synthetic_acceptance_rates", rates}};
  return j.dump();
}

}  // namespace specwire
