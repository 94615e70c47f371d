// Batched decoding is batch-invariant: a sequence decoded beside others — joining and leaving at
// random steps, in random rows, beside prompts still prefilling — gets bit-identical logits at
// every step to the same sequence decoded alone, for dense and hybrid targets in fp32 and bf16.
// Prompts cross the prefill chunk (kPrefillChunkTokens), so chunked prefill is covered too.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/models/generate.h"
#include "common/models/staggered_schedule.h"
#include "common/models/test_models.h"

namespace specwire {
namespace {

using Case = StaggeredCase;

std::vector<Case> RandomCases(uint64_t seed, int64_t vocab, int n, int arrival_steps) {
  std::mt19937_64 g(seed);
  std::vector<Case> cases(n);
  for (int i = 0; i < n; ++i) {
    // Mostly short prompts, some across one or two prefill chunks.
    const int64_t len = (g() % 4 == 0) ? 1 + g() % (2 * kPrefillChunkTokens + 40) : 1 + g() % 40;
    for (int64_t t = 0; t < len; ++t) cases[i].prompt.push_back(static_cast<int64_t>(g() % vocab));
    cases[i].max_new_tokens = 1 + static_cast<int64_t>(g() % 20);
    cases[i].arrival = static_cast<int64_t>(g() % arrival_steps);
  }
  return cases;
}

void ExpectBatchInvariant(DecoderModel& model, uint64_t seed, const std::string& what,
                          int sequences = 9, int arrival_steps = 12, int64_t min_rows = 3) {
  const std::vector<Case> cases =
      RandomCases(seed, model.config().vocab_size, sequences, arrival_steps);
  std::vector<StepLogits> alone;
  for (const Case& c : cases) {
    absl::StatusOr<StepLogits> logits = DecodeAlone(model, c);
    ASSERT_TRUE(logits.ok()) << logits.status();
    alone.push_back(*std::move(logits));
  }
  std::mt19937_64 g(seed + 1);
  absl::StatusOr<StaggeredRun> run = RunStaggered(model, cases, g, 1000);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<StepLogits>& batched = run->logits;
  const std::vector<std::unique_ptr<GreedySequence>>& seqs = run->sequences;
  const int64_t max_rows = run->max_rows;
  EXPECT_GE(max_rows, min_rows) << what << ": the schedule should decode several rows at once";
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(seqs[i] && seqs[i]->finished()) << what << " case " << i;
    ASSERT_EQ(batched[i].size(), alone[i].size()) << what << " case " << i;
    for (size_t t = 0; t < alone[i].size(); ++t) {
      ASSERT_TRUE(at::equal(batched[i][t], alone[i][t]))
          << what << " case " << i << " (prompt " << cases[i].prompt.size() << " tokens) step "
          << t << ": max |diff| "
          << (batched[i][t].to(at::kDouble) - alone[i][t].to(at::kDouble)).abs().max().item<double>();
    }
  }
}

class BatchedDecode : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(BatchedDecode, DenseRowsEqualTheSequenceAlone) {
  c10::InferenceMode inference;
  auto model = testing::RandomTinyDense(GetParam());
  for (uint64_t seed : {1, 2, 3}) ExpectBatchInvariant(*model, seed, absl::StrCat("dense seed ", seed));
}

TEST_P(BatchedDecode, HybridRowsEqualTheSequenceAlone) {
  c10::InferenceMode inference;
  auto model = testing::RandomTinyHybrid(GetParam());
  for (uint64_t seed : {4, 5, 6}) ExpectBatchInvariant(*model, seed, absl::StrCat("hybrid seed ", seed));
}

// Linear-attention heads as wide as real ones (dk = dv = 64): the stacked recurrence's sums run
// over as many elements as in a served model.
TEST_P(BatchedDecode, WideHybridRowsEqualTheSequenceAlone) {
  c10::InferenceMode inference;
  ModelConfig c = testing::TinyHybridConfig();
  c.linear_key_head_dim = c.linear_value_head_dim = 64;
  c.hidden_size = 96;
  auto model = testing::RandomTinyHybrid(GetParam(), 9, c);
  ExpectBatchInvariant(*model, 7, "wide hybrid");
}

// More rows than a vector register's worth of elementwise work: the stacked rows of sigmoid,
// silu and softplus (the Gated DeltaNet's write strength, decay and output gate, the MLP's
// activation) must not split a row between ATen's vectorised body and its scalar tail
// differently than the row alone (decoder.h: ByBatchRows); up to 24 rows here.
TEST_P(BatchedDecode, ManyRowsEqualTheSequenceAlone) {
  c10::InferenceMode inference;
  auto dense = testing::RandomTinyDense(GetParam());
  ExpectBatchInvariant(*dense, 11, "dense, many rows", 24, 3, 9);
  auto hybrid = testing::RandomTinyHybrid(GetParam());
  ExpectBatchInvariant(*hybrid, 12, "hybrid, many rows", 24, 3, 9);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BatchedDecode, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) {
                           return std::string(info.param == at::kFloat ? "fp32" : "bf16");
                         });

// GreedyGenerate is the same schedule for one sequence: the tokens of a decode step equal the
// argmax of a fresh full forward over everything before it (fp32, a random dense model).
TEST(BatchedDecode, DecodeStepMatchesAFullForward) {
  c10::InferenceMode inference;
  for (auto* make : {+[] { return testing::RandomTinyDense(at::kFloat); },
                     +[] { return testing::RandomTinyHybrid(at::kFloat); }}) {
    auto model = make();
    std::vector<int64_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
    auto r = GreedyGenerate(*model, prompt, NoStops(10));
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<int64_t> seq = prompt;
    for (int64_t expected : r->tokens) {
      at::Tensor ids = at::tensor(seq, at::kLong).view({1, static_cast<int64_t>(seq.size())});
      at::Tensor logits = model->Forward(ids, nullptr, {}, nullptr, LogitsMode::kLast);
      EXPECT_EQ(logits.argmax(-1).item<int64_t>(), expected) << "after " << seq.size();
      seq.push_back(expected);
    }
  }
}

}  // namespace
}  // namespace specwire
