"""DSpark drafters in speculators' format (speculators_model_type "dspark") and SpecForge's
(dflash_config.projector_type "dspark"): specwire's DSparkDrafter against each package's own
DSparkDraftModel (tests/parity/dspark_reference.py, in a subprocess with .venv/trainer-oracles),
on checkpoints written by the package's save_pretrained, over every switch the family has:
markov_head_type vanilla / gated / rnn, markov_rank 0 (no Markov head), the confidence head on
or off and with or without the Markov embedding, sample_from_anchor both ways (speculators;
SpecForge's checkpoints draft from every slot, as its OnlineDSparkModel trains them),
full and draft vocabularies, block sizes 4-16. The block is teacher-forced (each position's
previous token is the case's token), as both packages' training forwards run it: the logits over
the head's vocabulary and the confidence must agree within 1e-5 relative (fp32). Seeded random
variants are added every day (SPECWIRE_DSPARK_SEED repeats a run). Broken checkpoints are
refused naming the file and key or tensor."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import dflash_fixtures as F

REPO = Path(__file__).resolve().parents[2]
CONTEXT = 9
TOL = 1e-5


def variant(fmt="speculators", head="vanilla", rank=16, confidence=True, with_markov=True,
            sfa=True, block=8, draft_vocab=512, layers=1, theta=1e6, aux_ids=(1, 3)):
    return {"format": fmt, "markov_head_type": head, "markov_rank": rank,
            "confidence": confidence, "confidence_with_markov": with_markov and rank > 0,
            "sample_from_anchor": sfa or fmt == "specforge", "block": block,
            "draft_vocab": draft_vocab if fmt == "speculators" else 512, "layers": layers,
            "theta": theta, "aux_ids": list(aux_ids)}


VARIANTS = {
    "sp-vanilla-anchor": variant(),
    "sp-gated-anchor-draft-vocab": variant(head="gated", draft_vocab=200),
    "sp-rnn-anchor": variant(head="rnn", layers=2),
    "sp-vanilla-no-anchor": variant(sfa=False, block=4),
    "sp-gated-no-anchor-plain-confidence": variant(head="gated", sfa=False, with_markov=False),
    "sp-rnn-no-anchor-draft-vocab": variant(head="rnn", sfa=False, draft_vocab=300, block=16),
    "sp-no-markov-confidence": variant(rank=0, with_markov=False),
    "sp-vanilla-no-confidence": variant(confidence=False),
    "sf-vanilla": variant(fmt="specforge"),
    "sf-gated-plain-confidence": variant(fmt="specforge", head="gated", with_markov=False),
    "sf-rnn": variant(fmt="specforge", head="rnn", layers=2, block=16),
    "sf-no-markov-confidence": variant(fmt="specforge", rank=0, with_markov=False),
    "sf-rnn-no-confidence": variant(fmt="specforge", head="rnn", confidence=False),
}


def random_variants(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        fmt = rng.choice(["speculators", "specforge"])
        out[f"random-{seed}-{i}"] = variant(
            fmt=fmt, head=rng.choice(["vanilla", "gated", "rnn"]), rank=rng.choice([0, 8, 32]),
            confidence=rng.random() < 0.7, with_markov=rng.random() < 0.5,
            sfa=rng.random() < 0.5, block=rng.choice([4, 8, 16]),
            draft_vocab=rng.choice([512, rng.randint(16, 511)]), layers=rng.choice([1, 2]),
            theta=rng.choice([1e4, 1e6]), aux_ids=sorted(rng.sample(range(1, 5), 2)))
    return out


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    F.require_oracles("speculators", "specforge")
    return F.block_family_oracle(tmp_path_factory.mktemp("dspark"), "dspark",
                                 "dspark_reference.py", VARIANTS, random_variants, CONTEXT)


def draft(oracle: dict, name: str, drafter: Path):
    """specwire's block after the case's context, teacher-forced by the case's tokens."""
    v = oracle["variants"][name]
    return F.block_draft(oracle, name, drafter, v["block"] + (1 if v["sample_from_anchor"] else 0),
                         CONTEXT)


relative = F.relative


def test_forward_matches_the_reference_packages(oracle):
    failures = []
    for name, v, c, got in F.drafted_variants(oracle, draft):
        n = v["block"] if v["sample_from_anchor"] else v["block"] - 1
        head, ref = got["case.0.step.0.head_logits"], c["ref.logits"]
        assert head.shape == ref.shape == (n, v["draft_vocab"]), (name, head.shape, ref.shape)
        err = relative(head, ref)
        # The target-vocabulary logits the replay reads: the head's, −inf outside a draft
        # vocabulary.
        logits, chosen = got["case.0.step.0.logits"], c["ref.chosen"]
        assert torch.equal(logits[:, chosen], head), name
        outside = torch.ones(logits.shape[1], dtype=torch.bool)
        outside[chosen] = False
        assert torch.isneginf(logits[:, outside]).all(), name
        has_conf = "ref.confidence" in c
        assert has_conf == ("case.0.step.0.confidence" in got), name
        if has_conf:
            err = max(err, relative(got["case.0.step.0.confidence"], c["ref.confidence"]))
        print(f"{name}: relative error {err:.2e}")
        if err > TOL:
            failures.append(f"{name} ({v}): {err:.3e}")
    assert not failures, failures


def test_the_markov_head_changes_the_drafts(oracle):
    """The check is not vacuous: on the variants with a Markov head, the heads' logits differ
    from the backbone's alone (the reference files hold both only implicitly, so compare the
    teacher-forced logits with those of a different previous-token sequence)."""
    name = "sp-vanilla-anchor"
    r, c, got = draft(oracle, name, oracle["root"] / "out" / name)
    assert r.returncode == 0
    c2 = dict(c)
    c2["case.0.tokens"] = (c["case.0.tokens"] + 7) % 500
    c2["case.0.tokens"][CONTEXT] = c["case.0.tokens"][CONTEXT]  # the same anchor
    save_file({k: v.contiguous() for k, v in c2.items()},
              str(oracle["root"] / "out" / f"{name}-shifted.cases.safetensors"))
    oracle["variants"][f"{name}-shifted"] = oracle["variants"][name]
    r2, _, got2 = draft(oracle, f"{name}-shifted", oracle["root"] / "out" / name)
    assert r2.returncode == 0
    a, b = got["case.0.step.0.head_logits"], got2["case.0.step.0.head_logits"]
    assert torch.equal(a[0], b[0])  # position 1 follows the anchor in both
    assert not torch.allclose(a[1:], b[1:])


@pytest.mark.parametrize("case,change,words", [
    ("markov_head_type", lambda c: c.update(markov_head_type="lstm"),
     ["markov_head_type", "lstm"]),
    ("rank-mismatch", lambda c: c.update(markov_rank=8), ["markov_head.markov_w1.weight",
                                                          "markov_rank 8"]),
    ("head-type-mismatch", lambda c: c.update(markov_head_type="gated"),
     ["markov_head.gate_proj.weight", "missing"]),
    ("no-confidence-declared", lambda c: c.update(enable_confidence_head=False),
     ["confidence_head.proj", "enable_confidence_head false"]),
    ("confidence-without-markov", lambda c: c.update(markov_rank=0),
     ["confidence_head_with_markov", "markov_rank is 0"]),
])
def test_broken_checkpoints_are_refused_by_name(oracle, tmp_path, case, change, words):
    d = F.broken_copy(oracle["root"] / "out" / "sp-vanilla-anchor", tmp_path / case,
                      config=change)
    r, _, _ = draft(oracle, "sp-vanilla-anchor", d)
    assert r.returncode == 2, (case, r.stderr[-2000:])
    for w in words:
        assert w in r.stderr, (case, w, r.stderr[-2000:])
    assert "config.json" in r.stderr or "tensor" in r.stderr, r.stderr


REPLAY_NEW_TOKENS = 40


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The committed DFlash drafter's backbone as a SpecForge DSpark drafter with random heads
    (large enough to change drafts), replayed by the reference and by specwire-replay on the
    same greedy trajectories of the committed target."""
    root = tmp_path_factory.mktemp("dspark-replay")
    target = REPO / "models" / "tiny-qwen3"
    prompts = [[1, 5, 9, 14], [3, 200, 7, 7, 81, 12], [42], [9, 8, 7, 6, 5, 4, 3, 2]]
    spec = root / "spec.json"
    spec.write_text(json.dumps({
        "dflash": str(REPO / "models" / "tiny-qwen3-dflash"), "target": str(target),
        "out": str(root / "dspark"), "prompts": prompts, "max_new_tokens": REPLAY_NEW_TOKENS,
        "seed": 5, "markov_head_type": "rnn", "markov_rank": 16}))
    r = F.run_oracle_script("dspark_reference.py", "replay", str(spec))
    ref = json.loads(r.stdout.strip().splitlines()[-1])
    trajs = root / "trajectories.json"
    trajs.write_text(json.dumps([{"prompt": p, "completion": t[len(p):]}
                                 for p, t in zip(prompts, ref["trajectories"])]))
    ours = F.run_replay(["replay", "--drafter", str(root / "dspark"), "--target_checkpoint",
                         str(target), "--trajectories_file", str(trajs), "--max_new_tokens",
                         str(REPLAY_NEW_TOKENS), "--ddtree", "none", "--threads=1",
                         "--dspark_cutoff", "0,0.5,1"])
    return ref, ours


def test_replay_equals_the_reference_replay(replayed):
    ref, ours = replayed
    assert ours["method"] == "dspark" and ours["format"] == "specforge"
    got = [r["step_lengths"] for r in ours["responses"]]
    assert got == ref["step_lengths"]
    flat = [a for s in got for a in s]
    assert max(flat) >= 3 and min(flat) == 1, flat  # the check is not all-ones
    print(f"DSpark replay: tau {ours['summary']['tau_mean_of_means']:.3f} over {len(flat)} steps")


def test_predicted_acceptance_matches_and_calibration_is_recomputed(replayed):
    ref, ours = replayed
    pa = ours["predicted_acceptance"]
    # Every block's prediction is the reference's confidence head on the same block.
    for mine, theirs in zip(pa["blocks"], ref["blocks"]):
        assert [b["accepted"] for b in mine] == [b["accepted"] for b in theirs]
        for b, t in zip(mine, theirs):
            got, want = torch.tensor(b["predicted"]), torch.tensor(t["predicted"])
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)
    # The calibration table, computed here from the reference's own records.
    reached, accepted, predicted = {}, {}, {}
    for blocks in ref["blocks"]:
        for b in blocks:
            for k, c in enumerate(b["predicted"], start=1):
                if b["accepted"] < k - 1:
                    break
                reached[k] = reached.get(k, 0) + 1
                predicted[k] = predicted.get(k, 0.0) + c
                accepted[k] = accepted.get(k, 0) + (b["accepted"] >= k)
    table = {row["position"]: row for row in pa["calibration"]}
    assert sorted(table) == sorted(reached)
    for k, row in table.items():
        assert row["blocks"] == reached[k]
        assert row["observed"] == pytest.approx(accepted[k] / reached[k], abs=1e-12)
        assert row["predicted"] == pytest.approx(predicted[k] / reached[k], rel=1e-5)
    # Cutoffs: 0 never cuts (the chain's steps), 1 always does (one token per step), and 0.5
    # lies between; each step of the cut loop recomputed from the reference's records is not
    # possible (its steps start elsewhere), so check the bounds and the token count.
    cuts = {c["cutoff"]: c for c in pa["cutoffs"]}
    assert cuts[0.0]["step_lengths"] == ref["step_lengths"]
    assert all(s == 1 for steps in cuts[1.0]["step_lengths"] for s in steps)
    for c in cuts.values():
        assert [sum(s) for s in c["step_lengths"]] == [sum(s) for s in ref["step_lengths"]]
    assert cuts[1.0]["tau_pooled"] <= cuts[0.5]["tau_pooled"] <= cuts[0.0]["tau_pooled"]

