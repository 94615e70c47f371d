#include "services/scorer/acceptance/acceptance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace specwire {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Three responses, B = 4: lengths {1, 3, 4}, {2}, {} (a first completion token that stopped).
std::vector<ResponseAcceptance> HandMade() {
  std::vector<ResponseAcceptance> r(3);
  r[0].step_lengths = {1, 3, 4};
  r[0].ddtree_step_lengths[8] = {4, 4};
  r[1].step_lengths = {2};
  r[1].ddtree_step_lengths[8] = {1, 2, 3};
  return r;
}

TEST(SummarizeTest, TauMeanOfMeansAndPooled) {
  AcceptanceSummary s = Summarize(HandMade(), 4);
  EXPECT_EQ(s.block_size, 4);
  EXPECT_EQ(s.responses, 3);
  EXPECT_EQ(s.steps, 4);
  // dflash: mean over responses (with steps) of each response's mean = (8/3 + 2) / 2.
  EXPECT_DOUBLE_EQ(s.tau_mean_of_means, (8.0 / 3.0 + 2.0) / 2.0);
  // pooled: 10 committed tokens over 4 steps.
  EXPECT_DOUBLE_EQ(s.tau_pooled, 10.0 / 4.0);
}

TEST(SummarizeTest, HistogramAndConditionalPerPosition) {
  AcceptanceSummary s = Summarize(HandMade(), 4);
  EXPECT_THAT(s.histogram, ElementsAre(1, 1, 1, 1));  // lengths 1, 2, 3, 4 once each
  // a = 0, 2, 3, 1: #(a ≥ 1) = 3, #(a ≥ 2) = 2, #(a ≥ 3) = 1.
  EXPECT_THAT(s.num_accepted_tokens_per_pos, ElementsAre(3, 2, 1));
  // P(k | < k): 3/4, 2/3, 1/2.
  EXPECT_THAT(
      s.per_position_acceptance,
      ElementsAre(DoubleNear(0.75, 1e-15), DoubleNear(2.0 / 3.0, 1e-15), DoubleNear(0.5, 1e-15)));
}

TEST(SummarizeTest, VllmCounters) {
  AcceptanceSummary s = Summarize(HandMade(), 4);
  EXPECT_EQ(s.num_drafts, 4);
  EXPECT_EQ(s.num_draft_tokens, 12);  // 4 drafts × (B − 1)
  EXPECT_EQ(s.num_accepted_tokens, 6);
  EXPECT_DOUBLE_EQ(s.acceptance_rate, 0.5);
}

TEST(SummarizeTest, DDTreeTau) {
  AcceptanceSummary s = Summarize(HandMade(), 4);
  ASSERT_EQ(s.ddtree_tau.count(8), 1u);
  EXPECT_DOUBLE_EQ(s.ddtree_tau[8].first, (4.0 + 2.0) / 2.0);
  EXPECT_DOUBLE_EQ(s.ddtree_tau[8].second, 14.0 / 5.0);
}

TEST(SummarizeTest, PerfectAndWorstDrafters) {
  std::vector<ResponseAcceptance> r(2);
  r[0].step_lengths = {8, 8, 8};
  r[1].step_lengths = {1, 1};
  AcceptanceSummary s = Summarize(r, 8);
  EXPECT_DOUBLE_EQ(s.tau_mean_of_means, 4.5);  // (8 + 1) / 2
  EXPECT_DOUBLE_EQ(s.tau_pooled, 26.0 / 5.0);
  EXPECT_THAT(s.histogram, ElementsAre(2, 0, 0, 0, 0, 0, 0, 3));
  // 3 of 5 drafts pass position 1, all of those pass the rest.
  EXPECT_DOUBLE_EQ(s.per_position_acceptance[0], 0.6);
  for (int k = 1; k < 7; ++k) EXPECT_DOUBLE_EQ(s.per_position_acceptance[k], 1.0);
  EXPECT_EQ(s.num_accepted_tokens, 21);
}

TEST(SummarizeTest, EmptyInputIsAllZero) {
  AcceptanceSummary s = Summarize({}, 16);
  EXPECT_EQ(s.steps, 0);
  EXPECT_EQ(s.tau_mean_of_means, 0);
  EXPECT_EQ(s.tau_pooled, 0);
  EXPECT_EQ(s.histogram.size(), 16u);
  EXPECT_EQ(s.per_position_acceptance.size(), 15u);
  EXPECT_EQ(s.acceptance_rate, 0);
  // Positions never reached have rate 0, not NaN.
  std::vector<ResponseAcceptance> r(1);
  r[0].step_lengths = {1};
  s = Summarize(r, 4);
  EXPECT_THAT(s.per_position_acceptance, ElementsAre(0.0, 0.0, 0.0));
}

TEST(ValidateAcceptanceTest, NamesTheOffendingStep) {
  std::vector<ResponseAcceptance> r = HandMade();
  EXPECT_TRUE(ValidateAcceptance(r, 4).ok());
  r[1].step_lengths = {2, 5};
  absl::Status s = ValidateAcceptance(r, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("responses[1].step_lengths[1] = 5"));
  r = HandMade();
  r[0].ddtree_step_lengths[8] = {0};
  s = ValidateAcceptance(r, 4);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ddtree_step_lengths[8][0] = 0"));
  EXPECT_EQ(ValidateAcceptance(r, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(AcceptanceSummaryToJsonTest, HoldsEveryField) {
  auto j = nlohmann::json::parse(AcceptanceSummaryToJson(Summarize(HandMade(), 4)));
  EXPECT_EQ(j["steps"], 4);
  EXPECT_DOUBLE_EQ(j["tau_pooled"].get<double>(), 2.5);
  EXPECT_EQ(j["histogram"], nlohmann::json({1, 1, 1, 1}));
  EXPECT_EQ(j["num_accepted_tokens_per_pos"], nlohmann::json({3, 2, 1}));
  EXPECT_DOUBLE_EQ(j["ddtree_tau"]["8"]["tau_pooled"].get<double>(), 2.8);
}

}  // namespace
}  // namespace specwire
