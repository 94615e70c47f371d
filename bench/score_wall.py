#!/usr/bin/env python3
"""Seconds to score a drafter end to end (an extractor and a scorer process on 127.0.0.1, the
specwire-score client), one generation at a time vs continuous batching.

The committed pair (models/tiny-qwen3, models/tiny-qwen3-dflash), --prompts prompts (the
held-out prompts, cycled, each made distinct) × --max_new_tokens tokens, fp32, one thread per
process. Two configurations, each on fresh processes:
  one at a time   the scorer keeps one Generate in flight (--generates_per_extractor=1) and the
                  extractor decodes one sequence at a time (--max_running_sequences=1)
  batched         the defaults: 8 Generates in flight, continuous batching in the extractor
Both reports must agree (τ and every prompt's step lengths: the same trajectories). Ends with
score_wall_ratio=<one-at-a-time seconds / batched seconds>.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "service"))

from extractor_harness import ExtractorServer, build_dir  # noqa: E402
from scorer_harness import ScorerServer  # noqa: E402


def run(config: str, dataset: Path, args, work: Path) -> tuple[float, dict]:
    one = config == "one at a time"
    ext = ExtractorServer(REPO / "models" / "tiny-qwen3", work / "logs", dtype="float32",
                          args=("--threads=1",) + (("--max_running_sequences=1",) if one else ()))
    ext.start()
    scorer = ScorerServer(ext.address, work / "logs", work / f"cache-{one}",
                          args=("--threads=1",) + (("--generates_per_extractor=1",) if one else ()))
    scorer.start()
    try:
        out = work / f"report-{one}.json"
        cmd = [str(build_dir() / "services" / "scorer" / "specwire-score"),
               f"--scorer={scorer.address}", f"--drafter={REPO / 'models' / 'tiny-qwen3-dflash'}",
               f"--dataset={dataset}", f"--max_new_tokens={args.max_new_tokens}", "--ddtree=8",
               "--quiet", f"--json_out={out}", "--scorer_timeout=3600"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, text=True)
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
    args = ap.parse_args()
    held = [json.loads(l)["prompt"] for l in
            (REPO / "models" / "heldout_prompts.jsonl").read_text().splitlines() if l.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        dataset = work / "prompts.jsonl"
        dataset.write_text("".join(
            json.dumps({"prompt": f"# {k}\n{held[k % len(held)]}"}) + "\n"
            for k in range(args.prompts)))
        rows = {}
        for config in ("one at a time", "batched"):
            rows[config] = run(config, dataset, args, work)
    (s1, r1), (s2, r2) = rows["one at a time"], rows["batched"]
    same = (r1["summary"]["tau_mean_of_means"] == r2["summary"]["tau_mean_of_means"] and
            [p["step_lengths"] for p in r1["prompts"]] == [p["step_lengths"] for p in r2["prompts"]])
    print(f"{args.prompts} prompts x {args.max_new_tokens} tokens, committed pair, fp32, "
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
