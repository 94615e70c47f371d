"""Parity of the P-EAGLE drafter (services/scorer/drafters/peagle_drafter, read by the EAGLE-3
loader) with the reference model code of the two packages people train it with: speculators
0.9.0 (`PEagleDraftModel`, speculators_model_type "peagle") and SpecForge 0.2.0
(`PEagleDraftModel` + `OnlinePEagleModel`), installed --no-deps in .venv/trainer-oracles.

1. Forward: tiny random drafters of both formats over every switch a config has (Llama and Qwen3
   layers, one and two layers, sliding windows, pruned draft vocabularies with random d2t / t2d,
   norm_before_fc / fc_norm / norm_before_residual, norm_output (inert), biases, 2-4 auxiliary
   layers; SpecForge: a target wider than the drafter, llama3 rope scaling its rotary ignores),
   saved by the package's own save_pretrained. The package's training forward over a layout of
   every context row and, after each context end, the block's future slots gives every block's
   logits; specwire's block at each context end (one forward: the anchor row, then fc(mask_hidden)
   at the mask token) must give them within 1e-5 relative (fp32), or be no further from the same
   forward in float64 than the reference is.
2. Bad checkpoints: mask_hidden missing or misshapen, mask_token_id missing (SpecForge keeps it
   in its run config) or outside the vocabulary, an unexpected tensor: each an error naming the
   file, key or tensor, exit status 2.
3. Replay: a speculators P-EAGLE drafter trained a little on a tiny target's greedy trajectories;
   specwire-replay's step lengths equal a replay written on the package's forward, step for step,
   and the drafter runs behind the one --drafter path with DDTree over its block marginals.

About 40 s on two cores (the reference runs in a subprocess: the trainers' pins clash with the
project's)."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import dflash_fixtures as F

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
LENGTH = 10
DRAFTS = 5  # per block: the anchor row's draft and 4 future slots

VARIANTS = {
    "spec-llama-pruned": {"format": "speculators", "arch": "llama", "hidden": 32, "vocab": 96,
                          "draft_vocab": 40, "aux_ids": [2, 4, 6], "mask_token_id": 95},
    "spec-all-norms": {"format": "speculators", "arch": "llama", "hidden": 32, "vocab": 96,
                       "draft_vocab": 96, "aux_ids": [1, 3, 8], "norm_before_fc": True,
                       "norm_before_residual": True, "norm_output": True, "mask_token_id": 0},
    "spec-fc-norm-bias": {"format": "speculators", "arch": "llama", "hidden": 32, "vocab": 96,
                          "draft_vocab": 50, "aux_ids": [2, 5], "fc_norm": True,
                          "attention_bias": True, "mlp_bias": True, "theta": 500.0,
                          "mask_token_id": 7},
    "spec-qwen3-four-aux-window": {"format": "speculators", "arch": "qwen3", "hidden": 32,
                                   "vocab": 96, "draft_vocab": 96, "aux_ids": [2, 4, 6, 7],
                                   "layers": 2, "window": 3, "mask_token_id": 50},
    "sf-pruned": {"format": "specforge", "hidden": 32, "vocab": 96, "draft_vocab": 40,
                  "aux_ids": [1, 3, 5], "mask_token_id": 90},
    "sf-two-layers-wide-target-scaled-rope": {"format": "specforge", "hidden": 32,
                                              "target_hidden": 48, "vocab": 96,
                                              "draft_vocab": 96, "aux_ids": [0, 3, 5],
                                              "layers": 2, "rope_scaling": True,
                                              "norm_before_residual": True,
                                              "mask_token_id": 11},
}


def random_variants(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        fmt = rng.choice(["speculators", "specforge"])
        vocab = rng.choice([64, 96, 130])
        v = {"format": fmt, "hidden": rng.choice([16, 32, 48]), "vocab": vocab,
             "draft_vocab": rng.choice([vocab, rng.randint(8, vocab - 1)]),
             "theta": rng.choice([10000.0, 1e6, 321.0]), "layers": rng.choice([1, 1, 2]),
             "mask_token_id": rng.randrange(vocab),
             "norm_before_residual": rng.random() < 0.5}
        if fmt == "speculators":
            v.update(arch=rng.choice(["llama", "qwen3"]),
                     aux_ids=sorted(rng.sample(range(1, 9), rng.randint(2, 4))),
                     norm_output=rng.random() < 0.5)
            F.draw_speculators_switches(rng, v)
        else:
            v.update(aux_ids=sorted(rng.sample(range(0, 8), 3)),
                     rope_scaling=rng.random() < 0.3)
            if rng.random() < 0.3:
                v["target_hidden"] = rng.choice([16, 48, 64])
        out[f"random-{seed}-{i}"] = v
    return out


def draft(drafter: Path, cases: dict, ends: list[int], out: Path, *extra: str):
    return F.eagle_draft(drafter, cases, ends, DRAFTS + 1, out, *extra)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    return F.chain_family_oracle(tmp_path_factory.mktemp("peagle"), "peagle", ("speculators", "specforge"), VARIANTS,
                                 random_variants, 6, length=LENGTH, drafts=DRAFTS)


def test_forward_matches_the_reference_packages(oracle):
    out, variants = oracle
    ends = list(range(1, LENGTH + 1))
    failures = []
    for name, v in variants.items():
        cases = load_file(str(out / f"{name}.cases.safetensors"))
        got = draft(out / name, cases, ends, out / name)
        assert isinstance(got, dict), f"{name}: {got.stderr[-2000:]}"
        worst = 0.0
        for e, logits in got.items():
            assert logits.shape == (DRAFTS, v["draft_vocab"]), (name, logits.shape)
            worst = max(worst, F.error_after_end(logits, cases, e, TOL, name, failures))
        print(f"{name}: worst relative error {worst:.2e}")
    assert not failures, "\n".join(failures)


def test_the_future_slots_depend_on_mask_hidden_and_the_window(oracle):
    """A check that the comparison has power: the drafts after the first change when
    mask_hidden changes (the first does not), and the windowed variant differs from the same
    weights without its window."""
    out, _ = oracle
    name = "spec-llama-pruned"
    cases = load_file(str(out / f"{name}.cases.safetensors"))
    other = out / "other-mask-hidden"
    shutil.copytree(out / name, other, dirs_exist_ok=True)
    t = load_file(str(other / "model.safetensors"))
    t["mask_hidden"] = (t["mask_hidden"] + 1.0).contiguous()
    save_file(t, str(other / "model.safetensors"))
    got = draft(other, cases, [LENGTH], out / "other-run")
    ref = cases[f"ref.end.{LENGTH}"]
    assert torch.allclose(got[LENGTH][0], ref[0], rtol=1e-5, atol=1e-6)
    assert ((got[LENGTH][1:] - ref[1:]).norm() / ref[1:].norm()).item() > 1e-2

    name = "spec-qwen3-four-aux-window"
    nowin = out / "no-window"
    shutil.copytree(out / name, nowin, dirs_exist_ok=True)
    cfg = json.loads((nowin / "config.json").read_text())
    cfg["transformer_layer_config"]["layer_types"] = ["full_attention"] * 2
    (nowin / "config.json").write_text(json.dumps(cfg))
    cases = load_file(str(out / f"{name}.cases.safetensors"))
    got = draft(nowin, cases, [LENGTH], out / "no-window-run")
    ref = cases[f"ref.end.{LENGTH}"]
    assert ((got[LENGTH] - ref).norm() / ref.norm()).item() > 1e-3


# --- bad checkpoints -------------------------------------------------------------------------

def broken(oracle, name: str, tag: str, config=None, tensors=None) -> Path:
    out, _ = oracle
    dst = F.broken_copy(out / name, out / f"broken-{tag}", tensors, config)
    return dst


BAD = {
    "no-mask-hidden": ("spec-llama-pruned", None, lambda t: t.pop("mask_hidden"),
                       ["mask_hidden"]),
    "mask-hidden-shape": ("sf-pruned", None,
                          lambda t: t.update(mask_hidden=torch.zeros(1, 1, 17)),
                          ["mask_hidden", "[1, 1, 96]"]),
    "sf-no-mask-token": ("sf-pruned", lambda c: c.pop("mask_token_id"), None,
                         ["config.json", "mask_token_id", "run config"]),
    "mask-token-outside": ("spec-llama-pruned", lambda c: c.update(mask_token_id=96), None,
                           ["mask_token_id", "96", "vocab_size"]),
    "extra-tensor": ("sf-pruned", None,
                     lambda t: t.update({"layers.0.extra.weight": torch.zeros(2)}),
                     ["layers.0.extra.weight", "P-EAGLE"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_are_refused_by_name(oracle, case):
    out, _ = oracle
    name, config, tensors, words = BAD[case]
    d = broken(oracle, name, case, config, tensors)
    cases = load_file(str(out / f"{name}.cases.safetensors"))
    F.assert_refused(draft(d, cases, [3], out / f"{case}-run"), case, words, code=2)


# --- 3. replay against a replay written on the reference forward -------------------------------

PROMPT_LEN = 8
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    root = tmp_path_factory.mktemp("peagle-replay")
    target_dir, prompts, trajs, aux_ids = F.greedy_aux_data(root, 4, PROMPT_LEN, NEW_TOKENS)
    block = 5
    drafter = root / "drafter"
    spec = root / "replay.json"
    spec.write_text(json.dumps({
        "data": str(root / "data.safetensors"), "target": str(target_dir), "out": str(drafter),
        "prompt_len": PROMPT_LEN, "max_new_tokens": NEW_TOKENS, "block": block,
        "train_steps": 150, "aux_ids": aux_ids, "mask_token_id": 499}))
    r = F.run_oracle_script("peagle_reference.py", "replay", str(spec))
    ref = json.loads(r.stdout.strip().splitlines()[-1])
    ours = F.run_replay(["replay", "--drafter", str(drafter), "--target_checkpoint",
                         str(target_dir), "--tokens_file",
                         str(F.write_json(root / "prompts.json", prompts)),
                         "--max_new_tokens", str(NEW_TOKENS), "--block", str(block),
                         "--ignore_model_eos", "--threads=1", "--ddtree", "4,16"])
    return {"trajectories": trajs, "ref": ref, "ours": ours}


@pytest.fixture(scope="module")
def committed_replayed(tmp_path_factory):
    """The committed trained P-EAGLE drafter (models/tiny-qwen3-peagle, a 1024-token draft
    vocabulary) on the committed target: the reference replay on speculators' PEagleDraftModel
    built from its config.json, and specwire-replay's, on the same greedy trajectories."""
    root = tmp_path_factory.mktemp("peagle-committed")
    target_dir = REPO / "models" / "tiny-qwen3"
    drafter = REPO / "models" / "tiny-qwen3-peagle"
    cfg = json.loads((drafter / "config.json").read_text())
    hf = F.hf_target(target_dir)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 2000) for _ in range(PROMPT_LEN)] for _ in range(6)]
    aux_ids = cfg["eagle_aux_hidden_state_layer_ids"]
    # Index i is decoder layer i − 1's output before the final norm, also for the last layer
    # (transformers' hidden_states[L] is after it): the layers' own outputs, hooked.
    raw = {}
    hooks = [layer.register_forward_hook(
        lambda mod, a, out, i=i: raw.__setitem__(i + 1, out[0] if isinstance(out, tuple)
                                                  else out))
        for i, layer in enumerate(hf.model.layers)]
    with torch.no_grad():
        trajs = F.greedy_batch(hf, prompts, NEW_TOKENS)
        hf(torch.tensor(trajs))
    for h in hooks:
        h.remove()
    F.save_aux_data(root / "data.safetensors", trajs, raw, aux_ids)
    block = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] + 1
    spec = F.write_json(root / "replay.json", {
        "data": str(root / "data.safetensors"), "target": str(target_dir),
        "drafter": str(drafter), "prompt_len": PROMPT_LEN, "max_new_tokens": NEW_TOKENS,
        "block": block, "mask_token_id": cfg["mask_token_id"]})
    r = F.run_oracle_script("peagle_reference.py", "replay", str(spec))
    ref = json.loads(r.stdout.strip().splitlines()[-1])
    ours = F.run_replay(["replay", "--drafter", str(drafter), "--target_checkpoint",
                         str(target_dir), "--tokens_file",
                         str(F.write_json(root / "prompts.json", prompts)),
                         "--max_new_tokens", str(NEW_TOKENS), "--ignore_model_eos",
                         "--threads=1", "--ddtree", "none"])
    return {"trajectories": trajs, "ref": ref, "ours": ours}


def test_committed_drafter_replays_as_the_reference(committed_replayed):
    ours, ref = committed_replayed["ours"], committed_replayed["ref"]
    _, flat = F.assert_chain_replay(ours, ref, committed_replayed["trajectories"], PROMPT_LEN)
    assert ours["method"] == "peagle" and ours["format"] == "speculators"
    print(f"committed P-EAGLE replay: tau {sum(flat) / len(flat):.3f} over {len(flat)} steps")


def test_replay_equals_the_reference_replay(replayed):
    ours, ref = replayed["ours"], replayed["ref"]
    _, flat = F.assert_chain_replay(ours, ref, replayed["trajectories"], PROMPT_LEN)
    assert ours["method"] == "peagle" and ours["format"] == "speculators"
    assert ours["target_layer_ids"] == [0, 1, 2]
    # DDTree over the block's per-position marginals: never below the chain, and a larger
    # budget never below a smaller one.
    s = ours["summary"]
    tau = s["tau_mean_of_means"]
    t4, t16 = (s["ddtree_tau"][b]["tau_mean_of_means"] for b in ("4", "16"))
    assert t16 >= t4 >= tau - 1e-9, (tau, t4, t16)
    print(f"P-EAGLE replay: tau {tau:.3f}, DDTree-4 {t4:.3f}, DDTree-16 {t16:.3f} over "
          f"{len(flat)} steps")
