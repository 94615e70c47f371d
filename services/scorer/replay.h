// The greedy acceptance replay (shared DESIGN "Acceptance (greedy)"): the real DFlash loop run on
// the target's greedy trajectory, whose features come from the extractor.
//
//   start = P (prompt length); context = features of positions < start
//   loop while start < T:  block = [traj[start], MASK × (B−1)] at positions [start, start+B)
//        drafts d_1..d_{B−1} = argmax of the drafter's logits
//        a = number of leading k with d_k == traj[start + k]  (beyond the trajectory: mismatch)
//        record a + 1; append context rows [start, start + a + 1); start += a + 1
// DDTree-N from the same draft pass: best-first tree of at most N non-root nodes over the
// per-position top-k log-probs; accepted = longest root path matching the trajectory.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "services/scorer/acceptance.h"
#include "services/scorer/drafter.h"

namespace specwire {

struct ReplayOptions {
  std::vector<int32_t> ddtree_budgets = {8};
};

class AcceptanceReplay {
 public:
  explicit AcceptanceReplay(DFlashDrafter* drafter) : drafter_(drafter) {}

  // trajectory: prompt + greedy completion token ids [T]; features: [T, n × H] target features
  // of every position (concatenated target_layer_ids states); prompt_len: P (≥ 1).
  ResponseAcceptance Run(const std::vector<int64_t>& trajectory, const at::Tensor& features,
                         int64_t prompt_len, const ReplayOptions& options);

 private:
  DFlashDrafter* drafter_;
};

// DDTree over per-position log-probs [B−1, V] (rows = draft positions 1..B−1): returns the number
// of accepted draft tokens (a) of the best-first tree with at most `budget` non-root nodes, given
// the trajectory continuation `truth` (size ≥ B−1; entries past the trajectory are −1).
int32_t DDTreeAccepted(const at::Tensor& log_probs, const std::vector<int64_t>& truth,
                       int32_t budget);

}  // namespace specwire
