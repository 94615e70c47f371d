// What the acceptance replay, the teacher-forced acceptance at T > 0 and the live loop need of a
// drafter, whatever its family (services/scorer/drafters/registry.h makes one for a loaded
// drafter). A block of length len is the anchor (the last token the target committed) and
// len − 1 drafts after it; block_size() is the longest block the family drafts.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <span>
#include <vector>

namespace specwire {

// One step's tree (a family's own tree, e.g. EAGLE's top-k tree), node by node.
struct DraftTree {
  std::vector<int64_t> token;   // target ids
  std::vector<int64_t> parent;  // node index, −1 under the root (the anchor)
  std::vector<int32_t> level;   // 1-based
  std::vector<float> score;     // cumulative log-probability (fp32)
  std::vector<bool> kept;
  // The longest path from the root through kept nodes whose tokens are truth[0], truth[1], ...
  // (what greedy tree verification commits): its length.
  int64_t Accepted(std::span<const int64_t> truth) const;
};

// EAGLE's top-k tree (EAGLE-2's dynamic tree) of `levels` levels: the root's top_k children by
// root_log_probs ([V] fp32, on the CPU); at each further level the top_k nodes of the level
// before, by cumulative log-probability, each expanded into its top_k children by
// expand(tree, node) (the node's children's log-probs, the same shape; nodes are expanded in
// frontier order, each once); the total_tokens best nodes kept. to_token maps an index of the
// log-probs to a node's token (a draft vocabulary's target id).
DraftTree GrowTopKTree(int32_t levels, int64_t top_k, int64_t total_tokens,
                       const at::Tensor& root_log_probs,
                       const std::function<at::Tensor(const DraftTree&, int64_t)>& expand,
                       const std::function<int64_t(int64_t)>& to_token);

// One response's drafting state (the replay's view of a drafter; tests use fakes).
class DraftSession {
 public:
  virtual ~DraftSession() = default;
  // Context rows [n, features] for the next n positions; next_tokens[i] is the token at the
  // position after row i (−1 past the trajectory's end). DFlash ignores them; EAGLE-3 pairs each
  // row's target states with that token.
  virtual void AppendContext(const at::Tensor& features, std::span<const int64_t> next_tokens) = 0;
  // Logits [len − 1, V] (fp32, the target's vocabulary) of draft positions 1..len − 1 of the
  // block at [start, start + len) after `anchor` (the token at start); the context covers exactly
  // [0, start). Row k − 1 is the drafter's distribution for position k given that the block's
  // earlier draft positions hold given[0 .. k − 2] (given[i]: the token at start + 1 + i); past
  // the end of `given` a family whose drafts condition on earlier ones feeds its own greedy
  // drafts. Families whose positions are drafted independently ignore `given`. Teacher-forced
  // acceptance passes the trajectory; the live loop the drafts it sampled so far.
  virtual at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len,
                                 std::span<const int64_t> given = {}) = 0;
  // dflash's greedy acceptance of that block: the number of leading draft tokens (argmax of the
  // logits, first index on ties like torch.argmax) equal to truth[0], truth[1], ... (−1 never
  // matches). The default drafts every position and compares.
  virtual int64_t AcceptedDrafts(int64_t anchor, int64_t start, int64_t len,
                                 const std::vector<int64_t>& truth);
  // The family's own prediction of each draft position's acceptance in the last DraftLogits or
  // AcceptedDrafts call (DSpark's confidence head: [len − 1] fp32), undefined when it has none.
  virtual at::Tensor PredictedAcceptance() const { return {}; }
  // Named tensors of the last DraftLogits call that parity tests compare with the family's
  // reference (specwire-replay draft), e.g. "hidden" (the final-normed block states) or
  // "draft_logits" (logits over the family's own vocabulary); empty by default.
  virtual std::map<std::string, at::Tensor> Inspect() const { return {}; }
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
  // Whether a draft position's distribution depends on the drafts before it in the block (a
  // chain, a Markov or recurrent head, a selector): then sampling a block takes one
  // DraftLogits call per position with the drafts so far as `given`.
  virtual bool conditions_on_drafts() const { return false; }
  virtual std::unique_ptr<DraftSession> NewSession(int64_t capacity) = 0;

  virtual void AppendContext(const std::vector<DraftSession*>& sessions,
                             const std::vector<at::Tensor>& features,
                             const std::vector<std::vector<int64_t>>& next_tokens);
  // [R, len − 1, V] (fp32): DraftSession::DraftLogits of each session, without `given`.
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

}  // namespace specwire
