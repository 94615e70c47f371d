"""DFlash drafters in vllm-project/speculators' format (speculators_model_type "dflash"): the
forward of specwire's DFlashDrafter against speculators 0.9.0's own DFlashDraftModel
(tests/parity/dflash_speculators_reference.py, in a subprocess with .venv/trainer-oracles), on
checkpoints written by the package's save_pretrained: full and draft vocabularies (lm_head of its
own, d2t / t2d), one and two layers, 2–3 auxiliary layers in speculators' convention (HF
hidden-state indices, the last layer's index included), block sizes 4–16. The block's logits
must agree within 1e-5 relative (fp32), and tokens outside a draft vocabulary are −inf. Bad
declarations are refused by name. About 15 s on two cores."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import dflash_fixtures as F

REPO = Path(__file__).resolve().parents[2]
ORACLES = REPO / ".venv" / "trainer-oracles"
CONTEXT = 11
TOL = 1e-5

VARIANTS = {
    "full-two-layers": {"layers": 2, "theta": 1e6, "block": 8, "draft_vocab": 512,
                        "aux_ids": [1, 3]},
    "pruned-last-layer": {"layers": 1, "theta": 1e4, "block": 16, "draft_vocab": 200,
                          "aux_ids": [2, 3, 4]},
}


def random_variants(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    return {f"random-{seed}-{i}": {
        "layers": rng.choice([1, 2]), "theta": rng.choice([1e4, 1e6]),
        "block": rng.choice([4, 8, 16]),
        "draft_vocab": rng.choice([512, rng.randint(16, 511)]),
        "aux_ids": sorted(rng.sample(range(1, 5), rng.randint(2, 3)))} for i in range(n)}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    if not (ORACLES / "speculators").is_dir():
        pytest.fail("speculators is not in .venv/trainer-oracles (scripts/setup.sh)",
                    pytrace=False)
    root = tmp_path_factory.mktemp("dflash-speculators")
    target = F.make_target(root)
    seed = int(os.environ.get("SPECWIRE_DFLASH_SEED", time.strftime("%Y%m%d")))
    print(f"speculators DFlash random variants: seed {seed}")
    variants = {**VARIANTS, **random_variants(seed, 3)}
    spec = root / "spec.json"
    spec.write_text(json.dumps({"target": str(target), "out": str(root / "out"),
                                "context": CONTEXT, "seed": seed, "variants": variants}))
    env = dict(os.environ, PYTHONPATH=str(ORACLES), TORCHDYNAMO_DISABLE="1")
    r = subprocess.run([sys.executable, str(Path(__file__).parent /
                                            "dflash_speculators_reference.py"), str(spec)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return {"root": root, "target": target, "variants": variants}


def draft(oracle: dict, name: str, drafter: Path):
    out = oracle["root"] / "out"
    cases = out / f"{name}.cases.safetensors"
    with safe_open(str(cases), "pt") as f:
        anchor = int(f.metadata()["anchor"])
    c = load_file(str(cases))
    block = oracle["variants"][name]["block"]
    inp = oracle["root"] / f"{drafter.name}.in.safetensors"
    save_file({"case.0.features": c["case.0.features"]}, str(inp), metadata={"cases": json.dumps(
        [{"steps": [{"context_end": CONTEXT, "anchor": anchor, "len": block}]}])})
    res = oracle["root"] / f"{drafter.name}.out.safetensors"
    r = subprocess.run([str(F.replay_binary()), "draft", f"--drafter={drafter}",
                        f"--target_checkpoint={oracle['target']}", f"--cases={inp}",
                        f"--out={res}", "--threads=1"], capture_output=True, text=True,
                       timeout=300)
    return r, c, (load_file(str(res))["case.0.step.0.logits"] if r.returncode == 0 else None)


def test_forward_matches_speculators(oracle):
    failures = []
    for name, v in oracle["variants"].items():
        r, c, got = draft(oracle, name, oracle["root"] / "out" / name)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        chosen, ref = c["ref.chosen"], c["ref.logits"]
        assert got.shape == (v["block"] - 1, 512)
        err = ((got[:, chosen] - ref).norm() / ref.norm()).item()
        outside = torch.ones(512, dtype=torch.bool)
        outside[chosen] = False
        assert torch.isneginf(got[:, outside]).all(), name
        print(f"{name}: relative error {err:.2e}")
        if err > TOL:
            failures.append(f"{name} ({v}): {err:.3e}")
    assert not failures, failures


BAD = {
    "sample_from_anchor": (lambda c: c.update(sample_from_anchor=True), None,
                           ["sample_from_anchor"]),
    "no aux ids": (lambda c: c.pop("aux_hidden_state_layer_ids"), None,
                   ["aux_hidden_state_layer_ids", "missing"]),
    "embedding index": (lambda c: c.update(aux_hidden_state_layer_ids=[0, 2]), None,
                        ["aux_hidden_state_layer_ids", "embedding output"]),
    "no mask token": (lambda c: c.pop("mask_token_id"), None, ["mask_token_id"]),
    "draft vocab without its head": (None, lambda t: t.pop("lm_head.weight"),
                                     ["lm_head.weight", "missing"]),
    "draft vocab too large": (lambda c: c.update(draft_vocab_size=513), None,
                              ["draft_vocab_size", "513"]),
    "another speculators family": (lambda c: c.update(speculators_model_type="dflash3"), None,
                                   ["speculators_model_type", "dflash3"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_declarations_are_refused_by_name(oracle, case):
    edit_config, edit_tensors, words = BAD[case]
    src = oracle["root"] / "out" / "pruned-last-layer"
    dst = oracle["root"] / f"bad-{case.replace(' ', '-')}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    if edit_config:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if edit_tensors:
        t = load_file(str(dst / "model.safetensors"))
        edit_tensors(t)
        save_file(t, str(dst / "model.safetensors"))
    r, _, _ = draft(oracle, "pruned-last-layer", dst)
    assert r.returncode == 2, (case, r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in r.stderr, (case, w, r.stderr[-1500:])
