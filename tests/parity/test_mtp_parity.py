"""Parity of the MTP drafter (services/scorer/drafters/mtp_drafter) with speculators 0.9.0's MTP
head (`MTPDraftModel`, its converter for a checkpoint's own mtp.* tensors), installed --no-deps in
.venv/trainer-oracles; the chain a serving engine runs is written in mtp_reference.py from the
head's definition on the package's own forward (transformers has no MTP forward: it drops mtp.*).

1. Forward: tiny random targets (Qwen3.5 hybrids as Qwen3_5ForCausalLM and as a VLM package,
   Qwen3) with random heads of their layer type, stored as the target's own mtp.* tensors or by
   speculators' save_pretrained, over every switch the layer has (schedules, kv heads, partial
   rotary, theta, tied heads); the teacher-forced chain of K drafts after every context end must
   match the reference within 1e-5 relative (fp32), or be no further from float64 than the
   reference is; every first draft must match the package's own multi-step forward.
2. Bad checkpoints and configs: each refused naming the file, key or tensor.
3. Replay: a head trained with the package's own loss on a Qwen3.5 target's greedy trajectories,
   written into the target as its mtp.* tensors; `specwire-replay replay --drafter mtp` gives the
   step lengths of a replay on the reference chain, step for step, and says which tensors became
   the drafter. Its tree: each step against EAGLE-2's algorithm transcribed, each expanded
   node's children against the reference forward along the node's path.

About 60 s on two cores (the reference runs in a subprocess)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import dflash_fixtures as F
import tree_checks

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
LENGTH = 10
DRAFTS = 4  # per chain


def q35(**kw) -> dict:
    return kw


VARIANTS = {
    "q35-text-target": {"arch": "qwen3_5", "format": "target",
                        "config": q35(num_hidden_layers=4, full_attention_interval=2)},
    "q35-vlm-target-tied": {"arch": "qwen3_5", "format": "target", "vlm": True,
                            "config": q35(num_hidden_layers=4, full_attention_interval=4,
                                          tie_word_embeddings=True)},
    "q35-speculators-custom": {
        "arch": "qwen3_5", "format": "speculators",
        "config": q35(num_hidden_layers=5, layer_types=["full_attention", "linear_attention",
                                                        "full_attention", "linear_attention",
                                                        "linear_attention"],
                      num_key_value_heads=1,
                      rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                           partial_rotary_factor=0.5))},
    "qwen3-speculators": {"arch": "qwen3", "format": "speculators",
                          "config": {"num_hidden_layers": 3, "theta": 500.0}},
    "qwen3-target": {"arch": "qwen3", "format": "target",
                     "config": {"num_hidden_layers": 2, "num_key_value_heads": 4}},
}


def random_variants(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        arch = rng.choice(["qwen3_5", "qwen3_5", "qwen3"])
        v = {"arch": arch, "format": rng.choice(["target", "speculators"])}
        if arch == "qwen3_5":
            layers = rng.randint(2, 6)
            types = [rng.choice(["linear_attention", "full_attention"]) for _ in range(layers)]
            types[rng.randrange(layers)] = "full_attention"
            v["config"] = q35(num_hidden_layers=layers, layer_types=types,
                              num_key_value_heads=rng.choice([1, 2, 4]),
                              tie_word_embeddings=rng.random() < 0.5,
                              rope_parameters=dict(rope_type="default",
                                                   rope_theta=rng.choice([1e4, 1e6, 321.0]),
                                                   partial_rotary_factor=rng.choice(
                                                       [0.25, 0.5, 1.0])))
            v["vlm"] = v["format"] == "target" and rng.random() < 0.4
        else:
            v["config"] = {"num_hidden_layers": rng.randint(1, 4),
                           "num_key_value_heads": rng.choice([1, 2, 4]),
                           "theta": rng.choice([1e4, 1e6, 321.0]),
                           "hidden_size": rng.choice([32, 48, 64]),
                           "vocab_size": rng.choice([97, 160, 256])}
        out[f"random-{seed}-{i}"] = v
    return out


def paths(out: Path, name: str, v: dict) -> tuple[Path, Path]:
    """(drafter, target) directories of a variant."""
    target = out / f"{name}.target"
    return (target if v["format"] == "target" else out / f"{name}.head"), target


def draft(drafter: Path, target: Path, cases: dict, ends: list[int], out: Path, *extra: str):
    return F.eagle_draft(drafter, cases, ends, DRAFTS + 1, out, f"--target_checkpoint={target}",
                         *extra, key="logits")


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    return F.chain_family_oracle(tmp_path_factory.mktemp("mtp"), "mtp", ("speculators",), VARIANTS,
                                 random_variants, 4, length=LENGTH, drafts=DRAFTS)


def test_chain_matches_the_reference(oracle):
    out, variants = oracle
    ends = list(range(1, LENGTH + 1))
    failures = []
    for name, v in variants.items():
        cases = load_file(str(out / f"{name}.cases.safetensors"))
        drafter, target = paths(out, name, v)
        got = draft(drafter, target, cases, ends, out / name)
        assert isinstance(got, dict), f"{name}: {got.stderr[-2000:]}"
        step0 = cases["ref.step0"]
        worst = 0.0
        for e, logits in got.items():
            assert logits.shape == (DRAFTS, step0.shape[-1]), (name, logits.shape)
            if e - 1 < step0.shape[0]:  # the package's own forward: the first draft
                ref = step0[e - 1]
                err = ((logits[0] - ref).norm() / ref.norm()).item()
                if err > TOL:
                    failures.append(f"{name} end {e}: first draft {err:.3e} from speculators' "
                                    f"forward")
            worst = max(worst, F.error_after_end(logits, cases, e, TOL, name, failures))
        print(f"{name}: worst relative error {worst:.2e}")
    assert not failures, "\n".join(failures)


def test_the_chain_feeds_its_own_output_and_the_drafts(oracle):
    """A check that the comparison has power: the chain's later drafts change with the token fed
    to them (the first does not), and with mtp.norm (the state fed back)."""
    out, variants = oracle
    name = "q35-text-target"
    drafter, target = paths(out, name, variants[name])
    cases = load_file(str(out / f"{name}.cases.safetensors"))
    other = dict(cases)
    tok = cases["case.0.tokens"].clone()
    tok[LENGTH:] = (tok[LENGTH:] + 1) % cases["ref.step0"].shape[-1]
    other["case.0.tokens"] = tok
    got = draft(drafter, target, other, [LENGTH], out / "other-tokens")
    ref = cases[f"ref.end.{LENGTH}"]
    assert ((got[LENGTH][0] - ref[0]).norm() / ref[0].norm()).item() < TOL
    assert ((got[LENGTH][2:] - ref[2:]).norm() / ref[2:].norm()).item() > 1e-3


# --- bad checkpoints -------------------------------------------------------------------------

def broken(oracle, name: str, tag: str, config=None, tensors=None) -> tuple[Path, Path]:
    out, variants = oracle
    drafter, target = paths(out, name, variants[name])
    dst = F.broken_copy(drafter, out / f"broken-{tag}", tensors, config)
    return dst, (dst if variants[name]["format"] == "target" else target)


BAD = {
    "missing-fc": ("q35-text-target", None, lambda t: t.pop("mtp.fc.weight"),
                   ["mtp.fc.weight", "missing", "MTP"]),
    "fc-shape": ("q35-text-target", None,
                 lambda t: t.update({"mtp.fc.weight": torch.zeros(64, 64)}),
                 ["mtp.fc.weight", "[64, 128]"]),
    "two-mtp-layers": ("q35-text-target", lambda c: c.update(mtp_num_hidden_layers=2), None,
                       ["config.json", "mtp_num_hidden_layers", "2"]),
    "speculators-extra": ("qwen3-speculators", None,
                          lambda t: t.update({"mtp_layers.0.extra.weight": torch.zeros(2)}),
                          ["mtp_layers.0.extra.weight", "MTP"]),
    "speculators-two-heads": ("qwen3-speculators",
                              lambda c: c.update(num_nextn_predict_layers=2), None,
                              ["config.json", "num_nextn_predict_layers"]),
    "target-extra-mtp": ("q35-text-target", None,
                         lambda t: t.update({"mtp.layers.1.mlp.up_proj.weight": torch.zeros(2)}),
                         ["mtp.layers.1.mlp.up_proj.weight", "unexpected"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_are_refused_by_name(oracle, case):
    out, _ = oracle
    name, config, tensors, words = BAD[case]
    d, target = broken(oracle, name, case, config, tensors)
    cases = load_file(str(out / f"{name}.cases.safetensors"))
    F.assert_refused(draft(d, target, cases, [3], out / f"{case}-run"), case, words)


def test_a_head_for_another_target_depth_is_refused(oracle):
    out, variants = oracle
    drafter, _ = paths(out, "qwen3-speculators", variants["qwen3-speculators"])
    _, other_target = paths(out, "qwen3-target", variants["qwen3-target"])
    cases = load_file(str(out / "qwen3-speculators.cases.safetensors"))
    r = draft(drafter, other_target, cases, [3], out / "depth-run")
    assert not isinstance(r, dict)
    assert "num_hidden_layers" in r.stderr and "3 layers" in r.stderr, r.stderr[-2000:]


def test_mtp_without_a_target_is_refused(oracle, tmp_path):
    r = subprocess.run([str(F.replay_binary()), "draft", "--drafter=mtp",
                        f"--cases={tmp_path / 'x'}", f"--out={tmp_path / 'y'}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--target_checkpoint" in r.stderr, r.stderr


# --- 3. replay against a replay written on the reference chain ----------------------------------

PROMPT_LEN = 6
NEW_TOKENS = 40
BLOCK = 4


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp-replay")
    sys.path.insert(0, str(Path(__file__).parent))
    import hybrid_fixtures as HF
    target_dir = HF.save_text(HF.random_causal_lm("interval4", 5), root / "target")
    rng = random.Random(7)
    prompts = [[rng.randrange(512) for _ in range(PROMPT_LEN)] for _ in range(5)]
    block = BLOCK
    spec = root / "replay.json"
    spec.write_text(json.dumps({"target": str(target_dir), "prompt_len": PROMPT_LEN,
                                "max_new_tokens": NEW_TOKENS, "prompts": prompts,
                                "block": block, "train_steps": 12}))
    r = F.run_oracle_script("mtp_reference.py", "replay", str(spec))
    ref = json.loads(r.stdout.strip().splitlines()[-1])
    ours = F.run_replay(["replay", "--drafter", "mtp", "--target_checkpoint", str(target_dir),
                         "--tokens_file", str(F.write_json(root / "prompts.json", prompts)),
                         "--max_new_tokens", str(NEW_TOKENS), "--block", str(block),
                         "--ignore_model_eos", "--threads=1"])
    return {"ref": ref, "ours": ours, "target": str(target_dir), "prompts": prompts}


def test_replay_equals_the_reference_replay(replayed):
    ours, ref = replayed["ours"], replayed["ref"]
    _, flat = F.assert_chain_replay(ours, ref, ref["trajectories"], PROMPT_LEN)
    assert ours["method"] == "mtp" and ours["format"] == "target"
    assert ours["target_layer_ids"] == [7]  # the final-normed last state (HF hidden_states[8])
    tensors = ours["drafter_tensors"]
    assert "mtp.fc.weight" in tensors and "mtp.layers.0.self_attn.q_proj.weight" in tensors
    assert all(t.startswith("mtp.") for t in tensors) and len(tensors) == 15, tensors
    tau = ours["summary"]["tau_mean_of_means"]
    print(f"MTP replay: tau {tau:.3f} over {len(flat)} steps")


MTP_TREES = [(3, 3, 8), (2, 6, 20), (3, 1, 3)]  # depth, top_k, total_tokens


@pytest.mark.parametrize("depth,top_k,total", MTP_TREES)
def test_mtp_tree_replay(replayed, tmp_path, depth, top_k, total):
    """The head's own tree (EAGLE's top-k tree, as SGLang's EAGLE worker grows it over an MTP
    head): every step's length is the transcribed algorithm's on its tree; every expanded node's
    children are the reference forward's top-k along the node's path; the top-1 tree of the
    chain's depth is the chain."""
    dump = tmp_path / "trees.json"
    ours = F.run_replay(["replay", "--drafter", "mtp", "--target_checkpoint",
                         replayed["target"], "--tokens_file",
                         str(F.write_json(tmp_path / "prompts.json", replayed["prompts"])),
                         "--max_new_tokens", str(NEW_TOKENS), "--ignore_model_eos",
                         "--threads=1", "--tree", f"{depth},{top_k},{total}",
                         "--tree_dump", str(dump)])
    trajectories = replayed["ref"]["trajectories"]
    queries, checked = tree_checks.check_tree_steps(
        ours["responses"], json.loads(dump.read_text()), trajectories, PROMPT_LEN, NEW_TOKENS,
        depth, top_k, total)
    spec = tmp_path / "paths.json"
    spec.write_text(json.dumps({"target": replayed["target"], "drafts": BLOCK - 1,
                                "trajectories": trajectories, "queries": queries,
                                "out": str(tmp_path / "paths.safetensors")}))
    F.run_oracle_script("mtp_reference.py", "paths", str(spec))
    tree_checks.check_children(checked, load_file(str(tmp_path / "paths.safetensors")))
    flat = [a for r in ours["responses"] for a in r["step_lengths"]]
    if top_k == 1 and depth == BLOCK - 1:
        assert [r["step_lengths"] for r in ours["responses"]] == replayed["ref"]["step_lengths"]
    assert max(flat) >= 3 and min(flat) == 1, flat  # the check has power
    print(f"MTP tree {depth},{top_k},{total}: tau {sum(flat) / len(flat):.3f} over {len(flat)} "
          f"steps; {len(checked)} nodes checked against the reference")


def test_the_services_score_the_head_as_the_replay_does(replayed, tmp_path):
    """The target's own head as the drafter of a scorer job, named two ways: the target's
    directory (the scorer reads the head) and "mtp" (the scorer fetches the contract's mtp.*
    tensors and config.json from the extractor, which has the only copy of the checkpoint; in
    process too). The extractor serves the target's final-normed states and its embedding and
    lm_head; every job's step lengths are the replay's, and the teacher-forced T > 0 rows come
    from the chain's q. A target without a head is refused naming drafter_path."""
    sys.path.insert(0, str(REPO / "tests" / "deploy"))
    import deploy_harness as D
    target = Path(replayed["target"])
    prompts = replayed["prompts"]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in prompts))
    ex = D.extractor(target, tmp_path, D.free_port()).start()
    sc = None
    reports = {}
    try:
        sc = D.scorer(ex.address, tmp_path, D.free_port(), tmp_path / "cache").start()
        for name, where, drafter in (("dir", f"--scorer={sc.address}", str(target)),
                                     ("mtp", f"--scorer={sc.address}", "mtp"),
                                     ("mtp-in-process", f"--extractor={ex.address}", "mtp")):
            report = tmp_path / f"report-{name}.json"
            extra = ["--cache_dir=none"] if where.startswith("--extractor") else []
            r = subprocess.run([str(D.binary("services/scorer/specwire-score")), where,
                                f"--drafter={drafter}", f"--dataset={dataset}",
                                f"--max_new_tokens={NEW_TOKENS}", f"--json_out={report}",
                                "--temperature=0.7", "--quiet", "--scorer_timeout=120", *extra],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, (name, r.stderr[-3000:])
            reports[name] = json.loads(report.read_text())
        fetched = list((tmp_path / "cache" / "target-mtp").iterdir())
        assert len(fetched) == 1 and (fetched[0] / "config.json").read_text() == \
            (target / "config.json").read_text()
    finally:
        if sc is not None:
            sc.stop()
        ex.stop()
    rep = reports["dir"]
    assert rep["labels"]["method"] == "mtp"
    ours = replayed["ours"]["responses"]
    compared = 0
    for p, replay in zip(rep["prompts"], ours):
        if p["completion_tokens"] == replay["completion_tokens"]:  # no stop token cut it short
            assert p["step_lengths"] == replay["step_lengths"], p["prompt_index"]
            compared += 1
    assert compared >= 3, compared
    rules = {t["rule"]: t for t in rep["summary"]["temperature"]}
    assert set(rules) == {"argmax_draft", "draft_distribution"}, rules
    for t in rules.values():
        assert t["teacher_forced"] and t["temperature"] == 0.7
        assert len(t["alpha"]) == 3 and all(0.0 <= a <= 1.0 for a in t["alpha"])
        assert t["tau_prob"] >= 1.0
    for name in ("mtp", "mtp-in-process"):
        other = reports[name]
        assert other["labels"]["drafter"] == "mtp" and other["labels"]["method"] == "mtp", name
        assert [p["step_lengths"] for p in other["prompts"]] == \
            [p["step_lengths"] for p in rep["prompts"]], name
        for x, y in zip(other["summary"]["temperature"], rep["summary"]["temperature"]):
            assert (x["rule"], x["blocks"], x["alpha_blocks"]) == \
                (y["rule"], y["blocks"], y["alpha_blocks"]), name
            # The same head and states; the sums' rounding may differ (another thread count).
            assert x["tau_prob"] == pytest.approx(y["tau_prob"], rel=1e-7), name
            assert x["alpha"] == pytest.approx(y["alpha"], rel=1e-7), name


def test_mtp_of_a_target_without_a_head_is_refused(tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "deploy"))
    import deploy_harness as D
    ex = D.extractor(REPO / "models" / "tiny-qwen3", tmp_path, D.free_port()).start()
    try:
        r = subprocess.run([str(D.binary("services/scorer/specwire-score")),
                            f"--extractor={ex.address}", "--drafter=mtp", "--tokens=1,2,3",
                            "--max_new_tokens=4", "--cache_dir=none", "--quiet"],
                           capture_output=True, text=True, timeout=300)
    finally:
        ex.stop()
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert 'drafter_path "mtp"' in r.stderr and "no multi-token-prediction head" in r.stderr, \
        r.stderr[-2000:]
