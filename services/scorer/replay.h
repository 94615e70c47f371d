// The greedy acceptance replay (docs/ARCHITECTURE.md, "Contracts"): the real DFlash loop run on
// the target's greedy trajectory, whose features come from the extractor.
//
// It reproduces dflash 0.1.0's `dflash_generate` (temperature 0) step for step. With T the
// trajectory length (prompt + completion, the completion ending at a stop token or at
// max_new_tokens) and max_length = P + max_new_tokens:
//
//   start = P (prompt length); context = features of positions < start
//   loop while start + 1 < T:
//        len = min(B, max_length − start)       (dflash drafts a shorter last block)
//        block = [traj[start], MASK × (len−1)] at positions [start, start+len)
//        drafts d_1..d_{len−1} = argmax of the drafter's logits
//        a = number of leading k with d_k == traj[start + k]  (beyond the trajectory: mismatch)
//        produced = min(a + 1, T − 1 − start)    (dflash cuts the last step at max_length or at
//                                                 the stop token)
//        record produced; append context rows [start, start + produced); start += produced
//
// Σ produced = T − 1 − P: the first completion token comes from the prefill, not from a step.
//
// DDTree-N (Ringel & Romano; liranringel/ddtree `build_ddtree_tree`) runs the same loop with its
// own acceptance: one draft pass per step, a best-first tree of at most N non-root nodes over the
// per-position top-k log-probs (k = min(N, V)), and a = depth of the longest root path matching
// the trajectory (what greedy tree verification commits). Its steps advance by its own
// acceptance, so DDTree-N has its own step list (and τ) on the same trajectory.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <span>
#include <vector>

#include "common/models/speculative_sampling.h"
#include "services/scorer/acceptance.h"
#include "services/scorer/drafter.h"

namespace specwire {

struct ReplayOptions {
  std::vector<int32_t> ddtree_budgets = {8};  // empty: DFlash only
  // dflash's max_length (prompt + max_new_tokens): shortens the last blocks like dflash does.
  // 0: the trajectory length (the completion ran to max_new_tokens).
  int64_t max_length = 0;
  // RunBatch: responses replayed in lockstep, one drafter forward for all their blocks. Bounds
  // the memory of DDTree's logits: max_batch × (B − 1) × V floats.
  int32_t max_batch = 16;
  // DFlash acceptance from all B − 1 rows of logits, like the online loop (no early exit at the
  // first mismatch): the same arithmetic as dflash, for benchmarks.
  bool full_logits = false;
};

// One response's drafting state (the replay's view of a drafter; tests use fakes).
class DraftSession {
 public:
  virtual ~DraftSession() = default;
  // Context rows [n, features] for the next n positions; next_tokens[i] is the token at the
  // position after row i (−1 past the trajectory's end). DFlash ignores them; EAGLE-3 pairs each
  // row's target states with that token.
  virtual void AppendContext(const at::Tensor& features, std::span<const int64_t> next_tokens) = 0;
  // Logits [len−1, V] of the block [anchor, MASK × (len−1)] at [start, start+len); the context
  // covers exactly [0, start).
  virtual at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len) = 0;
  // dflash's greedy acceptance of that block: the number of leading draft tokens (argmax of the
  // logits, first index on ties like torch.argmax) equal to truth[0], truth[1], ... (−1 never
  // matches). The default drafts every position and compares.
  virtual int64_t AcceptedDrafts(int64_t anchor, int64_t start, int64_t len,
                                 const std::vector<int64_t>& truth);
};

// A drafter: block size, sessions, and batched forms of the session calls over sessions it
// made (one block per session, all of length `len`). The batched defaults loop over the
// sessions; the DFlash drafter runs one forward for all of them, and computes the lm_head rows
// of AcceptedDrafts in growing chunks, stopping at each block's first mismatch (the replay
// knows the trajectory; the online loop cannot), which saves most of the head for weak drafters.
class BlockDrafter {
 public:
  virtual ~BlockDrafter() = default;
  virtual int32_t block_size() const = 0;
  virtual std::unique_ptr<DraftSession> NewSession(int64_t capacity) = 0;

  virtual void AppendContext(const std::vector<DraftSession*>& sessions,
                             const std::vector<at::Tensor>& features,
                             const std::vector<std::vector<int64_t>>& next_tokens);
  // [R, len − 1, V] (fp32).
  virtual at::Tensor DraftLogits(const std::vector<DraftSession*>& sessions,
                                 const std::vector<int64_t>& anchors,
                                 const std::vector<int64_t>& starts, int64_t len);
  virtual std::vector<int64_t> AcceptedDrafts(const std::vector<DraftSession*>& sessions,
                                              const std::vector<int64_t>& anchors,
                                              const std::vector<int64_t>& starts, int64_t len,
                                              const std::vector<std::vector<int64_t>>& truths);
};

// The tokens after rows [first, first + n) of a trajectory: traj[first + 1 .. first + n], −1 past
// its end.
std::vector<int64_t> NextTokens(const std::vector<int64_t>& traj, int64_t first, int64_t n);

// DFlashDrafter behind the BlockDrafter interface (the drafter is not owned).
std::unique_ptr<BlockDrafter> MakeBlockDrafter(const DFlashDrafter* drafter);

// One response to replay: the views must outlive the call.
struct ReplayInput {
  const std::vector<int64_t>* trajectory;  // prompt + greedy completion [T]
  const at::Tensor* features;              // [T, n × H]
  int64_t prompt_len;                      // P ≥ 1
  int64_t max_length = 0;                  // per response; 0: options.max_length, then T
};

class AcceptanceReplay {
 public:
  explicit AcceptanceReplay(const DFlashDrafter* drafter);
  explicit AcceptanceReplay(BlockDrafter* drafter) : drafter_(drafter) {}

  // trajectory: prompt + greedy completion token ids [T]; features: [T, n × H] target features
  // of every position (concatenated target_layer_ids states); prompt_len: P (≥ 1). Throws
  // c10::Error on inconsistent input (callers at the edge use RunGuarded).
  ResponseAcceptance Run(const std::vector<int64_t>& trajectory, const at::Tensor& features,
                         int64_t prompt_len, const ReplayOptions& options);
  // Several responses, replayed in lockstep batches of options.max_batch: each response's steps
  // are exactly those of Run; only the matrix products are shared.
  std::vector<ResponseAcceptance> RunBatch(const std::vector<ReplayInput>& inputs,
                                           const ReplayOptions& options);

 private:
  // Step lengths of each input under DFlash (budget 0) or DDTree-budget acceptance.
  std::vector<std::vector<int32_t>> RunLoops(const std::vector<ReplayInput>& inputs,
                                             const std::vector<int64_t>& max_lengths,
                                             int32_t ddtree_budget, bool full_logits);

  std::unique_ptr<BlockDrafter> owned_;
  BlockDrafter* drafter_;
};

// SamplingDistribution (common/models/speculative_sampling.h) at a job's setting.
at::Tensor SamplingDistribution(const at::Tensor& logits, const SamplingSetting& setting);

// Teacher-forced acceptance (the proto's TemperatureAcceptance) at each setting, both rules, on
// the blocks of the greedy replay: step i starts where the replay's steps before it end, drafts
// the block [traj[start], MASK × (len − 1)] on the trajectory's context, and each draft position
// k ≤ min(len − 1, T − 2 − start) is compared with the target's distribution p_k, computed from
// the final-norm state of position start + k − 1 and the target's lm_head [V, H]. At T = 0
// under either rule, block τ_prob equals the replay's step length.
std::vector<SampledAcceptance> TeacherForcedAcceptance(
    BlockDrafter* drafter, const std::vector<int64_t>& trajectory, const at::Tensor& features,
    int64_t prompt_len, int64_t max_length, const std::vector<int32_t>& step_lengths,
    const at::Tensor& final_norm, const at::Tensor& lm_head,
    const std::vector<SamplingSetting>& settings);

// DDTree over per-position log-probs [D, V] (rows = draft positions 1..D): returns the number
// of accepted draft tokens (a) of the best-first tree with at most `budget` non-root nodes, given
// the trajectory continuation `truth` (truth[i] is the token at draft position i + 1; entries
// past the trajectory are −1; a shorter `truth` means mismatch beyond it).
//
// The tree, as ddtree's build_ddtree_tree builds it: per row the top-k tokens (k = min(budget,
// V)); a max-heap of candidate nodes keyed by score = Σ log-prob along the path, seeded with the
// best token of row 0; popping a node adds it to the tree and pushes its next sibling (same
// parent, next rank: score − lp[rank] + lp[rank+1]) and its first child (next row, rank 0:
// score + lp[0]) when depth < D. Scores are doubles accumulated in exactly that order.
// Ties: equal log-probs within a row rank the lower token id first; equal heap scores pop the
// lexicographically smaller rank path first (Python heapq on ddtree's (−score, ranks) tuples).
int32_t DDTreeAccepted(const at::Tensor& log_probs, const std::vector<int64_t>& truth,
                       int32_t budget);

// The same on precomputed top-k tables: top_log_probs[d][r] / top_tokens[d][r] for rank r of
// row d (sorted by the tie rule above, at least min(budget, V) ranks per row).
int32_t DDTreeAcceptedTopK(const std::vector<std::vector<float>>& top_log_probs,
                           const std::vector<std::vector<int64_t>>& top_tokens,
                           const std::vector<int64_t>& truth, int32_t budget);

// Per-row top-k of log_probs [D, V] with the tie rule above: (values [D][k], token ids [D][k]).
std::pair<std::vector<std::vector<float>>, std::vector<std::vector<int64_t>>> TopKRows(
    const at::Tensor& log_probs, int64_t k);

}  // namespace specwire
