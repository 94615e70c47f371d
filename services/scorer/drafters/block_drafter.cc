#include "services/scorer/drafters/block_drafter.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace specwire {

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

DraftTree GrowTopKTree(int32_t levels, int64_t top_k, int64_t total_tokens,
                       const at::Tensor& root_log_probs,
                       const std::function<at::Tensor(const DraftTree&, int64_t)>& expand,
                       const std::function<int64_t(int64_t)>& to_token) {
  DraftTree tree;
  auto add = [&](int64_t token, int64_t parent, int32_t level, float score) {
    tree.token.push_back(token);
    tree.parent.push_back(parent);
    tree.level.push_back(level);
    tree.score.push_back(score);
  };
  const int64_t k = std::min<int64_t>(top_k, root_log_probs.numel());
  {
    auto [v, i] = at::topk(root_log_probs, k);
    for (int64_t j = 0; j < k; ++j) add(to_token(i[j].item<int64_t>()), -1, 1, v[j].item<float>());
  }
  std::vector<int64_t> frontier(k);
  for (int64_t j = 0; j < k; ++j) frontier[j] = j;
  for (int32_t level = 2; level <= levels; ++level) {
    std::vector<float> cand_score;
    std::vector<std::pair<int64_t, int64_t>> cand;  // (parent node, token)
    for (int64_t f : frontier) {
      auto [v, i] = at::topk(expand(tree, f), k);
      for (int64_t j = 0; j < k; ++j) {
        cand.emplace_back(f, to_token(i[j].item<int64_t>()));
        cand_score.push_back(tree.score[f] + v[j].item<float>());
      }
    }
    const int64_t first = static_cast<int64_t>(tree.token.size());
    for (size_t c = 0; c < cand.size(); ++c) {
      add(cand[c].second, cand[c].first, level, cand_score[c]);
    }
    if (level == levels) break;
    at::Tensor scores = at::tensor(cand_score, at::kFloat);
    at::Tensor best = std::get<1>(at::topk(scores, std::min<int64_t>(k, scores.size(0))));
    frontier.clear();
    for (int64_t j = 0; j < best.size(0); ++j) frontier.push_back(first + best[j].item<int64_t>());
  }
  tree.kept.assign(tree.token.size(), false);
  at::Tensor all = at::tensor(tree.score, at::kFloat);
  at::Tensor keep = std::get<1>(at::topk(all, std::min<int64_t>(total_tokens, all.size(0))));
  for (int64_t j = 0; j < keep.size(0); ++j) tree.kept[keep[j].item<int64_t>()] = true;
  return tree;
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

int64_t DraftTree::Accepted(std::span<const int64_t> truth) const {
  int64_t at = -1, a = 0;
  while (a < static_cast<int64_t>(truth.size())) {
    int64_t next = -1;
    for (size_t n = 0; n < token.size(); ++n) {
      if (kept[n] && parent[n] == at && token[n] == truth[a]) {
        next = static_cast<int64_t>(n);
        break;
      }
    }
    if (next < 0) break;
    at = next;
    ++a;
  }
  return a;
}

}  // namespace specwire
