"""DFlash and DFlash2 drafters in vllm-project/speculators' format (speculators_model_type
"dflash" / "dflash2") and DFlash2 in z-lab's format: the forward of specwire's DFlashDrafter
against speculators 0.9.0's own DFlashDraftModel / DFlash2DraftModel
(tests/parity/dflash_speculators_reference.py, in a subprocess with .venv/trainer-oracles), on
checkpoints written by the package's save_pretrained: full and draft vocabularies (lm_head of its
own, d2t / t2d), one and two layers, 2–3 auxiliary layers in speculators' convention (HF
hidden-state indices, the last layer's index included), block sizes 4–16; DFlash2 with random
grouped dynamic convolutions and candidate selectors (kernel 1–3, groups of 8–32 channels,
selector rank and top-k). The block's logits must agree within 1e-5 relative (fp32), tokens
outside a draft vocabulary are −inf, and DFlash2's drafted path equals the greedy walk over the
package's own candidate scores; under teacher forcing its scores (the logits of its proposal q at
T > 0) are the package's given the trajectory's predecessors. The DFlash2 checkpoints are also written in z-lab's
DFlash2DraftModel layout and checked against dflash 0.1.0's own model (forward, compute_logits,
propose, and q at T > 0 given dflash's own sampled walk). Bad declarations are refused by name. About 20 s on two cores."""
from __future__ import annotations

import copy
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
    "dflash2-k2": {"layers": 2, "theta": 1e6, "block": 8, "draft_vocab": 512, "aux_ids": [1, 3],
                   "dflash2": True, "conv_kernel_size": 2, "conv_group_size": 16,
                   "selector_rank": 32, "selector_top_k": 8},
    "dflash2-k3-wide-groups": {"layers": 1, "theta": 1e4, "block": 16, "draft_vocab": 512,
                               "aux_ids": [2, 4], "dflash2": True, "conv_kernel_size": 3,
                               "conv_group_size": 32, "selector_rank": 16,
                               "selector_top_k": 16},
}


def random_variants(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        v = {"layers": rng.choice([1, 2]), "theta": rng.choice([1e4, 1e6]),
             "block": rng.choice([4, 8, 16]),
             "draft_vocab": rng.choice([512, rng.randint(16, 511)]),
             "aux_ids": sorted(rng.sample(range(1, 5), rng.randint(2, 3)))}
        if i % 2:
            v.update(dflash2=True, draft_vocab=512, conv_kernel_size=rng.randint(1, 3),
                     conv_group_size=rng.choice([8, 16, 32]), selector_rank=rng.choice([8, 64]),
                     selector_top_k=rng.choice([1, 4, 16]))
        out[f"random-{seed}-{i}"] = v
    return out


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    if not (ORACLES / "speculators").is_dir():
        pytest.fail("speculators is not in .venv/trainer-oracles (scripts/setup.sh)",
                    pytrace=False)
    root = tmp_path_factory.mktemp("dflash-speculators")
    target = F.make_target(root)
    seed = int(os.environ.get("SPECWIRE_DFLASH_SEED", time.strftime("%Y%m%d")))
    print(f"speculators DFlash random variants: seed {seed}")
    variants = {**VARIANTS, **random_variants(seed, 4)}
    spec = root / "spec.json"
    spec.write_text(json.dumps({"target": str(target), "out": str(root / "out"),
                                "context": CONTEXT, "seed": seed, "variants": variants}))
    env = dict(os.environ, PYTHONPATH=str(ORACLES), TORCHDYNAMO_DISABLE="1")
    r = subprocess.run([sys.executable, str(Path(__file__).parent /
                                            "dflash_speculators_reference.py"), str(spec)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return {"root": root, "target": target, "variants": variants}


def draft(oracle: dict, name: str, drafter: Path, given: list[int] | None = None):
    """specwire-replay draft of the variant's block; with `given`, the block's draft positions
    condition on those tokens (teacher forcing: a case trajectory after the anchor)."""
    out = oracle["root"] / "out"
    cases = out / f"{name}.cases.safetensors"
    with safe_open(str(cases), "pt") as f:
        anchor = int(f.metadata()["anchor"])
    c = load_file(str(cases))
    block = oracle["variants"][name]["block"]
    tag = "" if given is None else "-given"
    inp = oracle["root"] / f"{drafter.name}{tag}.in.safetensors"
    case = {"case.0.features": c["case.0.features"]}
    if given is not None:  # rows past the context are never read; the trajectory is
        feats = c["case.0.features"]
        case["case.0.features"] = torch.cat([feats, feats.new_zeros(len(given) + 1, feats.shape[1])])
        case["case.0.tokens"] = torch.tensor([0] * CONTEXT + [anchor] + list(given))
    save_file(case, str(inp), metadata={"cases": json.dumps(
        [{"steps": [{"context_end": CONTEXT, "anchor": anchor, "len": block}]}])})
    res = oracle["root"] / f"{drafter.name}{tag}.out.safetensors"
    r = subprocess.run([str(F.replay_binary()), "draft", f"--drafter={drafter}",
                        f"--target_checkpoint={oracle['target']}", f"--cases={inp}",
                        f"--out={res}", "--threads=1"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        return r, c, None
    got = load_file(str(res))
    if given is not None:
        return r, c, got["case.0.step.0.logits"]
    # DFlash2's block logits before its selector (its "logits" are the selector's scores).
    return r, c, got.get("case.0.step.0.block_logits", got["case.0.step.0.logits"])


def assert_same_proposal(got: torch.Tensor, ref: torch.Tensor, what: str) -> float:
    """Proposal logits that are −inf outside each row's candidates: the same candidates, and the
    scores within TOL relative. The relative error."""
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref)), what
    finite = ~torch.isneginf(ref)
    err = ((got[finite] - ref[finite]).norm() / ref[finite].norm()).item()
    assert err < TOL, (what, err)
    return err


def test_dflash2_selector_q_under_teacher_forcing(oracle):
    """DFlash2's proposal at T > 0 is the selector's softmax over its candidates, each position
    scored from its predecessor: given a trajectory, the one before it in the trajectory."""
    for name, v in oracle["variants"].items():
        if not v.get("dflash2"):
            continue
        c = load_file(str(oracle["root"] / "out" / f"{name}.cases.safetensors"))
        r, _, got = draft(oracle, name, oracle["root"] / "out" / name, c["ref.given"].tolist())
        assert r.returncode == 0, (name, r.stderr[-2000:])
        err = assert_same_proposal(got, c["ref.forced_logits"], name)
        print(f"{name}: teacher-forced selector scores, relative error {err:.2e}")


def test_forward_matches_speculators(oracle):
    failures = []
    for name, v, c, got in F.drafted_variants(oracle, draft):
        chosen, ref = c["ref.chosen"], c["ref.logits"]
        assert got.shape == (v["block"] - 1, 512)
        err = ((got[:, chosen] - ref).norm() / ref.norm()).item()
        outside = torch.ones(512, dtype=torch.bool)
        outside[chosen] = False
        assert torch.isneginf(got[:, outside]).all(), name
        if v.get("dflash2"):
            path = load_file(str(oracle["root"] / f"{name}.out.safetensors"))["case.0.step.0.path"]
            assert path.tolist() == c["ref.path"].tolist(), name
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


def to_zlab(src: Path, dst: Path, num_target_layers: int) -> Path:
    """A speculators DFlash2 checkpoint in z-lab's DFlash2DraftModel layout: a top-level Qwen3
    config with dflash_config (target_layer_ids = speculators' ids − 1); the same tensors."""
    cfg = json.loads((src / "config.json").read_text())
    z = dict(cfg["transformer_layer_config"])
    z.update(architectures=["DFlash2DraftModel"], model_type="qwen3", is_causal=False,
             block_size=cfg["block_size"], num_target_layers=num_target_layers,
             dflash_config={"mask_token_id": cfg["mask_token_id"],
                            "target_layer_ids": [k - 1 for k in cfg["aux_hidden_state_layer_ids"]],
                            "block_size": cfg["block_size"],
                            **{k: cfg[k] for k in ("conv_kernel_size", "conv_group_size",
                                                   "selector_rank", "selector_top_k")}})
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(z))
    shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    return dst


def test_dflash2_in_zlab_format_matches_dflash(oracle):
    from dflash.model import DFlash2DraftModel
    hf = F.hf_target(oracle["target"])
    for name, v in oracle["variants"].items():
        if not v.get("dflash2"):
            continue
        zdir = to_zlab(oracle["root"] / "out" / name, oracle["root"] / f"zlab-{name}",
                       hf.config.num_hidden_layers)
        r, c, got = draft(oracle, name, zdir)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        with safe_open(str(oracle["root"] / "out" / f"{name}.cases.safetensors"), "pt") as f:
            anchor = int(f.metadata()["anchor"])
        z = DFlash2DraftModel.from_pretrained(str(zdir), dtype=torch.float32).eval()
        B = v["block"]
        block = torch.tensor([[anchor] + [511] * (B - 1)])
        with torch.no_grad():
            noise = hf.get_input_embeddings()(block)
            hidden = z(position_ids=torch.arange(CONTEXT + B)[None], noise_embedding=noise,
                       target_hidden=c["case.0.features"][None])[:, 1:]
            logits = z.compute_logits(hidden, hf.lm_head)[0]
            path, _, _ = z.propose(hidden, block[:, 0], hf.lm_head, 0.0)
        err = ((got - logits).norm() / logits.norm()).item()
        assert err < TOL, (name, err)
        zpath = load_file(str(oracle["root"] / f"zlab-{name}.out.safetensors"))["case.0.step.0.path"]
        assert zpath.tolist() == path[0].tolist() == c["ref.path"].tolist(), name
        # At T > 0 dflash's walk samples each position from q over its candidates and feeds the
        # draw on: given those draws, specwire's q rows are dflash's — within 1e-5, or no further
        # from dflash's own walk in float64 (the same seed, the same draws) than 1.5 times
        # dflash's float32 walk is (two float32 sums of one forward differ by that much).
        z64 = DFlash2DraftModel.from_pretrained(str(zdir), dtype=torch.float64).eval()
        head64 = copy.deepcopy(hf.lm_head).double()
        with torch.no_grad():
            hidden64 = z64(position_ids=torch.arange(CONTEXT + B)[None],
                           noise_embedding=noise.double(),
                           target_hidden=c["case.0.features"][None].double())[:, 1:]
        for temperature in (0.6, 1.0, 1.7):
            walks = []
            for model, h, head in ((z, hidden, hf.lm_head), (z64, hidden64, head64)):
                torch.manual_seed(int(1000 * temperature) + B)
                with torch.no_grad():
                    sampled, cands, q_rows = model.propose(h, block[:, 0], head, temperature)
                walks.append((sampled, cands, torch.zeros(B - 1, 512, dtype=torch.float64)
                              .scatter(1, cands[0], q_rows[0].double())))
            (sampled, cands, ref), (sampled64, cands64, exact) = walks
            r, _, got = draft(oracle, name, zdir, sampled[0, :-1].tolist())
            assert r.returncode == 0, (name, r.stderr[-2000:])
            q = torch.softmax(got.double() / temperature, -1)
            err = (q - ref).abs().max().item()
            if err < 1e-5:
                continue
            assert torch.equal(sampled, sampled64) and torch.equal(cands, cands64), (
                name, temperature, err, "float64 drew otherwise: no exact side to judge by")
            ours, theirs = (q - exact).abs().max().item(), (ref - exact).abs().max().item()
            assert ours <= 1.5 * theirs + 1e-6, (name, temperature, err, ours, theirs)
