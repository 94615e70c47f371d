"""Domino drafters (SpecForge's DominoDraftModel: dflash_config.projector_type "domino"):
specwire's Domino family against SpecForge's own model (tests/parity/domino_reference.py, in a
subprocess with .venv/trainer-oracles), on checkpoints written by its save_pretrained, over every
switch the family has: shift_label both ways, pure_draft_prefix_len 0-3 (positions drafted by
DFlash alone), GRU and projection widths, block sizes, one or two layers, and the legacy
logit_head.* key layout SpecForge still loads.
- Teacher-forced (each position's GRU reads the block's true tokens, as apply_logits_head trains
  it): the logits of every drafted position within 1e-5 relative (fp32).
- Greedy: specwire's drafts of a block (its own argmax fed to the GRU) equal SpecForge's own
  block sampler, _sample_draft_tokens at temperature 0.
Seeded random variants are added every day (SPECWIRE_DOMINO_SEED repeats a run). Broken
checkpoints are refused naming the file and key or tensor."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

import dflash_fixtures as F

REPO = Path(__file__).resolve().parents[2]

CONTEXT = 9
TOL = 1e-5


def variant(shift=False, prefix=0, gru=24, emb_dim=40, block=8, layers=1, theta=1e6,
            aux_ids=(1, 3), legacy_keys=False):
    return {"shift": shift, "prefix": prefix, "gru": gru, "emb_dim": emb_dim, "block": block,
            "layers": layers, "theta": theta, "aux_ids": list(aux_ids),
            "legacy_keys": legacy_keys}


VARIANTS = {
    "plain": variant(),
    "shift": variant(shift=True),
    "prefix-2": variant(prefix=2, block=16),
    "shift-prefix-1-two-layers": variant(shift=True, prefix=1, layers=2),
    "legacy-keys-block-4": variant(legacy_keys=True, block=4, gru=8, emb_dim=16),
    "prefix-past-the-block": variant(prefix=3, block=4),
}


def random_variants(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    return {f"random-{seed}-{i}": variant(
        shift=rng.random() < 0.5, prefix=rng.choice([0, 0, 1, 2]), gru=rng.choice([8, 16, 48]),
        emb_dim=rng.choice([16, 32, 64]), block=rng.choice([4, 8, 16]),
        layers=rng.choice([1, 2]), theta=rng.choice([1e4, 1e6]),
        aux_ids=sorted(rng.sample(range(1, 5), 2)), legacy_keys=rng.random() < 0.3)
        for i in range(n)}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    F.require_oracles("specforge")
    return F.block_family_oracle(tmp_path_factory.mktemp("domino"), "domino",
                                 "domino_reference.py", VARIANTS, random_variants, CONTEXT)


def draft(oracle: dict, name: str, drafter: Path, greedy: bool = False):
    return F.block_draft(oracle, name, drafter, oracle["variants"][name]["block"], CONTEXT,
                         greedy)


def test_teacher_forced_logits_match_specforge(oracle):
    failures = []
    for name, v, c, got in F.drafted_variants(oracle, draft):
        logits, ref = got["case.0.step.0.logits"], c["ref.logits"]
        assert logits.shape == ref.shape == (v["block"] - 1, ref.shape[1]), (name, logits.shape)
        err = F.relative(logits, ref)
        print(f"{name}: relative error {err:.2e}")
        if err > TOL:
            failures.append(f"{name} ({v}): {err:.3e}")
    assert not failures, failures


def test_greedy_drafts_match_specforges_block_sampler(oracle):
    for name, v, c, got in F.drafted_variants(oracle, draft, greedy=True):
        drafts = got["case.0.step.0.logits"].argmax(-1)
        assert drafts.tolist() == c["ref.drafts"].tolist(), name


def test_the_correction_changes_the_drafts(oracle):
    """The comparison has power: the same checkpoint read as plain DFlash (the head's tensors
    dropped, projector_type dflash) drafts other tokens."""
    root = oracle["root"]

    def as_dflash(cfg):
        cfg["dflash_config"]["projector_type"] = "dflash"
        cfg["architectures"] = ["DFlashDraftModel"]

    def drop_head(t):
        for k in [k for k in t if k.startswith(("prefix_gru.", "embed_proj."))]:
            del t[k]

    dst = F.broken_copy(root / "out" / "plain", root / "plain-as-dflash", drop_head, as_dflash)
    oracle["variants"]["plain-as-dflash"] = oracle["variants"]["plain"]
    shutil.copy(root / "out" / "plain.cases.safetensors",
                root / "out" / "plain-as-dflash.cases.safetensors")
    r, c, got = draft(oracle, "plain-as-dflash", dst)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = c["ref.logits"]
    assert F.relative(got["case.0.step.0.logits"], ref) > 1e-2


BAD = {
    "missing-gru-hh": (lambda t: t.pop("prefix_gru.weight_hh_l0"), None,
                       ["prefix_gru.weight_hh_l0", "missing"]),
    "proj-shape": (lambda t: t.update({"embed_proj.2.weight": torch.zeros(7, 40)}), None,
                   ["embed_proj.2.weight", "[7, 40]", "config.json"]),
    "gru-bias": (lambda t: t.update({"prefix_gru.bias_ih_l0": torch.zeros(72)}), None,
                 ["prefix_gru.bias_ih_l0", "unexpected"]),
    "no-emb-dim": (None, lambda c: c["dflash_config"].pop("emb_dim"),
                   ["config.json", "emb_dim"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_are_refused_by_name(oracle, case):
    tensors, config, words = BAD[case]
    root = oracle["root"]
    dst = F.broken_copy(root / "out" / "plain", root / f"broken-{case}", tensors, config)
    r, _, _ = draft(oracle, "plain", dst)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in r.stderr, (case, w, r.stderr[-2000:])


# --- the replay against a replay written on the reference's own drafting -----------------------

REPLAY_NEW_TOKENS = 40
REPLAY_PROMPTS = [[1, 5, 9, 14], [3, 200, 7, 7, 81, 12], [42], [9, 8, 7, 6, 5, 4, 3, 2]]


@pytest.fixture(scope="module", params=[(False, 0), (True, 2), None],
                ids=["plain", "shift-prefix2", "committed"])
def replayed(request, tmp_path_factory):
    """The committed DFlash drafter's backbone as a SpecForge Domino drafter with a random
    correction (shift_label and pure_draft_prefix_len as the parameter says), or the committed
    trained Domino drafter (models/tiny-qwen3-domino, read by SpecForge's from_pretrained),
    replayed by the reference and by specwire-replay on the same greedy trajectories of the
    committed target."""
    F.require_oracles("specforge")
    root = tmp_path_factory.mktemp("domino-replay")
    target = REPO / "models" / "tiny-qwen3"
    spec = {"dflash": str(REPO / "models" / "tiny-qwen3-dflash"), "target": str(target),
            "out": str(root / "domino"), "prompts": REPLAY_PROMPTS,
            "max_new_tokens": REPLAY_NEW_TOKENS, "seed": 11}
    if request.param is None:
        trained = str(REPO / "models" / "tiny-qwen3-domino")
        spec.update(drafter=trained, out=trained)
    else:
        shift, prefix = request.param
        spec.update(shift_label=shift, pure_draft_prefix_len=prefix, emb_dim=32,
                    gru_hidden_dim=24)
    spec = F.write_json(root / "spec.json", spec)
    r = F.run_oracle_script("domino_reference.py", "replay", str(spec))
    ref = json.loads(r.stdout.strip().splitlines()[-1])
    trajs = F.write_json(root / "trajectories.json",
                         [{"prompt": p, "completion": t[len(p):]}
                          for p, t in zip(REPLAY_PROMPTS, ref["trajectories"])])
    ours, dflash = (F.run_replay(["replay", "--drafter", str(d), "--target_checkpoint",
                                  str(target), "--trajectories_file", str(trajs),
                                  "--max_new_tokens", str(REPLAY_NEW_TOKENS), "--ddtree", "none",
                                  "--threads=1"])
                    for d in (json.loads(spec.read_text())["out"],
                              REPO / "models" / "tiny-qwen3-dflash"))
    return ref, ours, dflash


def test_replay_equals_the_reference_replay(replayed):
    ref, ours, dflash = replayed
    assert ours["method"] == "domino" and ours["format"] == "specforge"
    F.assert_replays_as_reference([r["step_lengths"] for r in ours["responses"]],
                                  ref["step_lengths"],
                                  [r["step_lengths"] for r in dflash["responses"]], "Domino")
