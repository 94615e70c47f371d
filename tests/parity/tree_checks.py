"""Checks of a family's own top-k tree (EAGLE's, grown by EAGLE-3 or an MTP head) from the trees
specwire-replay --tree_dump records: the algorithm transcribed from EAGLE-2 run on each tree,
each step's length from it, and the nodes whose children the reference model is asked for."""
from __future__ import annotations

import torch


def transcribed_tree(tree: dict, depth: int, top_k: int, total: int, truth: list[int]) -> int:
    """EAGLE-2's dynamic tree (eagle/model/cnets.py topK_genrate), transcribed: the frontier of
    each level is the top_k nodes of the level by cumulative score, each expands into its top_k
    children; the tree keeps the `total` best nodes; greedy verification walks kept nodes along
    the trajectory. Children and scores are the ones the C++ tree computed (checked against the
    reference model separately, check_children)."""
    tok, par, lev, sc = tree["token"], tree["parent"], tree["level"], tree["score"]
    n = len(tok)
    children: dict[int, list[int]] = {}
    for j in range(n):
        children.setdefault(par[j], []).append(j)
    levels = max(lev)
    frontier = [j for j in range(n) if lev[j] == 1]
    assert len(frontier) == min(top_k, len(frontier))
    for level in range(2, levels + 1):
        cands = [c for f in frontier for c in children.get(f, [])]
        # every frontier node expanded into top_k children, in frontier order
        assert [par[c] for c in cands] == [f for f in frontier for _ in range(top_k)], level
        expanded = [j for j in range(n) if lev[j] == level - 1 and j in children]
        assert sorted(expanded) == sorted(frontier), level
        scores = torch.tensor([sc[c] for c in cands], dtype=torch.float32)
        best = torch.topk(scores, min(top_k, len(cands))).indices.tolist()
        frontier = [cands[b] for b in best]
    kept = set(torch.topk(torch.tensor(sc, dtype=torch.float32), min(total, n)).indices.tolist())
    assert kept == {j for j in range(n) if tree["kept"][j]}
    at, a = -1, 0
    while a < len(truth):
        nxt = [c for c in children.get(at, []) if c in kept and tok[c] == truth[a]]
        if not nxt:
            break
        at, a = nxt[0], a + 1
    return a


def check_tree_steps(responses: list[dict], trees: list[dict], trajectories: list[list[int]],
                     prompt_len: int, new_tokens: int, depth: int, top_k: int, total: int,
                     most: int = 40) -> tuple[list, list]:
    """Every step of the replay (responses' step_lengths, trees in response order) against the
    transcription on its own tree. Returns the reference queries [response, start, path] of the
    first and every fifth step's expanded nodes (at most `most` nodes) and, per query, (tree,
    node; −1 for the root)."""
    steps = [s for r in responses for s in r["step_lengths"]]
    assert len(trees) == len(steps)
    queries, checked = [], []
    k = 0
    for i, traj in enumerate(trajectories):
        start = prompt_len
        for produced in responses[i]["step_lengths"]:
            tree = trees[k]
            k += 1
            levels = min(depth + 1, prompt_len + new_tokens - start) - 1
            assert max(tree["level"]) == levels
            truth = [traj[start + j] if start + j < len(traj) else -1
                     for j in range(1, levels + 1)]
            a = transcribed_tree(tree, depth, top_k, total, truth)
            assert produced == min(a + 1, len(traj) - 1 - start), (i, start)
            if len(checked) < most and (start == prompt_len or k % 5 == 0):
                queries.append([i, start, []])  # the root's children: the first level
                checked.append((tree, -1))
                for j in range(len(tree["token"])):
                    if not any(p == j for p in tree["parent"]):
                        continue
                    path, p = [], j
                    while p >= 0:
                        path.append(tree["token"][p])
                        p = tree["parent"][p]
                    queries.append([i, start, path[::-1]])
                    checked.append((tree, j))
            start += produced
    return queries, checked


def check_children(checked: list, logp: dict, to_target=None, atol: float = 2e-5) -> None:
    """Each checked node's children and their log-probabilities against the reference's
    log-softmax along the node's path (logp["out.Q"] for query Q); `to_target` maps a draft
    vocabulary id to the target's. Only a near-tie may order children differently."""
    for q, (tree, j) in enumerate(checked):
        lp = logp[f"out.{q}"]
        kids = [c for c in range(len(tree["token"])) if tree["parent"][c] == j]
        base = tree["score"][j] if j >= 0 else 0.0
        ref_top = torch.topk(lp, len(kids))
        ref_tokens = [to_target(d) if to_target else d for d in ref_top.indices.tolist()]
        got_tokens = [tree["token"][c] for c in kids]
        got_scores = torch.tensor([tree["score"][c] - base for c in kids])
        assert torch.allclose(got_scores, ref_top.values, atol=atol), (q, got_scores, ref_top)
        if got_tokens != ref_tokens:
            assert (ref_top.values[:-1] - ref_top.values[1:]).min() < atol, (q, got_tokens,
                                                                            ref_tokens)
