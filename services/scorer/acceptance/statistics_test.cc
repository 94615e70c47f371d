// Bootstrap intervals, paired comparisons, token windows and capacity planning (statistics.h),
// their place in the summary (acceptance.h) and in compared reports (compare.h).
#include "services/scorer/acceptance/statistics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "nlohmann/json.hpp"
#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/report/compare.h"

namespace specwire {
namespace {

// Step lengths over 1..B from a truncated geometric law: P(a ≥ i) = r^i for i < B, so
// E[L] = 1 + Σ_{i=1}^{B−1} r^i.
int32_t DrawStep(std::mt19937_64& g, double r, int32_t B) {
  std::uniform_real_distribution<double> u(0, 1);
  int32_t a = 0;
  while (a < B - 1 && u(g) < r) ++a;
  return a + 1;
}

double ExpectedStep(double r, int32_t B) {
  double e = 1, p = 1;
  for (int32_t i = 1; i < B; ++i) e += (p *= r);
  return e;
}

// Responses of mixed difficulty (r drawn from a fixed set) and mixed lengths: both τ's have the
// same true value, the mean of ExpectedStep over the set.
struct Population {
  std::vector<double> rates{0.3, 0.5, 0.7, 0.85};
  int32_t block = 8;
  double truth() const {
    double t = 0;
    for (double r : rates) t += ExpectedStep(r, block);
    return t / rates.size();
  }
  std::vector<std::vector<int32_t>> Draw(std::mt19937_64& g, int n) const {
    std::vector<std::vector<int32_t>> out(n);
    std::uniform_int_distribution<int> which(0, static_cast<int>(rates.size()) - 1);
    std::uniform_int_distribution<int> steps(4, 24);
    for (auto& l : out) {
      const double r = rates[which(g)];
      for (int s = steps(g); s > 0; --s) l.push_back(DrawStep(g, r, block));
    }
    return out;
  }
};

std::vector<const std::vector<int32_t>*> Views(const std::vector<std::vector<int32_t>>& v) {
  std::vector<const std::vector<int32_t>*> out;
  for (const auto& l : v) out.push_back(&l);
  return out;
}

TEST(Bootstrap, IntervalCoversTheTrueTauAtAboutTheNominalRate) {
  const Population pop;
  const double truth = pop.truth();
  std::mt19937_64 g(20261201);
  const int trials = 400;
  int covered_mean = 0, covered_pooled = 0;
  BootstrapOptions o;
  o.resamples = 500;
  for (int t = 0; t < trials; ++t) {
    const auto lists = pop.Draw(g, 40);
    o.seed = static_cast<uint64_t>(t);
    const TauEstimate e = EstimateTau(Views(lists), o);
    ASSERT_TRUE(e.mean_of_means_ci && e.pooled_ci);
    EXPECT_LE(e.mean_of_means_ci->lo, e.mean_of_means);
    EXPECT_GE(e.mean_of_means_ci->hi, e.mean_of_means);
    covered_mean += e.mean_of_means_ci->lo <= truth && truth <= e.mean_of_means_ci->hi;
    covered_pooled += e.pooled_ci->lo <= truth && truth <= e.pooled_ci->hi;
  }
  // 95% nominal; the percentile bootstrap runs slightly narrow at n = 40. A 400-trial binomial
  // at 0.95 lies in [0.925, 0.97] with ~99% probability.
  const double rate_mean = static_cast<double>(covered_mean) / trials;
  const double rate_pooled = static_cast<double>(covered_pooled) / trials;
  EXPECT_GT(rate_mean, 0.90) << rate_mean;
  EXPECT_LT(rate_mean, 0.985) << rate_mean;
  EXPECT_GT(rate_pooled, 0.88) << rate_pooled;
  EXPECT_LT(rate_pooled, 0.985) << rate_pooled;
}

TEST(Bootstrap, AWrongIntervalFailsTheCoverageCheck) {
  // The same check rejects an interval that ignores between-response variation (resampling
  // steps instead of responses): the test above can fail.
  const Population pop;
  const double truth = pop.truth();
  std::mt19937_64 g(7);
  int covered = 0;
  const int trials = 300;
  for (int t = 0; t < trials; ++t) {
    const auto lists = pop.Draw(g, 40);
    std::vector<std::vector<int32_t>> one_per_step;
    for (const auto& l : lists)
      for (int32_t v : l) one_per_step.push_back({v});
    BootstrapOptions o;
    o.resamples = 300;
    o.seed = t;
    const TauEstimate e = EstimateTau(Views(one_per_step), o);
    // The step-level interval is centred on pooled τ but too narrow: steps of one response
    // are not independent.
    covered += e.mean_of_means_ci->lo <= truth && truth <= e.mean_of_means_ci->hi;
  }
  EXPECT_LT(static_cast<double>(covered) / trials, 0.90);
}

TEST(Bootstrap, SeededAndOptional) {
  const Population pop;
  std::mt19937_64 g(1);
  const auto lists = pop.Draw(g, 30);
  BootstrapOptions o;
  o.seed = 42;
  const TauEstimate a = EstimateTau(Views(lists), o), b = EstimateTau(Views(lists), o);
  EXPECT_EQ(a.mean_of_means_ci->lo, b.mean_of_means_ci->lo);
  EXPECT_EQ(a.pooled_ci->hi, b.pooled_ci->hi);
  o.seed = 43;
  const TauEstimate c = EstimateTau(Views(lists), o);
  EXPECT_NE(a.mean_of_means_ci->lo, c.mean_of_means_ci->lo);
  o.resamples = 0;
  const TauEstimate d = EstimateTau(Views(lists), o);
  EXPECT_FALSE(d.mean_of_means_ci);
  EXPECT_DOUBLE_EQ(d.mean_of_means, a.mean_of_means);
  // No steps at all: no τ, no interval.
  const std::vector<std::vector<int32_t>> empty(3);
  const TauEstimate e = EstimateTau(Views(empty), BootstrapOptions{});
  EXPECT_EQ(e.responses, 0);
  EXPECT_FALSE(e.mean_of_means_ci);
}

TEST(Bootstrap, RngIsUniformBelowN) {
  BootstrapRng rng(3);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) ++counts[rng.Below(7)];
  for (int c : counts) EXPECT_NEAR(c, 10000, 400);
}

TEST(Paired, DeltaAndIntervalOnKnownDifferences) {
  const std::vector<std::vector<int32_t>> a{{1, 2, 3}, {4, 4}, {2}, {1, 1, 1, 1}};
  std::vector<std::vector<int32_t>> b = a;
  for (auto& l : b)
    for (int32_t& v : l) v += 1;
  const PairedComparison same = ComparePaired(Views(a), Views(a), BootstrapOptions{});
  EXPECT_EQ(same.delta, 0);
  EXPECT_EQ(same.delta_ci->lo, 0);
  EXPECT_EQ(same.delta_ci->hi, 0);
  EXPECT_EQ(same.ties, 4);
  const PairedComparison up = ComparePaired(Views(a), Views(b), BootstrapOptions{});
  EXPECT_DOUBLE_EQ(up.delta, 1.0);
  EXPECT_NEAR(up.delta_ci->lo, 1.0, 1e-12);  // every prompt improves by exactly 1
  EXPECT_NEAR(up.delta_ci->hi, 1.0, 1e-12);
  EXPECT_EQ(up.b_better, 4);
  // A prompt without steps on one side is left out of the pairs.
  std::vector<std::vector<int32_t>> c = b;
  c[2].clear();
  EXPECT_EQ(ComparePaired(Views(a), Views(c), BootstrapOptions{}).prompts, 3);
}

TEST(Paired, IntervalCoversATrueDifferenceAndIsNarrowerThanUnpaired) {
  // B accepts a little more often on every prompt; prompt difficulty varies a lot, so pairing
  // removes most of the variance.
  const int32_t B = 8;
  std::mt19937_64 g(99);
  std::uniform_real_distribution<double> diff(0.2, 0.85);
  const int trials = 300;
  int covered = 0;
  double width_paired = 0, width_unpaired = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<std::vector<int32_t>> a(40), b(40);
    double true_delta = 0;
    for (int i = 0; i < 40; ++i) {
      const double r = diff(g);
      true_delta += ExpectedStep(r + 0.05, B) - ExpectedStep(r, B);
      for (int s = 0; s < 12; ++s) {
        a[i].push_back(DrawStep(g, r, B));
        b[i].push_back(DrawStep(g, r + 0.05, B));
      }
    }
    true_delta /= 40;  // the prompts are fixed: the target is the mean over them
    BootstrapOptions o;
    o.resamples = 400;
    o.seed = t;
    const PairedComparison p = ComparePaired(Views(a), Views(b), o);
    covered += p.delta_ci->lo <= true_delta && true_delta <= p.delta_ci->hi;
    width_paired += p.delta_ci->hi - p.delta_ci->lo;
    const TauEstimate ea = EstimateTau(Views(a), o), eb = EstimateTau(Views(b), o);
    width_unpaired += std::hypot(ea.mean_of_means_ci->hi - ea.mean_of_means_ci->lo,
                                 eb.mean_of_means_ci->hi - eb.mean_of_means_ci->lo);
  }
  const double rate = static_cast<double>(covered) / trials;
  EXPECT_GT(rate, 0.88) << rate;
  EXPECT_LT(width_paired, 0.6 * width_unpaired);
}

TEST(TokenWindows, StepsBelongToTheWindowOfTheirFirstToken) {
  // Completion token 1 from the prefill; steps commit from token 2: starts 2, 5, 6, 10, 14.
  const std::vector<int32_t> steps{3, 1, 4, 4, 2};
  EXPECT_EQ(StepsInTokenWindow(steps, 1, 4), (std::vector<int32_t>{3}));
  EXPECT_EQ(StepsInTokenWindow(steps, 5, 8), (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(StepsInTokenWindow(steps, 9, 12), (std::vector<int32_t>{4}));
  EXPECT_EQ(StepsInTokenWindow(steps, 13, 16), (std::vector<int32_t>{2}));
  EXPECT_TRUE(StepsInTokenWindow(steps, 17, 20).empty());
  const std::vector<std::vector<int32_t>> lists{steps, {2, 2}};
  const auto w = TauByTokenWindow(Views(lists), 4, BootstrapOptions{0, 0, 0.95});
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0].first_token, 1);
  EXPECT_EQ(w[0].last_token, 4);
  EXPECT_EQ(w[0].tau.steps, 3);  // 3 | 2, 2 (starts 2 and 4)
  EXPECT_DOUBLE_EQ(w[0].tau.mean_of_means, (3.0 + 2.0) / 2);
  EXPECT_EQ(w[1].tau.responses, 1);
  EXPECT_DOUBLE_EQ(w[1].tau.pooled, 2.5);
  // Every step is in exactly one window.
  int64_t total = 0;
  for (const auto& x : w) total += x.tau.steps;
  EXPECT_EQ(total, 7);
}

TEST(Capacity, RecommendationIsTheHandComputedOptimum) {
  // P(a ≥ i) = .90 .72 .50 .30 .10 .02 0 over 100 steps of B = 8.
  const std::vector<int64_t> per_pos{90, 72, 50, 30, 10, 2, 0};
  CapacityOptions o;
  o.drafter_cost = 0.1;
  o.verify_cost_per_token = 0.05;
  // E_k = 1.90 2.62 3.12 3.42 3.52 3.54 3.54; cost 1.1 + .05k; speed-up 1.652 2.183 2.496
  // 2.631 2.607 2.529 2.441: k = 4.
  CapacityPlan p = PlanCapacity(100, per_pos, {{8, 3.7}}, o);
  ASSERT_EQ(p.draft_lengths.size(), 7u);
  EXPECT_NEAR(p.draft_lengths[3].expected_tokens, 3.42, 1e-12);
  EXPECT_NEAR(p.draft_lengths[3].step_cost, 1.3, 1e-12);
  EXPECT_EQ(p.recommended_k, 4);
  EXPECT_NEAR(p.recommended_speedup, 3.42 / 1.3, 1e-12);
  ASSERT_EQ(p.tree_budgets.size(), 1u);
  EXPECT_NEAR(p.tree_budgets[0].step_cost, 1 + 0.05 * 8 + 0.1, 1e-12);
  // Autoregressive drafting pays per draft token: cost 1 + .15k; speed-up 1.652 2.015 2.152
  // 2.1375 2.011: k = 3.
  o.autoregressive = true;
  p = PlanCapacity(100, per_pos, {}, o);
  EXPECT_EQ(p.recommended_k, 3);
  const auto cfg = nlohmann::json::parse(VllmSyntheticConfigJson(p, 3));
  EXPECT_EQ(cfg["num_speculative_tokens"], 3);
  EXPECT_EQ(cfg["rejection_sample_method"], "synthetic");
  EXPECT_EQ(cfg["synthetic_acceptance_rates"], nlohmann::json::parse("[0.9, 0.72, 0.5]"));
  // No steps: no plan.
  EXPECT_EQ(PlanCapacity(0, per_pos, {}, o).recommended_k, 0);
}

TEST(Summary, IntervalsReachedCountsAndWindowsSurviveJson) {
  std::vector<ResponseAcceptance> rs(3);
  rs[0].step_lengths = {1, 1, 2};  // position 3 of B = 4 is never reached
  rs[1].step_lengths = {2, 1};
  rs[2].step_lengths = {};          // first completion token was a stop token
  rs[0].ddtree_step_lengths[4] = {2, 2};
  rs[1].ddtree_step_lengths[4] = {3};
  SummaryOptions o;
  o.token_window = 2;
  const AcceptanceSummary s = Summarize(rs, 4, o);
  EXPECT_EQ(s.per_position_reached, (std::vector<int64_t>{5, 2, 0}));
  ASSERT_TRUE(s.tau_mean_of_means_ci);
  EXPECT_LE(s.tau_mean_of_means_ci->lo, s.tau_mean_of_means);
  ASSERT_TRUE(s.ddtree_tau_ci.count(4));
  EXPECT_FALSE(s.windows.empty());
  const nlohmann::json j = nlohmann::json::parse(AcceptanceSummaryToJson(s));
  EXPECT_TRUE(j["per_position_acceptance"][2].is_null());  // no data, not 0
  EXPECT_DOUBLE_EQ(j["per_position_acceptance"][1].get<double>(), 0.0);  // 0 of 2: a real 0
  auto back = AcceptanceSummaryFromJson(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->per_position_reached, s.per_position_reached);
  EXPECT_EQ(back->tau_mean_of_means_ci->lo, s.tau_mean_of_means_ci->lo);
  EXPECT_EQ(back->windows.size(), s.windows.size());
  EXPECT_EQ(back->ddtree_tau_ci.at(4).second->hi, s.ddtree_tau_ci.at(4).second->hi);
  EXPECT_FALSE(AcceptanceSummaryFromJson("{\"tau_pooled_ci\": [1]}").ok());
}

ScoreReport TwoPromptReport(const std::vector<std::vector<int32_t>>& steps,
                            const std::string& label) {
  ScoreReport r;
  r.labels.drafter = label;
  r.max_new_tokens = 32;
  r.contract.weights_digest = "w";
  r.contract.compute_dtype = "float32";
  std::vector<ResponseAcceptance> rs;
  for (size_t i = 0; i < steps.size(); ++i) {
    PromptScore p;
    p.prompt_index = static_cast<int64_t>(i);
    p.acceptance.step_lengths = steps[i];
    p.acceptance.prompt_tokens = 4;
    p.acceptance.completion_tokens = 20;
    p.trajectory_digest = "xxh3-128:" + std::to_string(i);
    rs.push_back(p.acceptance);
    r.prompts.push_back(p);
  }
  r.summary = Summarize(rs, 4);
  return r;
}

TEST(Compare, PairsReportsOnTheSameTrajectoriesOnly) {
  const ScoreReport a = TwoPromptReport({{1, 2, 1}, {3, 3}, {2, 2, 2}}, "old");
  const ScoreReport b = TwoPromptReport({{2, 2, 2}, {4, 3}, {2, 3, 2}}, "new");
  auto c = CompareReports(a, b, BootstrapOptions{}, 8);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dflash.prompts, 3);
  EXPECT_NEAR(c->dflash.delta, (2 - 4.0 / 3 + 3.5 - 3 + 7.0 / 3 - 2) / 3, 1e-12);
  EXPECT_EQ(c->dflash.b_better, 3);
  EXPECT_FALSE(c->windows.empty());
  const std::string html = ComparisonToHtml(*c);
  EXPECT_NE(html.find("id=\"paired-scatter\""), std::string::npos);
  EXPECT_NE(html.find("id=\"paired-delta\""), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  // Through the JSON files the CLI compares.
  auto ra = ReportFromJson(ReportToJson(a), "a.json");
  auto rb = ReportFromJson(ReportToJson(b), "b.json");
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  auto c2 = CompareReports(*ra, *rb, BootstrapOptions{}, 8);
  ASSERT_TRUE(c2.ok());
  EXPECT_DOUBLE_EQ(c2->dflash.delta, c->dflash.delta);
  EXPECT_EQ(c2->dflash.delta_ci->lo, c->dflash.delta_ci->lo);
  // Same weights, other features (the canary fingerprints drift): paired, with a note.
  ScoreReport drifted = b, base = a;
  base.contract.canary.token_ids = drifted.contract.canary.token_ids = {11};
  base.contract.canary.compute_dtype = drifted.contract.canary.compute_dtype = "float32";
  base.contract.canary.taps = {{"layer.0", 0, 1, 1, {1.0}}, {"layer.1", 0, 1, 1, {1.0}}};
  drifted.contract.canary.taps = {{"layer.0", 0, 1, 1, {1.0}}, {"layer.1", 0, 1, 1, {1.0001}}};
  auto noted = CompareReports(base, drifted, BootstrapOptions{}, 8);
  ASSERT_TRUE(noted.ok());
  ASSERT_FALSE(noted->notes.empty());
  EXPECT_NE(noted->notes.back().find("canary fingerprints differ (drift up to layer.1)"),
            std::string::npos)
      << noted->notes.back();
  EXPECT_TRUE(CompareReports(base, base, BootstrapOptions{}, 8)->notes.empty());
  // A different trajectory, target or length does not pair.
  ScoreReport other = b;
  other.prompts[1].trajectory_digest = "xxh3-128:x";
  auto refused = CompareReports(a, other, BootstrapOptions{}, 8);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("prompt 1"), std::string::npos);
  other = b;
  other.contract.weights_digest = "v";
  EXPECT_EQ(CompareReports(a, other, BootstrapOptions{}, 8).status().code(),
            absl::StatusCode::kFailedPrecondition);
  other = b;
  other.max_new_tokens = 64;
  EXPECT_NE(CompareReports(a, other, BootstrapOptions{}, 8).status().message().find(
                "max_new_tokens"),
            std::string::npos);
  EXPECT_EQ(ReportFromJson("[]", "x.json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ReportFromJson("{\"summary\": {}, \"prompts\": [{\"prompt_index\": \"x\"}]}", "x.json")
                .status()
                .message()
                .find("x.json: prompts[0]"),
            std::string::npos);
}

// Tree budgets pair only between the same tree: DDTree-8 and EAGLE's 8-node tree are not one
// thing scored twice.
TEST(Compare, TreesPairOnlyWithTheSameTree) {
  ScoreReport a = TwoPromptReport({{1, 2, 1}, {3, 3}}, "a");
  ScoreReport b = TwoPromptReport({{2, 2, 2}, {4, 3}}, "b");
  for (ScoreReport* r : {&a, &b}) {
    std::vector<ResponseAcceptance> rs;
    for (PromptScore& p : r->prompts) {
      p.acceptance.ddtree_step_lengths[8] = {2, 2};
      rs.push_back(p.acceptance);
    }
    r->summary = Summarize(rs, 4);
  }
  auto same = CompareReports(a, b, BootstrapOptions{}, 0);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->ddtree.size(), 1u);
  EXPECT_NE(ComparisonTable(*same).find("DDTree-8 tau"), std::string::npos);
  b.summary.tree_method = kTreeEagle;
  b.summary.tree_depth = 3;
  b.summary.tree_top_k = 8;
  auto other = CompareReports(a, b, BootstrapOptions{}, 0);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->ddtree.empty());
  ASSERT_FALSE(other->notes.empty());
  EXPECT_NE(other->notes.back().find("DDTree against EAGLE's tree (depth 3, top-k 8)"),
            std::string::npos)
      << other->notes.back();
  a.summary.tree_method = kTreeEagle;
  a.summary.tree_depth = 3;
  a.summary.tree_top_k = 8;
  auto eagle = CompareReports(a, b, BootstrapOptions{}, 0);
  ASSERT_TRUE(eagle.ok());
  EXPECT_EQ(eagle->ddtree.size(), 1u);
  EXPECT_NE(ComparisonTable(*eagle).find("EAGLE-tree-8 tau"), std::string::npos);
}

}  // namespace
}  // namespace specwire
