#!/usr/bin/env python3
"""Seconds to score a drafter end to end (an extractor and a scorer process on 127.0.0.1, the
specwire-score client), one generation at a time vs continuous batching.

--target tiny: the committed pair (models/tiny-qwen3, models/tiny-qwen3-dflash), where decoding
is cheap; --target qwen3-100m: the ~100M Qwen3 of bench/extract_vs_hf.py with a random one-layer
DFlash drafter (B = 16, target layers 1, 6, 11; built with dflash's own model class, cached in
build/bench-models), where decoding dominates. --prompts prompts (the held-out prompts, cycled,
each made distinct; for the 100M target, which has no tokenizer, seeded random token ids) ×
--max_new_tokens tokens, fp32, one thread per process. Two
configurations, each on fresh processes:
  one at a time   the scorer keeps one Generate in flight (--generates_per_extractor=1) and the
                  extractor decodes one sequence at a time (--max_running_sequences=1)
  batched         the defaults: 8 Generates in flight, continuous batching in the extractor
Both reports must agree (τ and every prompt's step lengths: the same trajectories). Ends with
score_wall_ratio=<one-at-a-time seconds / batched seconds>.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "service"))

from extractor_harness import ExtractorServer, build_dir  # noqa: E402
from scorer_harness import ScorerServer  # noqa: E402


def hundred_m_pair(cache: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(REPO / "bench"))
    import torch
    import transformers
    from dflash.model import DFlashDraftModel

    import extract_vs_hf
    target = extract_vs_hf.build_model(cache)
    drafter = cache / "qwen3-100m-dflash"
    if not (drafter / "config.json").exists():
        t = extract_vs_hf.QWEN3_100M
        cfg = transformers.Qwen3Config(
            vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
            intermediate_size=t["intermediate_size"], num_hidden_layers=1,
            num_attention_heads=t["num_attention_heads"],
            num_key_value_heads=t["num_key_value_heads"], head_dim=t["head_dim"],
            max_position_embeddings=4096, rope_theta=1e6, block_size=16,
            num_target_layers=t["num_hidden_layers"],
            dflash_config={"mask_token_id": t["vocab_size"] - 1, "target_layer_ids": [1, 6, 11]})
        cfg.architectures = ["DFlashDraftModel"]
        torch.manual_seed(1)
        DFlashDraftModel(cfg).save_pretrained(drafter, safe_serialization=True)
    return target, drafter


def run(config: str, dataset: Path, args, work: Path) -> tuple[float, dict]:
    one = config == "one at a time"
    ext = ExtractorServer(args.target_dir, work / "logs", dtype="float32",
                          args=("--threads=1",) + (("--max_running_sequences=1",) if one else ()))
    ext.start()
    scorer = ScorerServer(ext.address, work / "logs", work / f"cache-{one}",
                          args=("--threads=1",) + (("--generates_per_extractor=1",) if one else ()))
    scorer.start()
    try:
        out = work / f"report-{one}.json"
        cmd = [str(build_dir() / "services" / "scorer" / "specwire-score"),
               f"--scorer={scorer.address}", f"--drafter={args.drafter_dir}",
               f"--dataset={dataset}", f"--max_new_tokens={args.max_new_tokens}", "--ddtree=8",
               "--quiet", f"--json_out={out}", "--scorer_timeout=3600"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"specwire-score failed ({config}):\n{r.stderr[-3000:]}")
        seconds = time.perf_counter() - t0
        return seconds, json.loads(out.read_text())
    finally:
        scorer.stop()
        ext.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--target", choices=["tiny", "qwen3-100m"], default="tiny")
    ap.add_argument("--cache-dir", type=Path, default=REPO / "build" / "bench-models")
    args = ap.parse_args()
    if args.target == "tiny":
        args.target_dir = REPO / "models" / "tiny-qwen3"
        args.drafter_dir = REPO / "models" / "tiny-qwen3-dflash"
    else:
        args.target_dir, args.drafter_dir = hundred_m_pair(args.cache_dir)
    held = [json.loads(l)["prompt"] for l in
            (REPO / "models" / "heldout_prompts.jsonl").read_text().splitlines() if l.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        dataset = work / "prompts.jsonl"
        if args.target == "tiny":
            lines = [{"prompt": f"# {k}\n{held[k % len(held)]}"} for k in range(args.prompts)]
        else:  # no tokenizer: seeded random token ids, 16-48 of them
            g = random.Random(0)
            lines = [{"input_ids": [g.randrange(32000) for _ in range(g.randint(16, 48))]}
                     for _ in range(args.prompts)]
        dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
        rows = {}
        for config in ("one at a time", "batched"):
            rows[config] = run(config, dataset, args, work)
    (s1, r1), (s2, r2) = rows["one at a time"], rows["batched"]
    same = (r1["summary"]["tau_mean_of_means"] == r2["summary"]["tau_mean_of_means"] and
            [p["step_lengths"] for p in r1["prompts"]] == [p["step_lengths"] for p in r2["prompts"]])
    print(f"{args.prompts} prompts x {args.max_new_tokens} tokens, target {args.target}, fp32, "
          "extractor and scorer one thread each")
    print(f"{'configuration':<16} {'seconds':>8} {'tau':>7} {'prompts/s':>10}")
    for name, (s, r) in rows.items():
        print(f"{name:<16} {s:>8.1f} {r['summary']['tau_mean_of_means']:>7.3f} "
              f"{args.prompts / s:>10.2f}")
    print(f"reports agree (tau, every prompt's step lengths): {same}")
    print(f"score_wall_ratio={s1 / s2:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
