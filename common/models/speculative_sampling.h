// Lossless speculative sampling: which drafted tokens the target accepts at a sampling setting,
// and the token it emits after them, with draws a run can replay bit for bit.
//
// The rules (Leviathan et al. / Chen et al.; vLLM's rejection sampler):
// - chain, the drafter's own q (kDraftDistribution): draft token x at position i is accepted with
//   probability min(1, p_i(x) / q_i(x)); at the first rejection the emitted token is drawn from
//   the residual max(0, p_i − q_i), renormalised; when every draft is accepted, a bonus token is
//   drawn from p_{k+1}.
// - chain, argmax draft (kArgmaxDraft, q one-hot at the draft, the rule vLLM applies to DFlash's
//   argmax blocks): accepted with probability p_i(x), the residual is p_i without x.
// - tree: at each node the target's token is drawn from its p; a child carrying that token is
//   accepted and the walk goes on from it, otherwise the drawn token is emitted.
// Each emits exactly a draw of the target's own sampling distribution, position by position.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace specwire {

// A sampling setting: temperature (0: greedy), then top-k (0: every token), then top-p.
struct SamplingParams {
  double temperature = 1;
  double top_p = 1;
  int64_t top_k = 0;
};

// The sampling distribution of one row of logits [V] at a setting, as doubles: softmax(logits /
// T), then top-k, then top-p (the smallest set of most likely tokens whose probability reaches
// top_p, ties by lower token id), renormalised. T = 0: one-hot at the argmax (first index on ties).
at::Tensor SamplingDistribution(const at::Tensor& logits, const SamplingParams& setting);

// The `index`-th uniform in [0, 1) of stream (`seed`, `stream`): a counter-based generator (a
// SplitMix64 finaliser over the three coordinates), so a draw depends on where it is used and
// nothing else: a session's draws are the same whatever ran before or beside it.
double UniformAt(uint64_t seed, uint64_t stream, uint64_t index);

// The token whose cumulative probability first exceeds u · Σp over the row `p` [V] (doubles,
// summed in token order); the last token with p > 0 when rounding leaves u · Σp unreached.
int64_t SampleToken(const at::Tensor& p, double u);

enum class VerifyRule { kArgmaxDraft, kDraftDistribution };

struct ChainVerification {
  int32_t accepted = 0;     // drafted tokens accepted, a prefix of the draft
  int64_t next_token = -1;  // the corrected token (at the first rejection) or the bonus token
};

// `target_p`: [k + 1, V] doubles, row i the target's sampling distribution at drafted position i
// (row k: after the last one); `draft`: the k drafted tokens; `draft_q`: [k, V] the drafter's
// distributions (kDraftDistribution; ignored for kArgmaxDraft). Position i draws
// UniformAt(seed, stream, 2i) for its test and (…, 2i + 1) for its residual or bonus token.
ChainVerification VerifyChain(const at::Tensor& target_p, const std::vector<int64_t>& draft,
                              const at::Tensor& draft_q, VerifyRule rule, uint64_t seed,
                              uint64_t stream);

struct TreeVerification {
  std::vector<int32_t> path;  // the accepted nodes, root's child first
  int64_t next_token = -1;    // the token drawn where the walk stopped
};

// A drafted tree: node j has `tokens[j]` and parent `parents[j]` (−1: a child of the root, the
// last committed token; parents come before their children). `target_p`: [N + 1, V], row 0 after
// the root, row j + 1 after node j. The walk's d-th draw is UniformAt(seed, stream, d).
TreeVerification VerifyTree(const at::Tensor& target_p, const std::vector<int32_t>& parents,
                            const std::vector<int64_t>& tokens, uint64_t seed, uint64_t stream);

}  // namespace specwire
