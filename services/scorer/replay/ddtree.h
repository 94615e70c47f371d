// DDTree acceptance (Ringel & Romano; liranringel/ddtree `build_ddtree_tree`): the best-first
// tree of at most N non-root nodes over a block's per-position top-k log-probs, and the longest
// root path that greedy tree verification commits.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace specwire {

// DDTree over per-position log-probs [D, V] (rows = draft positions 1..D): returns the number
// of accepted draft tokens (a) of the best-first tree with at most `budget` non-root nodes, given
// the trajectory continuation `truth` (truth[i] is the token at draft position i + 1; entries
// past the trajectory are −1; a shorter `truth` means mismatch beyond it).
//
// The tree, as ddtree's build_ddtree_tree builds it: per row the top-k tokens (k = min(budget,
// V)); a max-heap of candidate nodes keyed by score = Σ log-prob along the path, seeded with the
// best token of row 0; popping a node adds it to the tree and pushes its next sibling (same
// parent, next rank: score − lp[rank] + lp[rank+1]) and its first child (next row, rank 0:
// score + lp[0]) when depth < D. Scores are doubles accumulated in exactly that order.
// Ties: equal log-probs within a row rank the lower token id first; equal heap scores pop the
// lexicographically smaller rank path first (Python heapq on ddtree's (−score, ranks) tuples).
int32_t DDTreeAccepted(const at::Tensor& log_probs, const std::vector<int64_t>& truth,
                       int32_t budget);

// The same on precomputed top-k tables: top_log_probs[d][r] / top_tokens[d][r] for rank r of
// row d (sorted by the tie rule above, at least min(budget, V) ranks per row).
int32_t DDTreeAcceptedTopK(const std::vector<std::vector<float>>& top_log_probs,
                           const std::vector<std::vector<int64_t>>& top_tokens,
                           const std::vector<int64_t>& truth, int32_t budget);

// Per-row top-k of log_probs [D, V] with the tie rule above: (values [D][k], token ids [D][k]).
std::pair<std::vector<std::vector<float>>, std::vector<std::vector<int64_t>>> TopKRows(
    const at::Tensor& log_probs, int64_t k);

}  // namespace specwire
