#include "services/scorer/replay/ddtree.h"

#include <algorithm>
#include <queue>

namespace specwire {
namespace {

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

}  // namespace specwire
