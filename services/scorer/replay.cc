#include "services/scorer/replay.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <queue>

namespace specwire {
namespace {

// DFlash2's drafts of one block, from its final-normed hidden states [len, H] (slot 0 the
// anchor's): the selector's path.
std::vector<int64_t> DFlash2Path(const DFlashDrafter& d, const at::Tensor& hidden, int64_t anchor) {
  at::Tensor drafts = hidden.narrow(0, 1, hidden.size(0) - 1);
  return d.SelectPath(drafts, d.Logits(drafts), anchor);
}

// The path as logits: 0 at each draft, −inf elsewhere (its argmax is the path; the sampling
// rules see a point mass).
at::Tensor PathLogits(const std::vector<int64_t>& path, int64_t vocab) {
  at::Tensor out = at::full({static_cast<int64_t>(path.size()), vocab},
                            -std::numeric_limits<float>::infinity(), at::kFloat);
  for (size_t i = 0; i < path.size(); ++i) out[i][path[i]] = 0.0f;
  return out;
}

class DFlashSession : public DraftSession {
 public:
  DFlashSession(const DFlashDrafter* drafter, int64_t capacity)
      : drafter_(drafter), cache_(drafter->NewCache(capacity)) {}
  void AppendContext(const at::Tensor& features, std::span<const int64_t>) override {
    drafter_->AppendContext(*cache_, features);
  }
  at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len) override {
    if (drafter_->config().dflash2) {
      return PathLogits(DFlash2Path(*drafter_, drafter_->DraftHidden(*cache_, anchor, start, len),
                                    anchor),
                        drafter_->config().layers.vocab_size);
    }
    return drafter_->DraftBlock(*cache_, anchor, start, len);
  }
  DraftCache* cache() { return cache_.get(); }

 private:
  const DFlashDrafter* drafter_;       // not owned
  std::unique_ptr<DraftCache> cache_;  // this response's context K/V
};

class DFlashBlockDrafter : public BlockDrafter {
 public:
  explicit DFlashBlockDrafter(const DFlashDrafter* drafter) : drafter_(drafter) {}
  int32_t block_size() const override { return drafter_->config().block_size; }
  std::unique_ptr<DraftSession> NewSession(int64_t capacity) override {
    return std::make_unique<DFlashSession>(drafter_, capacity);
  }

  void AppendContext(const std::vector<DraftSession*>& sessions,
                     const std::vector<at::Tensor>& features,
                     const std::vector<std::vector<int64_t>>&) override {
    drafter_->AppendContext(Caches(sessions), features);
  }

  at::Tensor DraftLogits(const std::vector<DraftSession*>& sessions,
                         const std::vector<int64_t>& anchors, const std::vector<int64_t>& starts,
                         int64_t len) override {
    at::Tensor hidden = drafter_->DraftHidden(Caches(sessions), anchors, starts, len);
    if (drafter_->config().dflash2) {
      std::vector<at::Tensor> rows;
      for (size_t r = 0; r < sessions.size(); ++r) {
        rows.push_back(PathLogits(DFlash2Path(*drafter_, hidden[r], anchors[r]),
                                  drafter_->config().layers.vocab_size));
      }
      return at::stack(rows);
    }
    return drafter_->Logits(hidden.narrow(1, 1, len - 1));  // [R, len − 1, V]
  }

  std::vector<int64_t> AcceptedDrafts(const std::vector<DraftSession*>& sessions,
                                      const std::vector<int64_t>& anchors,
                                      const std::vector<int64_t>& starts, int64_t len,
                                      const std::vector<std::vector<int64_t>>& truths) override {
    const int64_t R = static_cast<int64_t>(sessions.size());
    if (drafter_->config().dflash2) {  // the selector's path, left to right
      at::Tensor hidden = drafter_->DraftHidden(Caches(sessions), anchors, starts, len);
      std::vector<int64_t> accepted(R, 0);
      for (int64_t r = 0; r < R; ++r) {
        const std::vector<int64_t> path = DFlash2Path(*drafter_, hidden[r], anchors[r]);
        while (accepted[r] < len - 1 && path[accepted[r]] == truths[r][accepted[r]]) ++accepted[r];
      }
      return accepted;
    }
    at::Tensor drafts = drafter_->DraftHidden(Caches(sessions), anchors, starts, len)
                            .narrow(1, 1, len - 1);  // [R, len − 1, H]
    std::vector<int64_t> accepted(R, 0);
    std::vector<int64_t> alive(R);  // blocks whose drafts matched so far
    std::iota(alive.begin(), alive.end(), 0);
    // Rows in chunks of 1, 2, 4, ...: at most ~2a + 1 rows of logits for a accepted drafts.
    for (int64_t row = 0, chunk = 1; row < len - 1 && !alive.empty(); row += chunk, chunk *= 2) {
      const int64_t n = std::min(chunk, len - 1 - row);
      at::Tensor rows = drafts.narrow(1, row, n);  // [R, n, H]
      if (static_cast<int64_t>(alive.size()) < R) {
        rows = at::index_select(rows, 0, at::tensor(alive, at::kLong).to(rows.device()));
      }
      at::Tensor ids = drafter_->Logits(rows).argmax(-1).to(at::kCPU).contiguous();  // [A, n]
      const int64_t* d = ids.data_ptr<int64_t>();
      std::vector<int64_t> still;
      for (size_t a = 0; a < alive.size(); ++a) {
        const int64_t r = alive[a];
        int64_t i = 0;
        while (i < n && d[a * n + i] == truths[r][row + i]) ++i;
        accepted[r] += i;
        if (i == n) still.push_back(r);
      }
      alive = std::move(still);
    }
    return accepted;
  }

 private:
  static std::vector<DraftCache*> Caches(const std::vector<DraftSession*>& sessions) {
    std::vector<DraftCache*> caches;
    for (DraftSession* s : sessions) caches.push_back(static_cast<DFlashSession*>(s)->cache());
    return caches;
  }

  const DFlashDrafter* drafter_;  // not owned
};

// A candidate node of the DDTree heap (ddtree's tuple (−logw, ranks, parent, depth, rank, logw)).
struct Candidate {
  double logw;
  std::vector<int32_t> ranks;  // rank per depth along the path: unique per node
  int32_t parent;
  int32_t depth;  // 1-based: row depth − 1 of the table
  int32_t rank;
};

// std::priority_queue pops the largest: "larger" = higher score, then smaller rank path.
struct PopsFirst {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.logw != b.logw) return a.logw < b.logw;
    return b.ranks < a.ranks;  // lexicographic, a shorter prefix is smaller (like Python tuples)
  }
};

}  // namespace

int64_t DraftSession::AcceptedDrafts(int64_t anchor, int64_t start, int64_t len,
                                     const std::vector<int64_t>& truth) {
  at::Tensor drafts = DraftLogits(anchor, start, len).argmax(-1).to(at::kCPU).contiguous();
  TORCH_CHECK(drafts.numel() == len - 1, "drafter returned ", drafts.numel(),
              " drafts for a block of ", len);
  const int64_t* d = drafts.data_ptr<int64_t>();
  int64_t a = 0;
  while (a < len - 1 && d[a] == truth[a]) ++a;
  return a;
}

std::vector<int64_t> NextTokens(const std::vector<int64_t>& traj, int64_t first, int64_t n) {
  std::vector<int64_t> out(n, -1);
  const int64_t T = static_cast<int64_t>(traj.size());
  for (int64_t i = 0; i < n && first + i + 1 < T; ++i) out[i] = traj[first + i + 1];
  return out;
}

void BlockDrafter::AppendContext(const std::vector<DraftSession*>& sessions,
                                 const std::vector<at::Tensor>& features,
                                 const std::vector<std::vector<int64_t>>& next_tokens) {
  for (size_t r = 0; r < sessions.size(); ++r) sessions[r]->AppendContext(features[r], next_tokens[r]);
}

at::Tensor BlockDrafter::DraftLogits(const std::vector<DraftSession*>& sessions,
                                     const std::vector<int64_t>& anchors,
                                     const std::vector<int64_t>& starts, int64_t len) {
  std::vector<at::Tensor> logits;
  for (size_t r = 0; r < sessions.size(); ++r) {
    logits.push_back(sessions[r]->DraftLogits(anchors[r], starts[r], len));
  }
  return at::stack(logits);
}

std::vector<int64_t> BlockDrafter::AcceptedDrafts(const std::vector<DraftSession*>& sessions,
                                                  const std::vector<int64_t>& anchors,
                                                  const std::vector<int64_t>& starts, int64_t len,
                                                  const std::vector<std::vector<int64_t>>& truths) {
  std::vector<int64_t> accepted;
  for (size_t r = 0; r < sessions.size(); ++r) {
    accepted.push_back(sessions[r]->AcceptedDrafts(anchors[r], starts[r], len, truths[r]));
  }
  return accepted;
}

std::unique_ptr<BlockDrafter> MakeBlockDrafter(const DFlashDrafter* drafter) {
  return std::make_unique<DFlashBlockDrafter>(drafter);
}

AcceptanceReplay::AcceptanceReplay(const DFlashDrafter* drafter)
    : owned_(MakeBlockDrafter(drafter)), drafter_(owned_.get()) {}

std::pair<std::vector<std::vector<float>>, std::vector<std::vector<int64_t>>> TopKRows(
    const at::Tensor& log_probs, int64_t k) {
  at::Tensor lp = log_probs.to(at::kCPU, at::kFloat).contiguous();
  const int64_t D = lp.size(0), V = lp.size(1);
  k = std::min(k, V);
  std::vector<std::vector<float>> values(D);
  std::vector<std::vector<int64_t>> tokens(D);
  if (k <= 0 || D == 0) return {values, tokens};
  auto [top_v, top_i] = at::topk(lp, k, -1, /*largest=*/true, /*sorted=*/true);
  // Entries tied with the k-th value may be more than the ranks left for them: count them, and
  // settle those rows by a full scan so that the lower token id wins.
  at::Tensor at_least = (lp >= top_v.narrow(1, k - 1, 1)).sum(-1);  // [D]
  const float* lp_data = lp.data_ptr<float>();
  const auto tv = top_v.accessor<float, 2>();
  const auto ti = top_i.accessor<int64_t, 2>();
  const auto cnt = at_least.accessor<int64_t, 1>();
  for (int64_t d = 0; d < D; ++d) {
    std::vector<std::pair<float, int64_t>> cand;
    if (cnt[d] == k) {
      for (int64_t r = 0; r < k; ++r) cand.emplace_back(tv[d][r], ti[d][r]);
    } else {
      const float threshold = tv[d][k - 1];
      for (int64_t v = 0; v < V; ++v) {
        if (lp_data[d * V + v] >= threshold) cand.emplace_back(lp_data[d * V + v], v);
      }
    }
    std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    cand.resize(k);
    for (const auto& [v, t] : cand) {
      values[d].push_back(v);
      tokens[d].push_back(t);
    }
  }
  return {values, tokens};
}

int32_t DDTreeAcceptedTopK(const std::vector<std::vector<float>>& lp,
                           const std::vector<std::vector<int64_t>>& tok,
                           const std::vector<int64_t>& truth, int32_t budget) {
  const int32_t D = static_cast<int32_t>(lp.size());
  if (budget <= 0 || D == 0 || lp[0].empty()) return 0;
  int64_t k = budget;
  for (const auto& row : lp) k = std::min<int64_t>(k, static_cast<int64_t>(row.size()));

  // child[node]: token → child node; node 0 is the root (the anchor).
  std::vector<std::map<int64_t, int32_t>> child(1);
  std::priority_queue<Candidate, std::vector<Candidate>, PopsFirst> heap;
  heap.push({static_cast<double>(lp[0][0]), {0}, 0, 1, 0});
  int32_t nodes = 0;
  while (!heap.empty() && nodes < budget) {
    Candidate c = heap.top();
    heap.pop();
    const int32_t current = nodes + 1;
    child.emplace_back();
    child[c.parent][tok[c.depth - 1][c.rank]] = current;
    ++nodes;
    if (c.rank + 1 < k) {
      Candidate sibling{c.logw - static_cast<double>(lp[c.depth - 1][c.rank]) +
                            static_cast<double>(lp[c.depth - 1][c.rank + 1]),
                        c.ranks, c.parent, c.depth, c.rank + 1};
      sibling.ranks.back() = c.rank + 1;
      heap.push(std::move(sibling));
    }
    if (c.depth < D) {
      Candidate first_child{c.logw + static_cast<double>(lp[c.depth][0]), c.ranks, current,
                            c.depth + 1, 0};
      first_child.ranks.push_back(0);
      heap.push(std::move(first_child));
    }
  }
  // Greedy verification walks the target's tokens (the trajectory) down the tree.
  int32_t node = 0, accepted = 0;
  while (accepted < D && accepted < static_cast<int32_t>(truth.size()) && truth[accepted] >= 0) {
    auto it = child[node].find(truth[accepted]);
    if (it == child[node].end()) break;
    node = it->second;
    ++accepted;
  }
  return accepted;
}

at::Tensor SamplingDistribution(const at::Tensor& logits, const SamplingSetting& setting) {
  return SamplingDistribution(logits, SamplingParams{setting.temperature, setting.top_p,
                                                     setting.top_k});
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
      at::Tensor draft = session->DraftLogits(traj[start], start, len).to(at::kFloat);  // [len−1, V]
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

int32_t DDTreeAccepted(const at::Tensor& log_probs, const std::vector<int64_t>& truth,
                       int32_t budget) {
  if (budget <= 0 || log_probs.size(0) == 0) return 0;
  auto [values, tokens] = TopKRows(log_probs, budget);
  return DDTreeAcceptedTopK(values, tokens, truth, budget);
}

std::vector<std::vector<int32_t>> AcceptanceReplay::RunLoops(
    const std::vector<ReplayInput>& inputs, const std::vector<int64_t>& max_lengths,
    int32_t ddtree_budget, bool full_logits) {
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
    auto dflash = RunLoops(part, part_max, 0, options.full_logits);
    for (size_t i = first; i < last; ++i) results[i].step_lengths = std::move(dflash[i - first]);
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
