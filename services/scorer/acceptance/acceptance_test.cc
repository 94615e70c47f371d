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

// Two responses of a family that predicts its acceptance (B = 4, 3 drafts a block).
TEST(SummarizePredictedTest, CalibrationCountsTheBlocksThatReachedEachPosition) {
  std::vector<ResponseAcceptance> r(2);
  r[0].step_lengths = {1, 4};
  r[0].predicted = PredictedAcceptance{{0, 3}, {{0.5f, 0.25f, 0.75f}, {1.0f, 0.5f, 0.5f}}, {}};
  r[0].predicted->cut_step_lengths[0.5] = {1, 1, 2, 1};
  r[1].step_lengths = {2, 2};
  r[1].predicted = PredictedAcceptance{{1, 1}, {{0.25f, 0.5f, 1.0f}, {0.75f, 0.0f, 0.0f}}, {}};
  r[1].predicted->cut_step_lengths[0.5] = {1, 1, 1, 1};
  const AcceptanceSummary s = Summarize(r, 4, SummaryOptions{{0, 0, 0.95}, 0});
  ASSERT_TRUE(s.predicted_acceptance.has_value());
  const std::vector<CalibrationRow>& c = s.predicted_acceptance->calibration;
  ASSERT_EQ(c.size(), 3u);
  // Position 1: every block (4); accepted in 3 of them (a = 3, 1, 1).
  EXPECT_EQ(c[0].blocks, 4);
  EXPECT_DOUBLE_EQ(c[0].predicted, (0.5 + 1.0 + 0.25 + 0.75) / 4);
  EXPECT_DOUBLE_EQ(c[0].observed, 0.75);
  // Position 2: the blocks with a ≥ 1 (3): accepted by the one with a = 3.
  EXPECT_EQ(c[1].blocks, 3);
  EXPECT_DOUBLE_EQ(c[1].predicted, (0.5 + 0.5 + 0.0) / 3);
  EXPECT_DOUBLE_EQ(c[1].observed, 1.0 / 3);
  EXPECT_EQ(c[2].blocks, 1);
  EXPECT_DOUBLE_EQ(c[2].observed, 1.0);
  ASSERT_EQ(s.predicted_acceptance->cutoffs.size(), 1u);
  const CutoffTau& t = s.predicted_acceptance->cutoffs[0];
  EXPECT_EQ(t.cutoff, 0.5);
  EXPECT_EQ(t.tau.steps, 8);
  EXPECT_DOUBLE_EQ(t.tau.mean_of_means, (5.0 / 4 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(t.tau.pooled, 9.0 / 8);
  // Families without predictions have none.
  EXPECT_FALSE(Summarize(HandMade(), 4).predicted_acceptance.has_value());
  // The JSON carries it and reads back.
  absl::StatusOr<AcceptanceSummary> back = AcceptanceSummaryFromJson(AcceptanceSummaryToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->predicted_acceptance.has_value());
  EXPECT_EQ(back->predicted_acceptance->calibration.size(), 3u);
  EXPECT_DOUBLE_EQ(back->predicted_acceptance->calibration[1].predicted, c[1].predicted);
  EXPECT_DOUBLE_EQ(back->predicted_acceptance->cutoffs[0].tau.pooled, 9.0 / 8);
  const nlohmann::json j = nlohmann::json::parse(AcceptanceSummaryToJson(s));
  EXPECT_DOUBLE_EQ(j["predicted_acceptance"]["calibration"][0]["gap"].get<double>(),
                   c[0].predicted - 0.75);
}

TEST(ParseSurvivalCutoffsTest, SortedInRangeAndNamedWhenWrong) {
  absl::StatusOr<std::vector<double>> ok = ParseSurvivalCutoffs("0.7,0.3,0.7,1", "--cut");
  ASSERT_TRUE(ok.ok());
  EXPECT_THAT(*ok, ElementsAre(0.3, 0.7, 1.0));
  EXPECT_TRUE(ParseSurvivalCutoffs("none", "--cut")->empty());
  EXPECT_TRUE(ParseSurvivalCutoffs("", "--cut")->empty());
  for (const char* bad : {"1.5", "-0.1", "x", "0.5,", "nan"}) {
    absl::StatusOr<std::vector<double>> r = ParseSurvivalCutoffs(bad, "--cut");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("--cut")) << bad;
  }
}

}  // namespace
}  // namespace specwire
