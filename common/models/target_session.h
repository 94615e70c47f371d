// A live verification session on the target: the target's half of the real speculative loop.
//
// The session holds one sequence's decoding state between calls. After Open the prompt is in the
// cache and the session has drawn the first completion token, the *pending* token (the next
// token of the sequence, not yet run through the target). Each Verify runs the block
// [pending, d_1 .. d_k] at positions [L, L + k] (L = tokens in the cache) in one forward, takes
// the target's sampling distribution at every row, and verifies the drafts by the lossless rule
// (speculative_sampling.h): a accepted drafts and the token after them (the correction at the
// first rejection, or the bonus token). Commit(n), 0 ≤ n ≤ a, then keeps exactly the committed
// tokens [pending, d_1 .. d_n]: the pending token becomes d_{n+1} (n < a) or the verified next
// token (n = a).
//
// Rollback. When not every row of the block is committed, the session restores the state of
// position L and runs the committed tokens again: K/V caches are cut back to L (their rows past
// the length are never read), recurrent layers (Gated DeltaNet's convolution window and delta-rule
// state) are restored from the copy taken before the verification, and the forward over the
// committed tokens rebuilds both. The state after a commit is therefore the state of a session
// that was only ever sent the committed tokens, block by block, bit for bit: a rejected draft
// leaves no trace (transformers' cache crop rolls back the convolution state of a Gated DeltaNet
// layer but not its recurrent state). The cost is one forward over the n + 1 committed tokens
// when n < k; a fully accepted block costs nothing more.
//
// Draws. The sampled tokens use UniformAt(seed, stream, index) with stream = 2 · L + 1 for the
// verification of the block at L and stream 0 for the first token, so a session replays bit for
// bit from its seed and calls, whatever ran before or beside it.
//
// Not thread-safe; torch errors propagate as c10::Error (callers at the edge use RunGuarded).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/models/decoder.h"
#include "common/models/speculative_sampling.h"

namespace specwire {

struct TargetSessionOptions {
  int64_t max_new_tokens = 256;      // completion tokens the session may hold
  int64_t max_draft_tokens = 15;     // drafted tokens per verification at most
  SamplingParams sampling{0, 1, 0};  // temperature 0: greedy
  uint64_t seed = 0;
  CaptureSpec capture;  // the states returned for the prompt and for every verified block
};

// One verification request: a chain of drafted tokens or a tree.
struct VerifyDraft {
  std::vector<int64_t> tokens;
  // Empty: a chain. Otherwise node j's parent (−1: a child of the pending token), parents before
  // their children; the target walks the tree (speculative_sampling.h: VerifyTree).
  std::vector<int32_t> parents;
  VerifyRule rule = VerifyRule::kArgmaxDraft;
  at::Tensor draft_q;  // [k, V] the drafter's distributions (chains under kDraftDistribution)
};

struct VerifyOutcome {
  int64_t position = 0;  // of the block's first row (the pending token)
  int32_t accepted = 0;  // drafted tokens accepted (a)
  // The accepted tokens in order: the chain's prefix, or the tree's path (tokens[path[i]]).
  std::vector<int64_t> accepted_tokens;
  std::vector<int32_t> path;  // trees: the accepted nodes
  int64_t next_token = -1;    // the correction or bonus token after them
  // The target's argmax at every row the verification ran (row i: the token after row i).
  std::vector<int64_t> target_argmax;
  // States of the rows that verification ran, [1, rows, H] each: the chain's block, or for a
  // tree the pending token and the accepted path.
  CapturedStates states;
  at::Tensor logits;  // [rows, V] of those rows
};

class TargetSession {
 public:
  // INVALID_ARGUMENT naming the field: an empty prompt, token ids outside the vocabulary, negative
  // or oversized bounds, a sampling setting out of range. Prefills the prompt in chunks of
  // kPrefillChunkTokens and draws the pending token.
  static absl::StatusOr<std::unique_ptr<TargetSession>> Open(DecoderModel& model,
                                                             std::span<const int64_t> prompt,
                                                             const TargetSessionOptions& options);

  // States of the prompt's rows, [1, P, H] each (the drafter's first context).
  const CapturedStates& prompt_states() const { return prompt_states_; }
  const at::Tensor& prompt_last_logits() const { return prompt_logits_; }
  int64_t prompt_tokens() const { return prompt_len_; }
  int64_t cached_tokens() const { return cache_->length; }  // L
  int64_t pending_token() const { return pending_; }
  // Committed tokens after the prompt, the pending token last.
  const std::vector<int64_t>& completion() const { return completion_; }
  bool awaiting_commit() const { return outstanding_.has_value(); }
  // Tokens the cache holds room for: prompt + max_new_tokens + max_draft_tokens + 1.
  int64_t capacity() const { return cache_->capacity; }
  int64_t bytes() const;
  const TargetSessionOptions& options() const { return options_; }
  // Forwards run again by rollbacks, and their tokens.
  int64_t rollback_forwards() const { return rollback_forwards_; }
  int64_t rollback_tokens() const { return rollback_tokens_; }

  // Checks a draft against the session without changing it (Verify calls it first):
  // INVALID_ARGUMENT naming `field` for tokens outside the vocabulary, a draft longer than
  // max_draft_tokens, a malformed tree or q; OUT_OF_RANGE when the block would pass the
  // session's capacity; FAILED_PRECONDITION when a verification awaits its commit.
  absl::Status CheckDraft(const VerifyDraft& draft, const std::string& field) const;
  absl::StatusOr<VerifyOutcome> Verify(const VerifyDraft& draft);
  // FAILED_PRECONDITION without a verification to commit; INVALID_ARGUMENT when n is negative
  // or past the accepted drafts. The state is unchanged after a refusal.
  absl::Status Commit(int64_t n);

 private:
  TargetSession(DecoderModel& model, std::span<const int64_t> prompt,
                const TargetSessionOptions& options);
  int64_t Draw(const at::Tensor& logits_row, uint64_t stream) const;
  absl::StatusOr<VerifyOutcome> VerifyChainBlock(const VerifyDraft& draft);
  absl::StatusOr<VerifyOutcome> VerifyTreeWalk(const VerifyDraft& draft);
  std::vector<std::unique_ptr<LayerCache>> SaveStates() const;
  void RestoreStates(const std::vector<std::unique_ptr<LayerCache>>& saved);

  struct Outstanding {
    int64_t start = 0;              // L before the verification
    std::vector<int64_t> rows;      // tokens the verification ran: [pending, ...]
    std::vector<int64_t> accepted;  // accepted drafted tokens
    int64_t next_token = -1;
    std::vector<std::unique_ptr<LayerCache>> saved;  // recurrent states at L
  };

  DecoderModel& model_;
  TargetSessionOptions options_;
  std::vector<int64_t> prompt_;
  int64_t prompt_len_ = 0;
  std::unique_ptr<ModelCache> cache_;
  CapturedStates prompt_states_;
  at::Tensor prompt_logits_;
  int64_t pending_ = -1;
  std::vector<int64_t> completion_;
  std::optional<Outstanding> outstanding_;
  int64_t rollback_forwards_ = 0;
  int64_t rollback_tokens_ = 0;
};

// Concatenates per-chunk captures [1, t_i, H] along the rows.
void AppendCaptured(CapturedStates& into, CapturedStates&& part);

}  // namespace specwire
