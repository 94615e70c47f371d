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

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "common/models/speculative_sampling.h"
#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/drafters/block_drafter.h"

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

// One response to replay: the views must outlive the call.
struct ReplayInput {
  const std::vector<int64_t>* trajectory;  // prompt + greedy completion [T]
  const at::Tensor* features;              // [T, n × H]
  int64_t prompt_len;                      // P ≥ 1
  int64_t max_length = 0;                  // per response; 0: options.max_length, then T
};

class AcceptanceReplay {
 public:
  explicit AcceptanceReplay(BlockDrafter* drafter) : drafter_(drafter) {}

  // trajectory: prompt + greedy completion token ids [T]; features: [T, n × H] target features
  // of every position (concatenated target_layer_ids states); prompt_len: P (≥ 1). Throws
  // c10::Error on inconsistent input (callers at the edge use RunGuarded).
  ResponseAcceptance Run(const std::vector<int64_t>& trajectory, const at::Tensor& features,
                         int64_t prompt_len, const ReplayOptions& options);
  // Several responses, replayed in lockstep batches of options.max_batch: each response's steps
  // are exactly those of Run; only the matrix products are shared. A family that predicts its
  // acceptance (sessions whose PredictedAcceptance is defined: DSpark's confidence head) gets
  // each chain step's record in ResponseAcceptance::predicted (no cutoffs: CutoffStepLengths).
  std::vector<ResponseAcceptance> RunBatch(const std::vector<ReplayInput>& inputs,
                                           const ReplayOptions& options);

 private:
  // Step lengths of each input under DFlash (budget 0) or DDTree-budget acceptance; with
  // `predicted`, each step's accepted drafts and the sessions' predictions (left empty for a
  // family that predicts nothing).
  std::vector<std::vector<int32_t>> RunLoops(const std::vector<ReplayInput>& inputs,
                                             const std::vector<int64_t>& max_lengths,
                                             int32_t ddtree_budget, bool full_logits,
                                             std::vector<PredictedAcceptance>* predicted = nullptr);

  BlockDrafter* drafter_;  // not owned
};

// The step lengths of each cutoff's adaptive verify length (acceptance.h's
// PredictedAcceptance), from a family that predicts its acceptance: one greedy loop per cutoff.
// Throws c10::Error like Run, and when the family predicts nothing.
std::map<double, std::vector<int32_t>> CutoffStepLengths(BlockDrafter* drafter,
                                                         const std::vector<int64_t>& trajectory,
                                                         const at::Tensor& features,
                                                         int64_t prompt_len, int64_t max_length,
                                                         const std::vector<double>& cutoffs);

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

}  // namespace specwire
