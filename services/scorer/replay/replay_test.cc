#include "services/scorer/replay/replay.h"

#include "services/scorer/replay/ddtree.h"
#include "services/scorer/replay/live_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

namespace specwire {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kVocab = 16;

// A drafter whose draft token at (start, k) comes from a function; it records every call.
class FakeDrafter : public BlockDrafter {
 public:
  struct Call {
    int64_t anchor, start, len;
  };
  using DraftFn = std::function<int64_t(int64_t start, int64_t k)>;

  FakeDrafter(int32_t block_size, DraftFn fn) : block_size_(block_size), fn_(std::move(fn)) {}
  int32_t block_size() const override { return block_size_; }

  std::unique_ptr<DraftSession> NewSession(int64_t capacity) override {
    return std::make_unique<Session>(this);
  }

  std::vector<Call> calls;
  std::vector<int64_t> appended;  // rows per AppendContext, all sessions

 private:
  class Session : public DraftSession {
   public:
    explicit Session(FakeDrafter* d) : d_(d) {}
    void AppendContext(const at::Tensor& features, std::span<const int64_t>) override {
      d_->appended.push_back(features.size(0));
      context_ += features.size(0);
    }
    at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len,
                           std::span<const int64_t>) override {
      EXPECT_EQ(context_, start) << "context must cover exactly [0, start)";
      d_->calls.push_back({anchor, start, len});
      at::Tensor logits = at::zeros({len - 1, kVocab});
      for (int64_t k = 1; k < len; ++k) logits[k - 1][d_->fn_(start, k)] = 5.0;
      return logits;
    }

   private:
    FakeDrafter* d_;
    int64_t context_ = 0;  // rows appended to this session
  };

  int32_t block_size_;
  DraftFn fn_;
};

std::vector<int64_t> Trajectory(int64_t n) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back((i * 7 + 3) % (kVocab - 1));
  return t;
}

TEST(AcceptanceReplayTest, PerfectDrafterAndTheLastBlocks) {
  const auto traj = Trajectory(10);  // P = 3, 7 completion tokens
  FakeDrafter fake(
      4, [&](int64_t start, int64_t k) { return start + k < 10 ? traj[start + k] : kVocab - 1; });
  AcceptanceReplay replay(&fake);
  ResponseAcceptance r = replay.Run(traj, at::zeros({10, 2}), 3, {{}, 0});
  // start 3: block of 4, all 3 drafts right → 4; start 7: 3 positions left before max_length,
  // so a block of 3, both drafts right, but only 2 tokens remain to commit → 2; start 9 = T − 1.
  EXPECT_THAT(r.step_lengths, ElementsAre(4, 2));
  ASSERT_EQ(fake.calls.size(), 2u);
  EXPECT_EQ(fake.calls[0].len, 4);
  EXPECT_EQ(fake.calls[1].len, 3);
  EXPECT_EQ(fake.calls[1].anchor, traj[7]);
  EXPECT_THAT(fake.appended, ElementsAre(3, 4, 2));  // prompt, then each step's committed rows
  EXPECT_EQ(r.prompt_tokens, 3);
  EXPECT_EQ(r.completion_tokens, 7);
}

TEST(AcceptanceReplayTest, StopTokenEndsTheTrajectoryBeforeMaxLength) {
  const auto traj = Trajectory(10);
  FakeDrafter fake(
      4, [&](int64_t start, int64_t k) { return start + k < 10 ? traj[start + k] : kVocab - 1; });
  AcceptanceReplay replay(&fake);
  // max_length 20: the trajectory ended at a stop token, blocks stay full length.
  ResponseAcceptance r = replay.Run(traj, at::zeros({10, 2}), 3, {{}, 20});
  EXPECT_THAT(r.step_lengths, ElementsAre(4, 2));
  EXPECT_EQ(fake.calls[1].len, 4);
  EXPECT_THROW(replay.Run(traj, at::zeros({10, 2}), 3, {{}, 9}), c10::Error);
}

TEST(AcceptanceReplayTest, WrongDraftsCommitOneTokenPerStep) {
  const auto traj = Trajectory(9);
  FakeDrafter fake(8, [&](int64_t, int64_t) { return kVocab - 1; });
  ResponseAcceptance r = AcceptanceReplay(&fake).Run(traj, at::zeros({9, 2}), 4, {{}, 0});
  EXPECT_THAT(r.step_lengths, ElementsAre(1, 1, 1, 1));  // Σ = T − 1 − P
}

TEST(AcceptanceReplayTest, PartialMatches) {
  const auto traj = Trajectory(20);
  // Drafts right up to position 2 of every block, wrong after.
  FakeDrafter fake(6, [&](int64_t start, int64_t k) {
    return k <= 2 && start + k < 20 ? traj[start + k] : kVocab - 1;
  });
  ResponseAcceptance r = AcceptanceReplay(&fake).Run(traj, at::zeros({20, 2}), 2, {{}, 0});
  // start 2, 5, 8, 11, 14: 3 each; start 17: 2 left to commit.
  EXPECT_THAT(r.step_lengths, ElementsAre(3, 3, 3, 3, 3, 2));
}

TEST(AcceptanceReplayTest, DDTreeRunsItsOwnLoop) {
  const auto traj = Trajectory(12);
  // Argmax right only at position 1; the tree's other branches never help with one-hot logits
  // (all other tokens tie), but budget 1 still accepts the first token.
  FakeDrafter fake(4, [&](int64_t start, int64_t k) {
    return k == 1 && start + k < 12 ? traj[start + k] : kVocab - 1;
  });
  ResponseAcceptance r = AcceptanceReplay(&fake).Run(traj, at::zeros({12, 2}), 2, {{1, 3}, 0});
  EXPECT_THAT(r.step_lengths, ElementsAre(2, 2, 2, 2, 1));
  EXPECT_THAT(r.ddtree_step_lengths[1], ElementsAre(2, 2, 2, 2, 1));
  ASSERT_EQ(r.ddtree_step_lengths.count(3), 1u);
}

TEST(AcceptanceReplayTest, RunBatchEqualsRunPerResponse) {
  // Three responses of different lengths and budgets, drafts right for k <= (start % 4).
  std::vector<std::vector<int64_t>> trajs = {Trajectory(23), Trajectory(9), Trajectory(17)};
  auto fn = [&](int64_t start, int64_t k) -> int64_t {
    return k <= start % 4 ? (start + k < 23 ? Trajectory(23)[start + k] : 0) : kVocab - 1;
  };
  std::vector<at::Tensor> feats = {at::zeros({23, 2}), at::zeros({9, 2}), at::zeros({17, 2})};
  std::vector<int64_t> prompts = {3, 2, 5}, max_lengths = {30, 0, 17};
  ReplayOptions options{{1, 4}, 0, /*max_batch=*/2};
  std::vector<ReplayInput> inputs;
  for (int i = 0; i < 3; ++i) inputs.push_back({&trajs[i], &feats[i], prompts[i], max_lengths[i]});
  FakeDrafter batched(5, fn);
  std::vector<ResponseAcceptance> all = AcceptanceReplay(&batched).RunBatch(inputs, options);
  ASSERT_EQ(all.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    FakeDrafter single(5, fn);
    ReplayOptions one = options;
    one.max_length = max_lengths[i];
    ResponseAcceptance r = AcceptanceReplay(&single).Run(trajs[i], feats[i], prompts[i], one);
    EXPECT_EQ(all[i].step_lengths, r.step_lengths) << i;
    EXPECT_EQ(all[i].ddtree_step_lengths, r.ddtree_step_lengths) << i;
    EXPECT_EQ(all[i].prompt_tokens, prompts[i]);
    int64_t sum = 0;
    for (int32_t l : r.step_lengths) sum += l;
    EXPECT_EQ(sum, static_cast<int64_t>(trajs[i].size()) - 1 - prompts[i]);
  }
}

// --- DDTree on hand-made tables ---------------------------------------------------------------

// log_probs rows (not normalised: the tree only adds them).
at::Tensor Table(std::vector<std::vector<float>> rows) {
  at::Tensor t =
      at::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  for (size_t d = 0; d < rows.size(); ++d) {
    for (size_t v = 0; v < rows[d].size(); ++v) t[d][v] = rows[d][v];
  }
  return t;
}

TEST(DDTreeTest, BestFirstByPathScore) {
  // Row 0: tokens 0, 1, 2 at −1, −2, −3; row 1: −1, −2.5, −4.
  at::Tensor lp = Table({{-1, -2, -3}, {-1, -2.5f, -4}});
  // Budget 1: only token 0 at depth 1.
  EXPECT_EQ(DDTreeAccepted(lp, {0, 0}, 1), 1);
  EXPECT_EQ(DDTreeAccepted(lp, {1, 0}, 1), 0);
  // Budget 2: after (0) [−1], the sibling (1) [−2] and the child (0,0) [−2] tie; the smaller rank
  // path (0,0) pops first (ddtree's heap tuples), so depth 2 is reached before token 1.
  EXPECT_EQ(DDTreeAccepted(lp, {0, 0}, 2), 2);
  EXPECT_EQ(DDTreeAccepted(lp, {1, 0}, 2), 0);
  // Budget 3: (1) joins at −2 (the sibling (0,1) waits at −3.5).
  EXPECT_EQ(DDTreeAccepted(lp, {1, 0}, 3), 1);
  // Then (2) and (1,0) tie at −3: the rank path (1,0) < (2), so budget 4 adds (1,0) and
  // budget 5 adds (2).
  EXPECT_EQ(DDTreeAccepted(lp, {1, 0}, 4), 2);
  EXPECT_EQ(DDTreeAccepted(lp, {2, 0}, 4), 0);
  EXPECT_EQ(DDTreeAccepted(lp, {2, 0}, 5), 1);
  // Entries past the trajectory (−1) and a shorter truth never match.
  EXPECT_EQ(DDTreeAccepted(lp, {0, -1}, 8), 1);
  EXPECT_EQ(DDTreeAccepted(lp, {0}, 8), 1);
  EXPECT_EQ(DDTreeAccepted(lp, {0, 0}, 0), 0);
}

TEST(DDTreeTest, TiedLogProbsRankTheLowerTokenFirst) {
  // Tokens 1 and 2 tie for the best row-0 value: token 1 is rank 0.
  at::Tensor lp = Table({{-2, -1, -1, -5}});
  EXPECT_EQ(DDTreeAccepted(lp, {1}, 1), 1);
  EXPECT_EQ(DDTreeAccepted(lp, {2}, 1), 0);
  EXPECT_EQ(DDTreeAccepted(lp, {2}, 2), 1);
  // Three-way tie at the k-th place (k = 2): tokens 1 and 2 are taken over 3.
  at::Tensor boundary = Table({{-1, -2, -2, -2}});
  EXPECT_EQ(DDTreeAccepted(boundary, {1}, 2), 1);
  EXPECT_EQ(DDTreeAccepted(boundary, {3}, 2), 0);
  auto [values, tokens] = TopKRows(boundary, 3);
  EXPECT_THAT(tokens[0], ElementsAre(0, 1, 2));
  EXPECT_THAT(values[0], ElementsAre(-1, -2, -2));
}

TEST(DDTreeTest, DepthLimitAndBudgetCap) {
  // A confident chain: the argmax path is the whole tree up to depth D.
  at::Tensor lp = Table({{0, -9, -9}, {0, -9, -9}, {0, -9, -9}});
  EXPECT_EQ(DDTreeAccepted(lp, {0, 0, 0}, 3), 3);
  EXPECT_EQ(DDTreeAccepted(lp, {0, 0, 0}, 2), 2);
  EXPECT_EQ(DDTreeAccepted(lp, {0, 0, 0}, 100), 3);  // depth ≤ D
  EXPECT_EQ(DDTreeAccepted(lp, {0, 1, 0}, 100), 3);  // k = min(budget, V): every branch present
  EXPECT_EQ(DDTreeAccepted(lp, {0, 1, 0}, 4), 1);
}

// A chain drafter: position k's logits depend on the token before it (given[k − 2], the anchor
// at k = 1, its own argmax past `given`): the successor of that token is likely, every other
// token possible.
class ChainDrafter : public BlockDrafter {
 public:
  static at::Tensor Row(int64_t before) {
    at::Tensor row = at::arange(kVocab, at::kFloat).mul(0.05);
    row[(before * 5 + 1) % kVocab] += 1.5;
    return row;
  }
  int32_t block_size() const override { return 5; }
  bool conditions_on_drafts() const override { return true; }
  std::unique_ptr<DraftSession> NewSession(int64_t) override { return std::make_unique<Session>(); }

 private:
  class Session : public DraftSession {
   public:
    void AppendContext(const at::Tensor&, std::span<const int64_t>) override {}
    at::Tensor DraftLogits(int64_t anchor, int64_t, int64_t len,
                           std::span<const int64_t> given) override {
      std::vector<at::Tensor> rows;
      int64_t before = anchor;
      for (int64_t k = 1; k < len; ++k) {
        if (k >= 2 && k - 2 < static_cast<int64_t>(given.size())) before = given[k - 2];
        rows.push_back(Row(before));
        before = rows.back().argmax().item<int64_t>();
      }
      return at::stack(rows);
    }
  };
};

// A target that rejects every draft and records what it was sent.
class RecordingTarget : public LiveTarget {
 public:
  absl::StatusOr<Verified> Verify(const std::vector<int64_t>& draft,
                                  const std::vector<float>& draft_probs, bool) override {
    drafts.push_back(draft);
    probs.push_back(draft_probs);
    Verified v;
    v.next_token = static_cast<int64_t>(drafts.size()) % kVocab;
    v.states.push_back(FeatureState{0, DType::kF32, 1, 1, std::vector<std::byte>(4)});
    return v;
  }
  absl::Status Commit(int64_t) override { return absl::OkStatus(); }
  std::vector<std::vector<int64_t>> drafts;
  std::vector<std::vector<float>> probs;
};

TEST(LiveLoopTest, ChainDraftsAreSampledGivenTheDraftsBeforeThem) {
  ChainDrafter drafter;
  RecordingTarget target;
  LiveStart start{{1, 2, 3}, 4, {FeatureState{0, DType::kF32, 3, 1, std::vector<std::byte>(12)}}};
  LiveSettings settings;
  settings.setting = SamplingSetting{1.0, 1, 0};
  settings.rule = kRuleDraftDistribution;
  settings.seed = 7;
  settings.max_new_tokens = 40;
  absl::StatusOr<LiveResult> r = RunLiveLoop(
      &drafter, start, target, settings,
      [](const std::vector<FeatureState>& f) { return at::zeros({f[0].rows, 1}); });
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t pending = 4, off_argmax = 0;
  for (size_t step = 0; step < target.drafts.size(); ++step) {
    const std::vector<int64_t>& d = target.drafts[step];
    ASSERT_EQ(target.probs[step].size(), d.size() * kVocab);
    for (size_t i = 0; i < d.size(); ++i) {
      const int64_t before = i == 0 ? pending : d[i - 1];
      const at::Tensor want = at::softmax(ChainDrafter::Row(before).to(at::kDouble), 0);
      for (int64_t x = 0; x < kVocab; ++x) {
        EXPECT_NEAR(target.probs[step][i * kVocab + x], want[x].item<double>(), 1e-6)
            << "step " << step << " draft " << i << " token " << x;
      }
      const int64_t drawn_from = i == 0 ? -1 : (i == 1 ? pending : d[i - 2]);
      if (i > 0 && d[i - 1] != ChainDrafter::Row(drawn_from).argmax().item<int64_t>()) {
        ++off_argmax;
      }
    }
    pending = static_cast<int64_t>(step + 1) % kVocab;
  }
  EXPECT_GT(off_argmax, 5) << "the draws must leave the argmax chain for the test to mean much";
}

}  // namespace
}  // namespace specwire
