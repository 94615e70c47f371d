#!/usr/bin/env python3
"""Generate throughput of one extractor: continuous batching vs one request at a time.

For each ~100M target (the Qwen3 of bench/extract_vs_hf.py, the Qwen3.5 hybrid of
bench/hybrid_vs_hf.py; random weights, cached in build/bench-models), one specwire-extractor
serves, on 127.0.0.1:
  one at a time   Generate requests sent one after another (one prompt each): every decoding
                  step serves one sequence, as when Generate ran one request at a time. Measured
                  on --sequential prompts (its rate does not depend on how many follow).
  batched         --prompts requests sent at once (one client thread each): the extractor admits
                  them all and each decoding step serves every sequence still running.
Both at --max_new_tokens completion tokens per prompt (stop tokens ignored), prompts of 16-48
tokens. Completion tokens/s are compared; the same run also measures, while --long_generates
long Generates run, the latency of a 16-token Extract (p50 / p99 over --extracts calls sent one
after another), and the extractor's peak RSS (VmHWM).

Ends with generate_batching_ratio=<batched tokens/s / one-at-a-time tokens/s, the lower of the
two targets>.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "service"))

import extract_vs_hf  # noqa: E402
import hybrid_vs_hf  # noqa: E402
from extractor_harness import ExtractorServer  # noqa: E402

from specwire_client import ExtractorClient  # noqa: E402


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    g = random.Random(seed)
    return [[g.randrange(vocab) for _ in range(g.randint(16, 48))] for _ in range(n)]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def extract_latency(address: str, c, vocab: int, args) -> dict:
    """A short Extract's latency (p50 / p99) while --long_generates long generations run."""
    stop = threading.Event()

    def long_gen(i):
        with ExtractorClient(address, timeout=3600) as lc:
            while not stop.is_set():
                lc.generate([[5 + i, 6, 7]], args.long_tokens, ignore_model_eos=True)
    threads = [threading.Thread(target=long_gen, args=(i,), daemon=True)
               for i in range(args.long_generates)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    lat = []
    for k in range(args.extracts):
        t0 = time.perf_counter()
        c.extract([[(k * 31 + j) % vocab for j in range(16)]], [0], dtype="fp32")
        lat.append(time.perf_counter() - t0)
    stop.set()
    for t in threads:
        t.join()
    lat.sort()
    return {"extract_p50_ms": 1000 * statistics.median(lat),
            "extract_p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def before_latency(model: Path, vocab: int, args, log_dir: Path) -> dict:
    """The same latency against an extractor built from another tree (--before-build: e.g. a
    build of the commit before continuous batching, which ran one Generate at a time)."""
    env = os.environ.get("SPECWIRE_BUILD_DIR")
    os.environ["SPECWIRE_BUILD_DIR"] = str(args.before_build)
    try:
        server = ExtractorServer(model, log_dir, dtype=args.dtype,
                                 args=(f"--threads={args.threads}",))
        server.start(timeout=300)
    finally:
        if env is None:
            del os.environ["SPECWIRE_BUILD_DIR"]
        else:
            os.environ["SPECWIRE_BUILD_DIR"] = env
    try:
        with ExtractorClient(server.address, timeout=3600) as c:
            c.generate([[1, 2, 3]], 4, ignore_model_eos=True)  # warm-up
            out = extract_latency(server.address, c, vocab, args)
        out["peak_rss_mib"] = peak_rss_mib(server.pid)
    finally:
        server.stop()
    return out


def run_target(name: str, model: Path, vocab: int, args, log_dir: Path) -> dict:
    server = ExtractorServer(model, log_dir, dtype=args.dtype,
                             args=(f"--threads={args.threads}",
                                   f"--max_running_sequences={max(args.prompts, 8)}"))
    server.start(timeout=300)
    out = {"target": name}
    try:
        with ExtractorClient(server.address, timeout=3600) as c:
            c.generate([[1, 2, 3]], 4, ignore_model_eos=True)  # warm-up
            ps = prompts(args.prompts, vocab, seed=1)
            t0 = time.perf_counter()
            for p in ps[:args.sequential]:
                c.generate([p], args.max_new_tokens, ignore_model_eos=True)
            seq_s = time.perf_counter() - t0
            out["sequential_tok_s"] = args.sequential * args.max_new_tokens / seq_s

            def one(p):
                return c.generate([p], args.max_new_tokens, ignore_model_eos=True)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.prompts) as pool:
                results = list(pool.map(one, ps))
            batched_s = time.perf_counter() - t0
            tokens = sum(len(r[0].completion_ids) for r in results)
            out["batched_tok_s"] = tokens / batched_s
            out["batched_s"] = batched_s

            out.update(extract_latency(server.address, c, vocab, args))
        out["peak_rss_mib"] = peak_rss_mib(server.pid)
    finally:
        server.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", type=Path, default=REPO / "build" / "bench-models")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--sequential", type=int, default=4,
                    help="prompts timed one at a time (the rate is per token)")
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--long_generates", type=int, default=4)
    ap.add_argument("--long_tokens", type=int, default=512)
    ap.add_argument("--extracts", type=int, default=40)
    ap.add_argument("--targets", default="qwen3,hybrid")
    ap.add_argument("--before-build", type=Path,
                    help="also measure the Extract latency against this build's extractor")
    args = ap.parse_args()
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    log_dir = args.cache_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    builders = {"qwen3": (extract_vs_hf.build_model, extract_vs_hf.QWEN3_100M["vocab_size"]),
                "hybrid": (hybrid_vs_hf.build_model, hybrid_vs_hf.QWEN3_5_100M["vocab_size"])}
    rows = []
    for name in args.targets.split(","):
        build, vocab = builders[name]
        rows.append(run_target(name, build(args.cache_dir), vocab, args, log_dir))
        if args.before_build:
            rows[-1]["before"] = before_latency(build(args.cache_dir), vocab, args, log_dir)
    print(f"{args.prompts} prompts x {args.max_new_tokens} new tokens, {args.dtype}, "
          f"{args.threads} threads; one-at-a-time rate from {args.sequential} prompts; Extract "
          f"latency: 16 tokens while {args.long_generates} Generates of {args.long_tokens} run")
    print(f"{'target':<8} {'one at a time tok/s':>20} {'batched tok/s':>14} {'ratio':>7} "
          f"{'batched s':>10} {'extract p50 ms':>15} {'p99 ms':>8} {'peak RSS MiB':>13}")
    ratios = []
    for r in rows:
        ratio = r["batched_tok_s"] / r["sequential_tok_s"]
        ratios.append(ratio)
        print(f"{r['target']:<8} {r['sequential_tok_s']:>20.1f} {r['batched_tok_s']:>14.1f} "
              f"{ratio:>7.2f} {r['batched_s']:>10.1f} {r['extract_p50_ms']:>15.1f} "
              f"{r['extract_p99_ms']:>8.1f} {r['peak_rss_mib']:>13.0f}")
    for r in rows:
        if "before" in r:
            b = r["before"]
            print(f"{r['target']:<8} before ({args.before_build}): extract p50 "
                  f"{b['extract_p50_ms']:.1f} ms, p99 {b['extract_p99_ms']:.1f} ms, peak RSS "
                  f"{b['peak_rss_mib']:.0f} MiB")
    print(f"generate_batching_ratio={min(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
