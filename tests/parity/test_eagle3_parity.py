"""Parity of the EAGLE-3 drafter (services/scorer/eagle3_drafter) with the reference model code of
the two packages people train it with: speculators 0.9.0 (`Eagle3DraftModel`) and SpecForge 0.2.0
(`LlamaForCausalLMEagle3`), installed --no-deps in .venv/trainer-oracles (scripts/setup.sh).

1. Forward: tiny random drafters of both formats over the options a config can set (Llama and
   Qwen3 layers, one and two layers, sliding windows, draft vocabularies smaller than the
   target's with random d2t / t2d maps, norm_before_fc / fc_norm / norm_before_residual /
   norm_output in both packages' meanings, biases, a target wider than the drafter, 2–4
   auxiliary layers), saved by the package's own save_pretrained. The package's own
   multi-step (test-time-training) forward, teacher-forced, gives every lane's logits at every
   step; specwire's chain at each context length, fed the same tokens, must give them within
   1e-5 relative (fp32), or, where the chained steps carry the reference's own fp32 rounding
   further (steps feed normed states back through more norms), be no further from the same
   forward in float64 than the reference is (1.5x, +1e-6).
2. Bad checkpoints: a missing or misshapen tensor, a draft vocabulary larger than the target's,
   d2t entries outside the target vocabulary or out of order, t2d disagreeing with d2t, auxiliary
   layers beyond the target, and a declaration of both formats: each a clear error naming the
   tensor or key, exit status 2, never a crash.

About 30 s on two cores (the reference runs once, in a subprocess: the trainers' pins clash with
the project's)."""
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
import hf_fixtures
import tree_checks

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
LENGTH = 14
STEPS = 5

# Hand-picked corners, then seeded random draws over the same space.
VARIANTS = {
    "spec-llama-pruned": {"format": "speculators", "arch": "llama", "hidden": 32, "vocab": 96,
                          "draft_vocab": 40, "aux_ids": [2, 4, 6]},
    "spec-all-norms": {"format": "speculators", "arch": "llama", "hidden": 32, "vocab": 96,
                       "draft_vocab": 96, "aux_ids": [1, 3, 8], "norm_before_fc": True,
                       "norm_before_residual": True, "norm_output": True},
    "spec-fc-norm-bias": {"format": "speculators", "arch": "llama", "hidden": 32, "vocab": 96,
                          "draft_vocab": 50, "aux_ids": [2, 5], "fc_norm": True,
                          "attention_bias": True, "mlp_bias": True, "theta": 500.0},
    "spec-qwen3-four-aux": {"format": "speculators", "arch": "qwen3", "hidden": 32, "vocab": 96,
                            "draft_vocab": 96, "aux_ids": [2, 4, 6, 7]},
    "spec-two-layers-window": {"format": "speculators", "arch": "llama", "hidden": 32,
                               "vocab": 96, "draft_vocab": 30, "aux_ids": [2, 4, 6],
                               "layers": 2, "window": 4},
    "sf-pruned": {"format": "specforge", "hidden": 32, "vocab": 96, "draft_vocab": 40,
                  "aux_ids": [1, 3, 5]},
    # SpecForge's serving export: no embed_tokens (the target's is used), legacy rope keys.
    "sf-sglang-export": {"format": "specforge", "hidden": 32, "vocab": 96, "draft_vocab": 40,
                         "aux_ids": [0, 1, 3], "sglang_export": True},
    "sf-fc-norm-no-final-norm-wide-target": {"format": "specforge", "hidden": 32,
                                             "target_hidden": 48, "vocab": 96,
                                             "draft_vocab": 96, "aux_ids": [0, 3, 5],
                                             "fc_norm": True, "norm_output": False},
}


def random_variants(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        fmt = rng.choice(["speculators", "specforge"])
        hidden = rng.choice([16, 32, 48])
        vocab = rng.choice([64, 96, 130])
        v = {"format": fmt, "hidden": hidden, "vocab": vocab,
             "draft_vocab": rng.choice([vocab, rng.randint(8, vocab - 1)]),
             "theta": rng.choice([10000.0, 1e6, 321.0])}
        if fmt == "speculators":
            v.update(arch=rng.choice(["llama", "qwen3"]), layers=rng.choice([1, 1, 2]),
                     aux_ids=sorted(rng.sample(range(1, 9), rng.randint(2, 4))),
                     norm_before_residual=rng.random() < 0.5, norm_output=rng.random() < 0.5)
            F.draw_speculators_switches(rng, v)
        else:
            v.update(aux_ids=sorted(rng.sample(range(0, 8), 3)), fc_norm=rng.random() < 0.5,
                     norm_output=rng.random() < 0.7)
            if rng.random() < 0.3:
                v["target_hidden"] = rng.choice([16, 48, 64])
        out[f"random-{seed}-{i}"] = v
    return out


def reference(out: Path, variants: dict, seed: int) -> None:
    spec = F.write_json(out / "spec.json", {"out": str(out), "variants": variants,
                                            "length": LENGTH, "steps": STEPS, "seed": seed})
    F.run_oracle_script("eagle3_reference.py", str(spec), timeout=600)


def draft(drafter: Path, cases: dict, ends: list[int], out: Path, *extra: str):
    return F.eagle_draft(drafter, cases, ends, STEPS + 1, out, *extra)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    F.require_oracles("speculators", "specforge")
    out = tmp_path_factory.mktemp("eagle3")
    # The target of the export variant: its embedding is the drafter's.
    target = hf_fixtures.make_checkpoint("sglang_target", out, overrides=dict(
        model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    save_file({"embed": embed.contiguous()}, str(out / "target_embed.safetensors"))
    seed, variants = F.seeded_variants("eagle3", VARIANTS, random_variants, 6)
    variants["sf-sglang-export"] = dict(variants["sf-sglang-export"],
                                        target_embed=str(out / "target_embed.safetensors"))
    reference(out, variants, seed)
    return out, variants, target


def test_forward_matches_the_reference_packages(oracle):
    out, variants, target = oracle
    ends = list(range(1, LENGTH - STEPS + 2))  # every lane whose teacher-forced chain fits
    failures = []
    for name, v in variants.items():
        cases = load_file(str(out / f"{name}.cases.safetensors"))
        extra = []
        if v.get("sglang_export"):  # no embedding of its own: the target's
            assert "embed_tokens.weight" not in load_file(str(out / name / "model.safetensors"))
            extra = [f"--target_checkpoint={target}"]
        got = draft(out / name, cases, ends, out / name, *extra)
        assert isinstance(got, dict), f"{name}: {got.stderr[-2000:]}"
        worst = 0.0
        for e, logits in got.items():
            assert logits.shape == (STEPS, v["draft_vocab"]), (name, logits.shape)
            for k in range(STEPS):
                ref = cases[f"ref.step.{k}"][e - 1]
                worst = max(worst, F.error_beside_float64(
                    logits[k], ref, cases[f"ref64.step.{k}"][e - 1], TOL, f"{name} lane {e - 1} step {k}", failures))
        print(f"{name}: worst relative error {worst:.2e}")
    assert not failures, "\n".join(failures)


def test_the_sliding_window_is_applied(oracle):
    """The two-layer window variant differs from the same weights without the window."""
    out, _, _ = oracle
    name = "spec-two-layers-window"
    nowin = out / "no-window"
    shutil.copytree(out / name, nowin)
    cfg = json.loads((nowin / "config.json").read_text())
    cfg["transformer_layer_config"]["layer_types"] = ["full_attention"] * 2
    (nowin / "config.json").write_text(json.dumps(cfg))
    cases = load_file(str(out / f"{name}.cases.safetensors"))
    got = draft(nowin, cases, [LENGTH - STEPS + 1], out / "no-window")
    ref = cases["ref.step.0"][LENGTH - STEPS]
    assert ((got[LENGTH - STEPS + 1][0] - ref).norm() / ref.norm()).item() > 1e-2


# --- bad checkpoints -------------------------------------------------------------------------

def broken(oracle, name: str, tag: str, config=None, tensors=None) -> Path:
    """A copy of a reference checkpoint with its config.json and/or tensors changed."""
    out, _, _ = oracle
    return F.broken_copy(out / name, out / f"broken-{tag}", tensors, config)


def refusal(oracle, drafter: Path, *extra: str) -> str:
    out, _, _ = oracle
    cases = load_file(str(out / "spec-llama-pruned.cases.safetensors"))
    return F.assert_refused(draft(drafter, cases, [3], out / f"{drafter.name}-run", *extra),
                            drafter.name, code=2)


def shifted_d2t(t):
    t["d2t"] = t["d2t"].clone()
    t["d2t"][-1] = 1000


def unordered_d2t(t):
    d = t["d2t"].clone()
    targets = torch.arange(len(d)) + d
    targets[0], targets[1] = targets[1].clone(), targets[0].clone()
    t["d2t"] = targets - torch.arange(len(d))


def t2d_disagrees(t):
    m = t["t2d"].clone()
    first = int(torch.nonzero(m)[0])
    m[first] = False
    m[int(torch.nonzero(~m)[-1])] = True
    t["t2d"] = m


BAD = {
    "missing tensor": ("spec-llama-pruned", None, lambda t: t.pop("norm.weight"),
                       ["norm.weight", "missing"]),
    "misshapen fc": ("spec-llama-pruned", None,
                     lambda t: t.update({"fc.weight": t["fc.weight"][:, :-1].contiguous()}),
                     ["fc.weight", "shape"]),
    "missing d2t": ("spec-llama-pruned", None, lambda t: t.pop("d2t"), ["\"d2t\"", "t2d"]),
    "d2t out of range": ("spec-llama-pruned", None, shifted_d2t, ["d2t", "outside the target"]),
    "d2t out of order": ("spec-llama-pruned", None, unordered_d2t, ["d2t", "ascending"]),
    "t2d disagrees": ("spec-llama-pruned", None, t2d_disagrees, ["t2d"]),
    "d2t not int64": ("spec-llama-pruned", None,
                      lambda t: t.update({"d2t": t["d2t"].to(torch.float32)}), ["d2t", "I64"]),
    "draft vocab too large": ("spec-llama-pruned",
                              lambda c: c.update(draft_vocab_size=97), None,
                              ["draft_vocab_size", "97"]),
    "unknown layer model_type": ("spec-llama-pruned",
                                 lambda c: c["transformer_layer_config"].update(
                                     model_type="gpt2"), None, ["model_type"]),
    "both formats declared": ("spec-llama-pruned",
                              lambda c: c.update(architectures=["LlamaForCausalLMEagle3"]),
                              None, ["architectures", "speculators_model_type"]),
    "specforge aux ids not three": ("sf-pruned",
                                    lambda c: c["eagle_config"].update(
                                        eagle_aux_hidden_state_layer_ids=[1, 2]),
                                    None, ["eagle_aux_hidden_state_layer_ids", "exactly 3"]),
    "fc_norm and norm_before_fc": ("spec-llama-pruned",
                                   lambda c: c.update(fc_norm=True, norm_before_fc=True), None,
                                   ["fc_norm", "norm_before_fc"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_are_refused_by_name(oracle, case):
    name, config, tensors, words = BAD[case]
    drafter = broken(oracle, name, case.replace(" ", "-"), config, tensors)
    err = refusal(oracle, drafter)
    for w in words:
        assert w in err, f"{case}: {w!r} not in {err[-1500:]}"


def test_layer_ids_beyond_the_target_are_refused(oracle, tmp_path):
    """Against the committed tiny target (4 layers): speculators' index 9, and SpecForge's id 4,
    are past its last layer; speculators' index 0 is the embedding output."""
    target = REPO / "models" / "tiny-qwen3"
    tc = json.loads((target / "config.json").read_text())
    V, H = tc["vocab_size"], tc["hidden_size"]
    for fmt, ids, word in (("speculators", [2, 3, 9], "hidden-state indices"),
                           ("speculators", [0, 2, 3], "embedding output"),
                           ("specforge", [1, 2, 4], "layer-output ids")):
        d = tmp_path / f"{fmt}-{ids[-1]}-{ids[0]}"
        write_random_drafter(d, fmt, V, H, ids)
        prompts = tmp_path / "prompts.json"
        prompts.write_text(json.dumps([[1, 2, 3]]))
        r = subprocess.run([str(F.replay_binary()), "replay", f"--drafter={d}",
                            f"--target_checkpoint={target}", f"--tokens_file={prompts}",
                            "--max_new_tokens=4", "--threads=1"],
                           capture_output=True, text=True, timeout=300)
        # The drafter does not fit this target (not a malformed request): FAILED_PRECONDITION, exit
        # 1, as the scorer service answers the same drafter.
        assert r.returncode == 1 and "FAILED_PRECONDITION" in r.stderr, (fmt, ids,
                                                                           r.stderr[-2000:])
        assert "eagle_aux_hidden_state_layer_ids" in r.stderr and word in r.stderr, r.stderr


def write_random_drafter(d: Path, fmt: str, V: int, H: int, ids: list[int]) -> None:
    """A one-layer EAGLE-3 checkpoint of random weights written directly (no package needed)."""
    d.mkdir(parents=True)
    heads, kv, hd, inter = 4, 2, H // 4, 2 * H
    layer = {"model_type": "llama", "vocab_size": V, "hidden_size": H,
             "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": heads,
             "num_key_value_heads": kv, "head_dim": hd, "rms_norm_eps": 1e-6,
             "max_position_embeddings": 512,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    if fmt == "speculators":
        cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3DraftModel"],
               "draft_vocab_size": V, "eagle_aux_hidden_state_layer_ids": ids,
               "transformer_layer_config": layer}
        prefix = "layers.0."
    else:
        cfg = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": V,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}
        prefix = "midlayer."
    (d / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.1  # noqa: E731
    t = {"fc.weight": r(H, len(ids) * H), "norm.weight": torch.ones(H),
         "lm_head.weight": r(V, H),
         prefix + "input_layernorm.weight": torch.ones(H),
         prefix + "hidden_norm.weight": torch.ones(H),
         prefix + "post_attention_layernorm.weight": torch.ones(H),
         prefix + "self_attn.q_proj.weight": r(heads * hd, 2 * H),
         prefix + "self_attn.k_proj.weight": r(kv * hd, 2 * H),
         prefix + "self_attn.v_proj.weight": r(kv * hd, 2 * H),
         prefix + "self_attn.o_proj.weight": r(H, heads * hd),
         prefix + "mlp.gate_proj.weight": r(inter, H), prefix + "mlp.up_proj.weight": r(inter, H),
         prefix + "mlp.down_proj.weight": r(H, inter)}
    if fmt == "specforge":
        t["d2t"] = torch.zeros(V, dtype=torch.int64)
        t["t2d"] = torch.ones(V, dtype=torch.bool)
    save_file(t, str(d / "model.safetensors"))


# --- 3. chain replay against a replay written on the reference model ---------------------------

REPLAY_PROMPT_LEN = 8
REPLAY_NEW_TOKENS = 40


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """A speculators drafter trained a little on a tiny random Qwen3 target's greedy
    trajectories (transformers), the reference replay of it (eagle3_reference.py replay), and
    specwire's (specwire-replay replay, the target in-process)."""
    root = tmp_path_factory.mktemp("eagle3-replay")
    target_dir, prompts, trajs, aux_ids = F.greedy_aux_data(root, 3, REPLAY_PROMPT_LEN,
                                                            REPLAY_NEW_TOKENS)
    results = {}
    for block in (4, 7):
        spec = root / f"replay{block}.json"
        drafter = root / f"drafter{block}"
        spec.write_text(json.dumps({
            "data": str(root / "data.safetensors"), "target": str(target_dir),
            "out": str(drafter), "prompt_len": REPLAY_PROMPT_LEN,
            "max_new_tokens": REPLAY_NEW_TOKENS, "block": block, "train_steps": 120,
            "aux_ids": aux_ids, "draft_vocab": 300}))
        r = F.run_oracle_script("eagle3_reference.py", "replay", str(spec))
        ref = json.loads(r.stdout.strip().splitlines()[-1])
        ours = F.run_replay(["replay", "--drafter", str(drafter), "--target_checkpoint",
                             str(target_dir), "--tokens_file",
                             str(F.write_json(root / "prompts.json", prompts)),
                             "--max_new_tokens", str(REPLAY_NEW_TOKENS), "--block", str(block),
                             "--ignore_model_eos", "--threads=1"])
        results[block] = (ref, ours)
    return {"trajectories": trajs, "results": results, "root": root, "target": target_dir,
            "prompts": prompts}


def test_chain_replay_equals_the_reference_replay(replayed):
    for block, (ref, ours) in replayed["results"].items():
        got, flat = F.assert_chain_replay(ours, ref, replayed["trajectories"], REPLAY_PROMPT_LEN,
                                          block)
        # Sums are the completion lengths.
        assert all(sum(s) == REPLAY_NEW_TOKENS - 1 for s in got)
        assert ours["format"] == "speculators" and ours["target_layer_ids"] == [0, 1, 2]
        print(f"block {block}: tau {ours['summary']['tau_mean_of_means']:.3f} over "
              f"{len(flat)} steps, draft vocabulary {ref['draft_vocab']}")


# --- 4. EAGLE's top-k tree -----------------------------------------------------------------------

TREES = [(4, 3, 10), (3, 5, 40), (5, 2, 6)]  # depth, top_k, total_tokens


@pytest.mark.parametrize("depth,top_k,total", TREES)
def test_eagle_tree_replay(replayed, depth, top_k, total):
    root, target = replayed["root"], replayed["target"]
    drafter = root / "drafter4"
    dump = root / f"trees-{depth}-{top_k}-{total}.json"
    ours = F.run_replay(["replay", "--drafter", str(drafter), "--target_checkpoint",
                         str(target), "--tokens_file", str(root / "prompts.json"),
                         "--max_new_tokens", str(REPLAY_NEW_TOKENS), "--ignore_model_eos",
                         "--threads=1", "--tree", f"{depth},{top_k},{total}",
                         "--tree_dump", str(dump)])
    trees = json.loads(dump.read_text())
    # 1. The algorithm: each step's accepted length from the transcription, on its own tree.
    queries, checked = tree_checks.check_tree_steps(
        ours["responses"], trees, replayed["trajectories"], REPLAY_PROMPT_LEN,
        REPLAY_NEW_TOKENS, depth, top_k, total)
    # 2. Every expanded node's children, against the reference model along its path.
    spec = root / "paths.json"
    spec.write_text(json.dumps({"drafter": str(drafter), "data": str(root / "data.safetensors"),
                                "queries": queries, "out": str(root / "paths.safetensors")}))
    F.run_oracle_script("eagle3_reference.py", "paths", str(spec))
    logp = load_file(str(root / "paths.safetensors"))
    cfg = json.loads((drafter / "config.json").read_text())
    t = load_file(str(drafter / "model.safetensors"))
    chosen = (torch.arange(cfg["draft_vocab_size"]) + t["d2t"]).tolist() if "d2t" in t else None
    tree_checks.check_children(checked, logp, chosen.__getitem__ if chosen else None)
    flat = [s for r in ours["responses"] for s in r["step_lengths"]]
    print(f"tree {depth},{top_k},{total}: tau {sum(flat) / len(flat):.3f} over {len(flat)} "
          f"steps; {len(checked)} nodes checked against the reference")
    assert max(flat) >= 3


@pytest.mark.parametrize("old,new", [("eagle3-replay", "replay"), ("eagle3-draft", "draft")])
def test_old_per_family_commands_are_refused_naming_the_new_one(old, new):
    """One --drafter path for every family: the per-family spellings are gone, and saying one
    names its replacement (exit 2, like any other bad argument)."""
    r = subprocess.run([str(F.replay_binary()), old, "--drafter=x"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"specwire-replay {new} --drafter DIR" in r.stderr, r.stderr
