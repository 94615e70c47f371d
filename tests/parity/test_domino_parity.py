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
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import dflash_fixtures as F

REPO = Path(__file__).resolve().parents[2]
ORACLES = REPO / ".venv" / "trainer-oracles"
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
    if not (ORACLES / "specforge").is_dir():
        pytest.fail("specforge is not in .venv/trainer-oracles (scripts/setup.sh)", pytrace=False)
    return F.block_family_oracle(tmp_path_factory.mktemp("domino"), "domino",
                                 "domino_reference.py", VARIANTS, random_variants, CONTEXT)


def draft(oracle: dict, name: str, drafter: Path, greedy: bool = False):
    """specwire's block after the case's context: teacher-forced by the case's tokens, or (greedy)
    with the tokens after the anchor unknown (−1), so the block feeds its own drafts."""
    v = oracle["variants"][name]
    c = load_file(str(oracle["root"] / "out" / f"{name}.cases.safetensors"))
    tokens = c["case.0.tokens"].clone()
    if greedy:
        tokens[CONTEXT + 1:] = -1  # no given tokens: the block feeds its own drafts
    tag = f"{drafter.name}{'-greedy' if greedy else ''}"
    inp = oracle["root"] / f"{tag}.in.safetensors"
    save_file({"case.0.features": c["case.0.features"], "case.0.tokens": tokens.contiguous()},
              str(inp), metadata={"cases": json.dumps(
                  [{"steps": [{"context_end": CONTEXT, "len": v["block"]}]}])})
    res = oracle["root"] / f"{tag}.out.safetensors"
    r = subprocess.run([str(F.replay_binary()), "draft", f"--drafter={drafter}",
                        f"--target_checkpoint={oracle['target']}", f"--cases={inp}",
                        f"--out={res}", "--threads=1"], capture_output=True, text=True,
                       timeout=300)
    return r, c, (load_file(str(res)) if r.returncode == 0 else None)


def test_teacher_forced_logits_match_specforge(oracle):
    failures = []
    for name, v in oracle["variants"].items():
        r, c, got = draft(oracle, name, oracle["root"] / "out" / name)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        logits, ref = got["case.0.step.0.logits"], c["ref.logits"]
        assert logits.shape == ref.shape == (v["block"] - 1, ref.shape[1]), (name, logits.shape)
        err = ((logits - ref).norm() / ref.norm()).item()
        print(f"{name}: relative error {err:.2e}")
        if err > TOL:
            failures.append(f"{name} ({v}): {err:.3e}")
    assert not failures, failures


def test_greedy_drafts_match_specforges_block_sampler(oracle):
    for name, v in oracle["variants"].items():
        r, c, got = draft(oracle, name, oracle["root"] / "out" / name, greedy=True)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        drafts = got["case.0.step.0.logits"].argmax(-1)
        assert drafts.tolist() == c["ref.drafts"].tolist(), name


def test_the_correction_changes_the_drafts(oracle):
    """The comparison has power: the same checkpoint read as plain DFlash (the head's tensors
    dropped, projector_type dflash) drafts other tokens."""
    root = oracle["root"]
    src = root / "out" / "plain"
    dst = root / "plain-as-dflash"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["dflash_config"]["projector_type"] = "dflash"
    cfg["architectures"] = ["DFlashDraftModel"]
    (dst / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(dst / "model.safetensors"))
    save_file({k: x for k, x in t.items() if not k.startswith(("prefix_gru.", "embed_proj."))},
              str(dst / "model.safetensors"))
    oracle["variants"]["plain-as-dflash"] = oracle["variants"]["plain"]
    shutil.copy(root / "out" / "plain.cases.safetensors",
                root / "out" / "plain-as-dflash.cases.safetensors")
    r, c, got = draft(oracle, "plain-as-dflash", dst)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = c["ref.logits"]
    assert ((got["case.0.step.0.logits"] - ref).norm() / ref.norm()).item() > 1e-2


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
    dst = root / f"broken-{case}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(root / "out" / "plain", dst)
    if tensors is not None:
        t = load_file(str(dst / "model.safetensors"))
        tensors(t)
        save_file(t, str(dst / "model.safetensors"))
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    r, _, _ = draft(oracle, "plain", dst)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in r.stderr, (case, w, r.stderr[-2000:])
