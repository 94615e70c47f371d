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
from pathlib import Path

import pytest
import torch

import dflash_fixtures as F

REPO = Path(__file__).resolve().parents[2]
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
    F.require_oracles("speculators")
    return F.block_family_oracle(tmp_path_factory.mktemp("xpress"), "xpress",
                                 "xpress_reference.py", VARIANTS, random_variants, CONTEXT)


def draft(oracle: dict, name: str, drafter: Path, greedy: bool = False):
    v = oracle["variants"][name]
    return F.block_draft(oracle, name, drafter, v["block"] + (1 if v["sample_from_anchor"] else 0),
                         CONTEXT, greedy)


relative = F.relative


def test_teacher_forced_logits_match_speculators(oracle):
    failures = []
    for name, v, c, got in F.drafted_variants(oracle, draft):
        head, ref = got["case.0.step.0.head_logits"], c["ref.logits"]
        assert head.shape == ref.shape, (name, head.shape, ref.shape)
        err = relative(head, ref)
        print(f"{name}: relative error {err:.2e}")
        if err > TOL:
            failures.append(f"{name} ({v}): {err:.3e}")
    assert not failures, failures


def test_jacobi_passes_match_the_consistency_rounds(oracle):
    failures = []
    for name, v, c, got in F.drafted_variants(oracle, draft, greedy=True):
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

    def drop_refiner(t):
        for k in [k for k in t if k.startswith("refiner_head.")]:
            del t[k]

    dst = F.broken_copy(root / "out" / "fill-in", root / "fill-in-as-dflash", drop_refiner,
                        lambda c: c.update(speculators_model_type="dflash"))
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
    dst = F.broken_copy(root / "out" / "fill-in", root / f"broken-{case}", tensors, config)
    r, _, _ = draft(oracle, "fill-in", dst)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in r.stderr, (case, w, r.stderr[-2000:])


# --- the replay against a replay written on the reference's own drafting -----------------------

REPLAY_NEW_TOKENS = 40
REPLAY_PROMPTS = [[1, 5, 9, 14], [3, 200, 7, 7, 81, 12], [42], [9, 8, 7, 6, 5, 4, 3, 2]]


@pytest.fixture(scope="module", params=["random-refiner", "committed"])
def replayed(request, tmp_path_factory):
    """The committed DFlash drafter's backbone in a speculators XPress drafter with a random
    refiner, or the committed trained XPress drafter (models/tiny-qwen3-xpress, built by
    speculators' classes from its config.json), replayed by the reference (its backbone, then its Jacobi passes) and by
    specwire-replay's features command on the same greedy trajectories of the committed target
    and the same context features (transformers' hidden states, as the reference reads them:
    the Jacobi passes carry a feature's last-bit difference into a draft now and then, which a
    replay on the extractor's own features would show as a step of its own); and the backbone
    alone (the DFlash drafter) on them."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    F.require_oracles("speculators")
    root = tmp_path_factory.mktemp("xpress-replay")
    target = REPO / "models" / "tiny-qwen3"
    drafter = (REPO / "models" / "tiny-qwen3-xpress" if request.param == "committed"
               else root / "xpress")
    spec = F.write_json(root / "spec.json", {
        "dflash": str(REPO / "models" / "tiny-qwen3-dflash"), "target": str(target),
        "out": str(drafter), "prompts": REPLAY_PROMPTS,
        "max_new_tokens": REPLAY_NEW_TOKENS, "seed": 13, "rank": 16, "mlp_ratio": 2,
        "passes": 3, "refiner_scale": 1.0,
        **({"drafter": str(drafter)} if request.param == "committed" else {})})
    r = F.run_oracle_script("xpress_reference.py", "replay", str(spec))
    ref = json.loads(r.stdout.strip().splitlines()[-1])
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    ids = json.loads((REPO / "models" / "tiny-qwen3-dflash" / "config.json").read_text())[
        "dflash_config"]["target_layer_ids"]
    cases, tensors = [], {}
    for i, (p, traj) in enumerate(zip(REPLAY_PROMPTS, ref["trajectories"])):
        with torch.no_grad():
            hs = hf(torch.tensor([traj]), output_hidden_states=True).hidden_states
        feats = torch.cat([hs[k + 1] for k in ids], dim=-1)[0].contiguous()
        tensors[f"case.{i}.canonical"], tensors[f"case.{i}.foreign"] = feats, feats.clone()
        # Room past the trajectory: every block is a full one, as the reference drafts them.
        cases.append({"trajectory": traj, "prompt_len": len(p), "max_length": len(traj) + 16})
    save_file(tensors, str(root / "cases.safetensors"), metadata={"cases": json.dumps(cases)})
    ours, dflash = (F.run_replay(["features", "--drafter", str(d), "--target_checkpoint",
                                  str(target), "--cases", str(root / "cases.safetensors"),
                                  "--threads=1"])
                    for d in (drafter, REPO / "models" / "tiny-qwen3-dflash"))
    return ref, ours, dflash


def test_replay_equals_the_reference_replay(replayed):
    ref, ours, dflash = replayed
    assert ours["method"] == "xpress" and ours["format"] == "speculators"
    F.assert_replays_as_reference([r["canonical"] for r in ours["responses"]],
                                  ref["step_lengths"],
                                  [r["canonical"] for r in dflash["responses"]], "XPress")
