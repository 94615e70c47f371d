#include "services/scorer/drafters/block_drafter.h"

#include <c10/util/Exception.h>

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
