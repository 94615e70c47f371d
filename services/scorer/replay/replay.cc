#include "services/scorer/replay/replay.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <map>

#include "services/scorer/replay/ddtree.h"

namespace specwire {

at::Tensor SamplingDistribution(const at::Tensor& logits, const SamplingSetting& setting) {
  return SamplingDistribution(logits, SamplingParams{setting.temperature, setting.top_p,
                                                     setting.top_k});
}

namespace {

// One greedy loop over a trajectory, each step producing min(a, L) + 1 tokens, L the leading
// drafts whose predicted survival stays at or above `cutoff`.
std::vector<int32_t> CutLoop(BlockDrafter* drafter, const std::vector<int64_t>& traj,
                             const at::Tensor& features, int64_t prompt_len, int64_t max_length,
                             double cutoff) {
  const int64_t T = static_cast<int64_t>(traj.size());
  const int64_t B = drafter->block_size();
  std::unique_ptr<DraftSession> session = drafter->NewSession(T + B + 1);
  session->AppendContext(features.narrow(0, 0, prompt_len), NextTokens(traj, 0, prompt_len));
  std::vector<int32_t> steps;
  for (int64_t start = prompt_len; start + 1 < T;) {
    const int64_t len = std::min<int64_t>(B, max_length - start);
    std::vector<int64_t> truth(len - 1, -1);
    for (int64_t k = 1; k < len && start + k < T; ++k) truth[k - 1] = traj[start + k];
    int64_t a = session->AcceptedDrafts(traj[start], start, len, truth);
    const at::Tensor c = session->PredictedAcceptance();
    TORCH_CHECK(c.defined(), "adaptive verify length: the drafter predicts no acceptance");
    const at::Tensor cpu = c.to(at::kCPU, at::kFloat).contiguous();
    const float* p = cpu.data_ptr<float>();
    int64_t verify = 0;
    double survival = 1.0;
    while (verify < cpu.numel() && (survival *= p[verify]) >= cutoff) ++verify;
    a = std::min(a, verify);
    const int64_t produced = std::min<int64_t>(a + 1, T - 1 - start);
    steps.push_back(static_cast<int32_t>(produced));
    session->AppendContext(features.narrow(0, start, produced), NextTokens(traj, start, produced));
    start += produced;
  }
  return steps;
}

}  // namespace

std::map<double, std::vector<int32_t>> CutoffStepLengths(BlockDrafter* drafter,
                                                         const std::vector<int64_t>& traj,
                                                         const at::Tensor& features,
                                                         int64_t prompt_len, int64_t max_length,
                                                         const std::vector<double>& cutoffs) {
  const int64_t T = static_cast<int64_t>(traj.size());
  if (max_length <= 0) max_length = T;
  TORCH_CHECK(prompt_len >= 1 && prompt_len <= T, "prompt length ", prompt_len, " outside [1, ",
              T, "]");
  std::map<double, std::vector<int32_t>> out;
  for (double cutoff : cutoffs) {
    out[cutoff] = CutLoop(drafter, traj, features, prompt_len, max_length, cutoff);
  }
  return out;
}

std::vector<SampledAcceptance> TeacherForcedAcceptance(
    BlockDrafter* drafter, const std::vector<int64_t>& traj, const at::Tensor& features,
    int64_t prompt_len, int64_t max_length, const std::vector<int32_t>& step_lengths,
    const at::Tensor& final_norm, const at::Tensor& lm_head,
    const std::vector<SamplingSetting>& settings) {
  const int64_t T = static_cast<int64_t>(traj.size());
  const int64_t B = drafter->block_size();
  if (max_length <= 0) max_length = T;
  std::vector<SampledAcceptance> out;
  for (const SamplingSetting& s : settings) {
    for (const char* rule : {kRuleArgmaxDraft, kRuleDraftDistribution}) {
      SampledAcceptance a;
      a.setting = s;
      a.rule = rule;
      a.alpha_sum.assign(B - 1, 0.0);
      a.alpha_blocks.assign(B - 1, 0);
      out.push_back(std::move(a));
    }
  }
  if (out.empty()) return out;
  TORCH_CHECK(final_norm.dim() == 2 && final_norm.size(0) == T,
              "final-norm state: expected [", T, ", H], got ", final_norm.sizes());
  TORCH_CHECK(lm_head.dim() == 2 && lm_head.size(1) == final_norm.size(1),
              "lm_head ", lm_head.sizes(), " does not fit the final-norm state ",
              final_norm.sizes());
  std::unique_ptr<DraftSession> session = drafter->NewSession(T + B);
  session->AppendContext(features.narrow(0, 0, prompt_len), NextTokens(traj, 0, prompt_len));
  int64_t start = prompt_len;
  for (int32_t produced : step_lengths) {
    const int64_t len = std::min<int64_t>(B, max_length - start);
    const int64_t m = std::min<int64_t>(len - 1, T - 2 - start);
    if (len >= 2 && m >= 1) {
      // Teacher forcing: draft position k conditions on the trajectory's tokens before it, as
      // the target's p_k does (families whose positions are independent ignore them).
      std::vector<int64_t> given;
      for (int64_t k = 1; k < len - 1 && start + k < T; ++k) given.push_back(traj[start + k]);
      at::Tensor draft =
          session->DraftLogits(traj[start], start, len, given).to(at::kFloat);  // [len−1, V]
      at::Tensor target = at::matmul(final_norm.narrow(0, start, m).to(lm_head.scalar_type()),
                                     lm_head.t())
                              .to(at::kCPU, at::kFloat);  // [m, V]: tokens start+1 .. start+m
      std::vector<int64_t> argmax(m);
      at::Tensor am = draft.narrow(0, 0, m).argmax(-1).to(at::kCPU);
      for (int64_t k = 0; k < m; ++k) argmax[k] = am[k].item<int64_t>();
      // out holds (argmax_draft, draft_distribution) per setting: p once for both rules.
      for (size_t i = 0; i + 1 < out.size(); i += 2) {
        SampledAcceptance& by_argmax = out[i];
        SampledAcceptance& by_q = out[i + 1];
        double tau[2] = {1, 1}, run[2] = {1, 1};
        for (int64_t k = 0; k < m; ++k) {
          const at::Tensor p = SamplingDistribution(target[k], by_argmax.setting);
          const at::Tensor q = SamplingDistribution(draft[k], by_q.setting);
          const double alpha[2] = {
              std::clamp(p[argmax[k]].item<double>(), 0.0, 1.0),
              std::clamp(at::minimum(p, q).sum().item<double>(), 0.0, 1.0)};
          SampledAcceptance* rule[2] = {&by_argmax, &by_q};
          for (int r = 0; r < 2; ++r) {
            rule[r]->alpha_sum[k] += alpha[r];
            ++rule[r]->alpha_blocks[k];
            run[r] *= alpha[r];
            tau[r] += run[r];
          }
        }
        by_argmax.block_tau.push_back(tau[0]);
        by_q.block_tau.push_back(tau[1]);
      }
    } else {
      for (SampledAcceptance& a : out) a.block_tau.push_back(1.0);
    }
    session->AppendContext(features.narrow(0, start, produced), NextTokens(traj, start, produced));
    start += produced;
  }
  return out;
}

std::vector<std::vector<int32_t>> AcceptanceReplay::RunLoops(
    const std::vector<ReplayInput>& inputs, const std::vector<int64_t>& max_lengths,
    int32_t ddtree_budget, bool full_logits, std::vector<PredictedAcceptance>* predicted) {
  const int64_t R = static_cast<int64_t>(inputs.size());
  const int64_t B = drafter_->block_size();
  std::vector<std::vector<int32_t>> lengths(R);
  std::vector<std::unique_ptr<DraftSession>> sessions;
  std::vector<DraftSession*> all;
  std::vector<at::Tensor> rows;
  std::vector<std::vector<int64_t>> next;
  std::vector<int64_t> start(R);
  for (int64_t r = 0; r < R; ++r) {
    sessions.push_back(
        drafter_->NewSession(static_cast<int64_t>(inputs[r].trajectory->size()) + B));
    all.push_back(sessions.back().get());
    rows.push_back(inputs[r].features->narrow(0, 0, inputs[r].prompt_len));
    next.push_back(NextTokens(*inputs[r].trajectory, 0, inputs[r].prompt_len));
    start[r] = inputs[r].prompt_len;
  }
  drafter_->AppendContext(all, rows, next);

  // Lockstep: every unfinished response drafts its next block; blocks of equal length share a
  // forward (only the last blocks before max_length are shorter).
  while (true) {
    std::map<int64_t, std::vector<int64_t>> by_len;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t T = static_cast<int64_t>(inputs[r].trajectory->size());
      if (start[r] + 1 < T) by_len[std::min(B, max_lengths[r] - start[r])].push_back(r);
    }
    if (by_len.empty()) break;
    std::vector<DraftSession*> stepped;
    rows.clear();
    next.clear();
    for (const auto& [len, group] : by_len) {
      std::vector<DraftSession*> ss;
      std::vector<int64_t> anchors, starts;
      std::vector<std::vector<int64_t>> truths;
      for (int64_t r : group) {
        const std::vector<int64_t>& traj = *inputs[r].trajectory;
        const int64_t T = static_cast<int64_t>(traj.size());
        ss.push_back(sessions[r].get());
        anchors.push_back(traj[start[r]]);
        starts.push_back(start[r]);
        std::vector<int64_t> truth(len - 1, -1);  // −1 past the trajectory: never matches
        for (int64_t k = 1; k < len && start[r] + k < T; ++k) truth[k - 1] = traj[start[r] + k];
        truths.push_back(std::move(truth));
      }
      std::vector<int64_t> accepted;
      if (ddtree_budget <= 0 && !full_logits) {
        accepted = drafter_->AcceptedDrafts(ss, anchors, starts, len, truths);
      } else if (ddtree_budget <= 0) {
        at::Tensor drafts = drafter_->DraftLogits(ss, anchors, starts, len).argmax(-1).to(at::kCPU);
        for (size_t g = 0; g < group.size(); ++g) {
          const int64_t* d = drafts[g].contiguous().data_ptr<int64_t>();
          int64_t a = 0;
          while (a < len - 1 && d[a] == truths[g][a]) ++a;
          accepted.push_back(a);
        }
      } else {
        at::Tensor logits = drafter_->DraftLogits(ss, anchors, starts, len).to(at::kFloat);
        TORCH_CHECK(logits.dim() == 3 && logits.size(0) == static_cast<int64_t>(group.size()) &&
                        logits.size(1) == len - 1,
                    "drafter returned logits ", logits.sizes(), " for ", group.size(),
                    " blocks of ", len);
        // ddtree: top-k of (logits − logsumexp) in fp32.
        at::Tensor log_probs = logits - at::logsumexp(logits, -1, /*keepdim=*/true);
        for (size_t g = 0; g < group.size(); ++g) {
          accepted.push_back(DDTreeAccepted(log_probs[g], truths[g], ddtree_budget));
        }
      }
      for (size_t g = 0; g < group.size(); ++g) {
        const int64_t r = group[g];
        if (predicted != nullptr) {
          if (const at::Tensor c = ss[g]->PredictedAcceptance(); c.defined()) {
            const at::Tensor cpu = c.to(at::kCPU, at::kFloat).contiguous();
            (*predicted)[r].accepted.push_back(static_cast<int32_t>(accepted[g]));
            (*predicted)[r].predicted.emplace_back(cpu.data_ptr<float>(),
                                                   cpu.data_ptr<float>() + cpu.numel());
          }
        }
        const int64_t T = static_cast<int64_t>(inputs[r].trajectory->size());
        const int64_t produced = std::min(accepted[g] + 1, T - 1 - start[r]);
        lengths[r].push_back(static_cast<int32_t>(produced));
        stepped.push_back(sessions[r].get());
        rows.push_back(inputs[r].features->narrow(0, start[r], produced));
        next.push_back(NextTokens(*inputs[r].trajectory, start[r], produced));
        start[r] += produced;
      }
    }
    drafter_->AppendContext(stepped, rows, next);
  }
  return lengths;
}

ResponseAcceptance AcceptanceReplay::Run(const std::vector<int64_t>& trajectory,
                                         const at::Tensor& features, int64_t prompt_len,
                                         const ReplayOptions& options) {
  return RunBatch({ReplayInput{&trajectory, &features, prompt_len, options.max_length}}, options)
      .front();
}

std::vector<ResponseAcceptance> AcceptanceReplay::RunBatch(const std::vector<ReplayInput>& inputs,
                                                           const ReplayOptions& options) {
  c10::InferenceMode guard;
  std::vector<ResponseAcceptance> results(inputs.size());
  std::vector<int64_t> max_lengths;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ReplayInput& in = inputs[i];
    TORCH_CHECK(in.trajectory != nullptr && in.features != nullptr, "input ", i, " is empty");
    const int64_t T = static_cast<int64_t>(in.trajectory->size());
    TORCH_CHECK(in.prompt_len >= 1 && in.prompt_len <= T, "input ", i, ": prompt length ",
                in.prompt_len, " outside [1, ", T, "]");
    TORCH_CHECK(in.features->dim() == 2 && in.features->size(0) == T, "input ", i,
                ": features must be [", T, ", n * hidden], got ", in.features->sizes());
    const int64_t max_length =
        in.max_length > 0 ? in.max_length : (options.max_length > 0 ? options.max_length : T);
    TORCH_CHECK(max_length >= T, "input ", i, ": max_length ", max_length,
                " is shorter than the trajectory (", T, ")");
    max_lengths.push_back(max_length);
    results[i].prompt_tokens = in.prompt_len;
    results[i].completion_tokens = T - in.prompt_len;
  }
  std::vector<int32_t> budgets;
  for (int32_t b : options.ddtree_budgets) {
    if (b > 0 && std::find(budgets.begin(), budgets.end(), b) == budgets.end())
      budgets.push_back(b);
  }
  const size_t batch = std::max<int32_t>(options.max_batch, 1);
  for (size_t first = 0; first < inputs.size(); first += batch) {
    const size_t last = std::min(inputs.size(), first + batch);
    std::vector<ReplayInput> part(inputs.begin() + first, inputs.begin() + last);
    std::vector<int64_t> part_max(max_lengths.begin() + first, max_lengths.begin() + last);
    std::vector<PredictedAcceptance> predicted(part.size());
    auto dflash = RunLoops(part, part_max, 0, options.full_logits, &predicted);
    for (size_t i = first; i < last; ++i) {
      results[i].step_lengths = std::move(dflash[i - first]);
      if (!predicted[i - first].predicted.empty()) {
        results[i].predicted = std::move(predicted[i - first]);
      }
    }
    for (int32_t b : budgets) {
      auto tree = RunLoops(part, part_max, b, false);
      for (size_t i = first; i < last; ++i) {
        results[i].ddtree_step_lengths[b] = std::move(tree[i - first]);
      }
    }
  }
  return results;
}

}  // namespace specwire
