#include "services/scorer/replay.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <queue>

namespace specwire {
namespace {

class DFlashSession : public DraftSession {
 public:
  DFlashSession(const DFlashDrafter* drafter, int64_t capacity)
      : drafter_(drafter), cache_(drafter->NewCache(capacity)) {}
  void AppendContext(const at::Tensor& features) override {
    drafter_->AppendContext(*cache_, features);
  }
  at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len) override {
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
                     const std::vector<at::Tensor>& features) override {
    drafter_->AppendContext(Caches(sessions), features);
  }

  at::Tensor DraftLogits(const std::vector<DraftSession*>& sessions,
                         const std::vector<int64_t>& anchors, const std::vector<int64_t>& starts,
                         int64_t len) override {
    at::Tensor hidden = drafter_->DraftHidden(Caches(sessions), anchors, starts, len);
    return drafter_->Logits(hidden.narrow(1, 1, len - 1));  // [R, len − 1, V]
  }

  std::vector<int64_t> AcceptedDrafts(const std::vector<DraftSession*>& sessions,
                                      const std::vector<int64_t>& anchors,
                                      const std::vector<int64_t>& starts, int64_t len,
                                      const std::vector<std::vector<int64_t>>& truths) override {
    const int64_t R = static_cast<int64_t>(sessions.size());
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

void BlockDrafter::AppendContext(const std::vector<DraftSession*>& sessions,
                                 const std::vector<at::Tensor>& features) {
  for (size_t r = 0; r < sessions.size(); ++r) sessions[r]->AppendContext(features[r]);
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
  std::vector<int64_t> start(R);
  for (int64_t r = 0; r < R; ++r) {
    sessions.push_back(
        drafter_->NewSession(static_cast<int64_t>(inputs[r].trajectory->size()) + B));
    all.push_back(sessions.back().get());
    rows.push_back(inputs[r].features->narrow(0, 0, inputs[r].prompt_len));
    start[r] = inputs[r].prompt_len;
  }
  drafter_->AppendContext(all, rows);

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
        start[r] += produced;
      }
    }
    drafter_->AppendContext(stepped, rows);
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
