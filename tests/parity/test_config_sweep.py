"""Config-space parity: random config.json files (config_space.py) against transformers.

For every generated config specwire either matches AutoModelForCausalLM on every tap (fp32 within
1e-5 relative; bf16 within 1e-2, or, where transformers' own bf16 forward is further than that
from its fp32 forward at a tap, within 1.5 times that distance: rounding level for the dtype;
greedy identical in fp32), or refuses it with INVALID_ARGUMENT naming the key. A config
transformers itself cannot build or run must be refused too. Never a silent difference, never
INTERNAL, never a crash. Each config runs under one --kernels choice (auto, fast or reference),
drawn from its seed.

CI runs a bounded sample whose seed changes every day (printed; set SPECWIRE_SWEEP_SEED to repeat
a run). A long run by hand:
    SPECWIRE_SWEEP_CONFIGS=300 .venv/bin/python -m pytest tests/parity/test_config_sweep.py -q -s
prints how many configs were tried, matched and refused.
"""
from __future__ import annotations

import datetime
import json
import os
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import config_space
import hybrid_fixtures as hy
from hf_fixtures import greedy, hf_taps, rel_err, run_extract, write_tokens

pytestmark = pytest.mark.usefixtures("extract_bin")

BASE_SEED = int(os.environ.get("SPECWIRE_SWEEP_SEED",
                               datetime.date.today().toordinal() * 1000))
COUNT = int(os.environ.get("SPECWIRE_SWEEP_CONFIGS", "10"))
TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2}
NEW_TOKENS = 8
OUTCOMES: Counter = Counter()


def build_checkpoint(family: str, raw: dict, path: Path) -> transformers.PreTrainedModel | None:
    """The checkpoint transformers writes for `raw`, with config.json replaced by `raw` itself (so
    both sides read one file), and transformers' model loaded back from it; None when
    transformers refuses the config (at construction, save or load)."""
    cfg = dict(raw)
    model_type = cfg.pop("model_type")
    try:
        config = transformers.AutoConfig.for_model(model_type, **cfg)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name or name.endswith("bias"):
                    p.add_(torch.randn_like(p) * 0.1)
        if family == "qwen3_5_vlm":
            hy.save_vlm(model, path)
            vlm = json.loads((path / "config.json").read_text())
            text = dict(raw)
            text["model_type"] = "qwen3_5_text"
            written = {"model_type": "qwen3_5", "architectures": vlm["architectures"],
                       "text_config": text, "vision_config": vlm["vision_config"],
                       "tie_word_embeddings": raw.get("tie_word_embeddings", False)}
        else:
            model.save_pretrained(path, safe_serialization=True)
            written = {**raw, "architectures": [type(model).__name__]}
        (path / "config.json").write_text(json.dumps(written, indent=1))
        (path / "generation_config.json").unlink(missing_ok=True)
        oracle = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                    attn_implementation="sdpa")
        return oracle.eval()
    except Exception as e:  # transformers refused the config
        print(f"    transformers refuses: {type(e).__name__}: {str(e)[:160]}")
        return None


def hf_greedy_any(model: transformers.PreTrainedModel, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation: generate(), or where generate() cannot run the model
    (a Qwen3.5 stack of linear-attention layers only has no attention cache to size itself by),
    the same greedy rule as full forwards without a cache."""
    try:
        return greedy(model, prompt, n, eos=None)
    except (StopIteration, RuntimeError, ValueError):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(n):
                logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
                ids.append(int(logits[0, -1].argmax()))
        return ids[len(prompt):]


def assert_named_refusal(res, where: str) -> None:
    assert res.returncode == 2, (
        f"{where}: specwire exit {res.returncode} (negative = signal; 2 = a refusal)\n{res.stderr}")
    assert "INVALID_ARGUMENT" in res.stderr and "INTERNAL" not in res.stderr, (
        f"{where}: not a clear INVALID_ARGUMENT: {res.stderr}")
    assert re.search(r'key "[^"]+"|tensor "[^"]+"|layer_types|missing', res.stderr), (
        f"{where}: the refusal names no key: {res.stderr}")


@pytest.mark.parametrize("k", range(COUNT))
def test_random_config_matches_transformers_or_is_refused(k, tmp_path) -> None:
    seed = BASE_SEED + k
    family, raw, mutation = config_space.draw_mutated_config(seed)
    # Each config under one kernel set, drawn from the seed: every choice of --kernels must
    # match (auto: the family's default; fast; reference, transformers' own ops).
    kernels = ("auto", "fast", "reference")[seed % 3]
    where = (f"seed {seed} ({family}{', ' + mutation if mutation else ''}; "
             f"--kernels {kernels})")
    print(f"\n{where}: {json.dumps(raw, sort_keys=True)}")
    path = tmp_path / "ckpt"
    oracle = build_checkpoint(family, raw, path)
    rng = random.Random(seed)
    seqs = [[rng.randrange(raw["vocab_size"]) for _ in range(n)]
            for n in config_space.sequence_lengths(rng, raw)]
    exact = None
    if oracle is not None:
        try:
            exact = hf_taps(oracle, seqs)
        except Exception as e:  # transformers builds the model but cannot run it
            print(f"    transformers fails in the forward: {type(e).__name__}: {str(e)[:160]}")
            oracle = None
    tokens = write_tokens(tmp_path / "tokens.json", seqs)
    layers = ",".join(map(str, range(raw["num_hidden_layers"])))

    def extract(dtype: str):
        out = tmp_path / f"out-{dtype}.safetensors"
        res = run_extract(["extract", "--model", str(path), "--dtype", dtype, "--tokens_file",
                           str(tokens), "--layers", layers, "--embedding", "--final_norm",
                           "--kernels", kernels, "--out", str(out)], check=False)
        return res, out

    if oracle is None:
        # transformers cannot build or load this config: specwire must refuse the config itself
        # (a named key), not get as far as looking for weights.
        bare = tmp_path / "config-only"
        bare.mkdir()
        (bare / "config.json").write_text(json.dumps(raw))
        res = run_extract(["extract", "--model", str(bare), "--tokens", "1", "--layers", "0",
                           "--out", str(tmp_path / "none.safetensors")], check=False)
        assert "safetensors" not in res.stderr or "key \"" in res.stderr, (
            f"{where}: transformers refuses this config but specwire accepts it "
            f"(it went on to the weights): {res.stderr}")
        assert_named_refusal(res, where)
        OUTCOMES["refused by both"] += 1
        return
    res, out = extract("float32")
    if res.returncode != 0:
        assert_named_refusal(res, where)
        OUTCOMES["refused by specwire"] += 1
        print(f"    specwire refuses: {res.stderr.strip()[:200]}")
        return
    OUTCOMES["matched"] += 1
    # Greedy first: the bf16 reference below converts the oracle in place.
    prompt = seqs[1]
    want = hf_greedy_any(oracle, prompt, NEW_TOKENS)
    for dtype, tol in TOLERANCE.items():
        if dtype != "float32":
            res, out = extract(dtype)
            assert res.returncode == 0, f"{where} {dtype}: {res.stderr}"
        ref = exact if dtype == "float32" else hf_taps(oracle.to(torch.bfloat16), seqs)
        got = load_file(out)
        worst = 0.0
        for i, taps in enumerate(ref):
            for tap, want_tap in taps.items():
                err = rel_err(got[f"seq.{i}.{tap}"], want_tap)
                worst = max(worst, err)
                # transformers' own rounding at this tap: its bf16 forward against its fp32 one.
                own = rel_err(want_tap, exact[i][tap]) if dtype != "float32" else 0.0
                assert err <= max(tol, 1.5 * own), (
                    f"{where} {dtype}: seq {i} (len {len(seqs[i])}) tap {tap}: rel err "
                    f"{err:.3e} > {tol:.0e} (transformers' own {dtype} error there: {own:.3e})")
        print(f"    {dtype}: worst rel err {worst:.2e}")
    res = run_extract(["generate", "--model", str(path), "--tokens", ",".join(map(str, prompt)),
                       "--max_new_tokens", str(NEW_TOKENS), "--ignore_model_eos",
                       "--kernels", kernels])
    ours = json.loads(res.stdout)
    ours = ours[0] if isinstance(ours, list) else ours
    assert ours["tokens"] == want, f"{where}: greedy differs\n  ours {ours['tokens']}\n  hf {want}"


def test_sweep_summary() -> None:
    """Runs last (file order): how many configs were tried and what became of them."""
    print(f"\nconfig sweep: seed {BASE_SEED}, {sum(OUTCOMES.values())} configs tried: "
          + ", ".join(f"{n} {what}" for what, n in sorted(OUTCOMES.items())))
