"""XPress drafters (speculators_model_type "xpress"): specwire's XPress family against
speculators' own XPressDraftModel (tests/parity/xpress_reference.py, in a subprocess with
.venv/trainer-oracles), on checkpoints written by its save_pretrained, over every switch the
family has: the fill-in layout and sample_from_anchor, refiner rank and MLP ratio, Jacobi
passes 1-6, full and draft vocabularies, block sizes, one or two layers.
- Teacher-forced (the refine pass on the block's true tokens, as the package trains it): the
  logits of every drafted position within 1e-5 relative (fp32).
- Greedy: specwire's Jacobi passes on its own drafts give the package's consistency rounds: the
  last pass's logits and the drafts.
Seeded random variants are added every day (SPECWIRE_XPRESS_SEED repeats a run). Broken
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


def variant(sfa=False, rank=16, mlp_ratio=2, passes=6, block=8, draft_vocab=512, layers=1,
            theta=1e6, aux_ids=(1, 3)):
    return {"sample_from_anchor": sfa, "rank": rank, "mlp_ratio": mlp_ratio, "passes": passes,
            "block": block, "draft_vocab": draft_vocab, "layers": layers, "theta": theta,
            "aux_ids": list(aux_ids)}


VARIANTS = {
    "fill-in": variant(),
    "from-anchor": variant(sfa=True),
    "draft-vocab-two-layers": variant(draft_vocab=200, layers=2, block=16),
    "one-pass-ratio-4": variant(passes=1, mlp_ratio=4, rank=32),
    "from-anchor-block-4-draft-vocab": variant(sfa=True, block=4, draft_vocab=300, passes=3),
}


def random_variants(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    return {f"random-{seed}-{i}": variant(
        sfa=rng.random() < 0.5, rank=rng.choice([8, 16, 48]), mlp_ratio=rng.choice([1, 2, 4]),
        passes=rng.randint(1, 6), block=rng.choice([4, 8, 16]),
        draft_vocab=rng.choice([512, rng.randint(16, 511)]), layers=rng.choice([1, 2]),
        theta=rng.choice([1e4, 1e6]), aux_ids=sorted(rng.sample(range(1, 5), 2)))
        for i in range(n)}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    if not (ORACLES / "speculators").is_dir():
        pytest.fail("speculators is not in .venv/trainer-oracles (scripts/setup.sh)",
                    pytrace=False)
    return F.block_family_oracle(tmp_path_factory.mktemp("xpress"), "xpress",
                                 "xpress_reference.py", VARIANTS, random_variants, CONTEXT)


def draft(oracle: dict, name: str, drafter: Path, greedy: bool = False):
    """specwire's block after the case's context: teacher-forced by the case's tokens, or (greedy)
    with the tokens after the anchor unknown (−1), so the block feeds its own drafts."""
    v = oracle["variants"][name]
    c = load_file(str(oracle["root"] / "out" / f"{name}.cases.safetensors"))
    tokens = c["case.0.tokens"].clone()
    if greedy:
        tokens[CONTEXT + 1:] = -1
    length = v["block"] + (1 if v["sample_from_anchor"] else 0)
    tag = f"{drafter.name}{'-greedy' if greedy else ''}"
    inp = oracle["root"] / f"{tag}.in.safetensors"
    save_file({"case.0.features": c["case.0.features"], "case.0.tokens": tokens.contiguous()},
              str(inp), metadata={"cases": json.dumps(
                  [{"steps": [{"context_end": CONTEXT, "len": length}]}])})
    res = oracle["root"] / f"{tag}.out.safetensors"
    r = subprocess.run([str(F.replay_binary()), "draft", f"--drafter={drafter}",
                        f"--target_checkpoint={oracle['target']}", f"--cases={inp}",
                        f"--out={res}", "--threads=1"], capture_output=True, text=True,
                       timeout=300)
    return r, c, (load_file(str(res)) if r.returncode == 0 else None)


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got - ref).norm() / ref.norm()).item()


def test_teacher_forced_logits_match_speculators(oracle):
    failures = []
    for name, v in oracle["variants"].items():
        r, c, got = draft(oracle, name, oracle["root"] / "out" / name)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        head, ref = got["case.0.step.0.head_logits"], c["ref.logits"]
        assert head.shape == ref.shape, (name, head.shape, ref.shape)
        err = relative(head, ref)
        print(f"{name}: relative error {err:.2e}")
        if err > TOL:
            failures.append(f"{name} ({v}): {err:.3e}")
    assert not failures, failures


def test_jacobi_passes_match_the_consistency_rounds(oracle):
    failures = []
    for name, v in oracle["variants"].items():
        r, c, got = draft(oracle, name, oracle["root"] / "out" / name, greedy=True)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        drafts = got["case.0.step.0.logits"].argmax(-1)
        if drafts.tolist() != c["ref.drafts"].tolist():
            failures.append(f"{name}: drafts {drafts.tolist()} != {c['ref.drafts'].tolist()}")
        err = relative(got["case.0.step.0.head_logits"], c["ref.jacobi_logits"])
        if err > TOL:
            failures.append(f"{name}: last pass {err:.3e}")
    assert not failures, failures


def test_the_refiner_changes_the_drafts(oracle):
    """The comparison has power: the same checkpoint read as plain DFlash (the refiner's
    tensors dropped, speculators_model_type dflash) drafts other logits."""
    root = oracle["root"]
    dst = root / "fill-in-as-dflash"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(root / "out" / "fill-in", dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["speculators_model_type"] = "dflash"
    (dst / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(dst / "model.safetensors"))
    save_file({k: x for k, x in t.items() if not k.startswith("refiner_head.")},
              str(dst / "model.safetensors"))
    r, c, got = draft(oracle, "fill-in", dst)
    assert r.returncode == 0, r.stderr[-2000:]
    head = got.get("case.0.step.0.head_logits", got["case.0.step.0.logits"])
    assert relative(head, c["ref.logits"]) > 1e-2


BAD = {
    "missing-mixer": (lambda t: t.pop("refiner_head.mix_l"), None,
                      ["refiner_head.mix_l", "missing"]),
    "readout-shape": (lambda t: t.update({"refiner_head.readout.weight": torch.zeros(7, 16)}),
                      None, ["refiner_head.readout.weight", "[7, 16]", "xpress_rank"]),
    "extra": (lambda t: t.update({"refiner_head.extra.weight": torch.zeros(2)}), None,
              ["refiner_head.extra.weight", "unexpected"]),
    "rank-zero": (None, lambda c: c.update(xpress_rank=0), ["config.json", "xpress_rank"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_are_refused_by_name(oracle, case):
    tensors, config, words = BAD[case]
    root = oracle["root"]
    dst = root / f"broken-{case}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(root / "out" / "fill-in", dst)
    if tensors is not None:
        t = load_file(str(dst / "model.safetensors"))
        tensors(t)
        save_file(t, str(dst / "model.safetensors"))
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    r, _, _ = draft(oracle, "fill-in", dst)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in r.stderr, (case, w, r.stderr[-2000:])
