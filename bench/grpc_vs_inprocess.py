#!/usr/bin/env python3
"""Extraction throughput through gRPC vs in-process: what the service costs on top of the engine.

A mid-size Qwen3 (random weights, hidden 512, 8 layers, vocab 8192) is built once and cached. For
each dtype a real specwire-extractor process serves it on loopback, and two measurements alternate
in rounds so both see the same machine state:
  in-process  specwire-bench-extract --batch C: one padded batch of C sequences, states copied to
              the host in the compute dtype (no wire)
  grpc        specwire-bench-grpc-extract --concurrency C: C client threads on one channel each
              send one Extract call of one sequence at the same time; the server's dynamic batching
              merges what is queued; states travel in the same dtype, are crc-checked and
              reassembled by the C++ client (clients/cpp/extractor_client.h)
Both capture the same states (embedding, every layer, final norm), run the same engine with the
same intra-op thread count, and count the same tokens (C x 512 per repetition).

Both processes also get the same OpenMP wait policy (--omp-wait-policy, PASSIVE by default).
libgomp spins for a long time at barriers unless it counts more OpenMP threads in the process than
cores; the server (a team for the loading thread and one for its worker) falls under that
throttle, the single-team in-process binary does not. On a shared machine the long spin burns the
time slices the other team thread needs, and the in-process run came out 2-5x slower for that
reason alone (measured: 2 cores under load, 512 tokens fp32: 1.5-5 s spinning, 0.35-0.6 s
passive, the server 0.35-0.7 s either way).

Last line: grpc_vs_inprocess_ratio=<median over dtypes of grpc tokens/s / in-process tokens/s>.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch
from bench_models import random_checkpoint

REPO = Path(__file__).resolve().parents[1]

QWEN3_H512_L8 = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                     max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1_000_000.0)
WIRE_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}


def build_model(cache_dir: Path) -> Path:
    return random_checkpoint(cache_dir, "qwen3-h512-l8", "qwen3", QWEN3_H512_L8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Extractor:
    """A specwire-extractor process on loopback; stopped (SIGTERM to its own pid) on exit."""

    def __init__(self, exe: Path, model: Path, dtype: str, threads: int, env: dict[str, str]) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.proc = subprocess.Popen(
            [str(exe), "--model", str(model), "--dtype", dtype, "--threads", str(threads),
             "--listen", f"127.0.0.1:{self.port}", "--metrics_listen", f"127.0.0.1:{self.metrics_port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.target = f"127.0.0.1:{self.port}"

    def __enter__(self) -> "Extractor":
        deadline = time.monotonic() + 120
        log = []
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline()
                log.append(line)
                if "serving" in line:
                    return self
                if not line and self.proc.poll() is not None:
                    break
        self.__exit__()
        raise RuntimeError("specwire-extractor did not start:\n" + "".join(log))

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def batch_requests(self) -> tuple[float, float]:
        """(sum, count) of the server's batch-size histogram: requests per forward pass."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        values = {}
        for name in ("sum", "count"):
            m = re.search(rf"^specwire_extractor_batch_requests_{name}(?:\{{\}})? (\S+)$", text, re.M)
            values[name] = float(m.group(1)) if m else 0.0
        return values["sum"], values["count"]


def run_json(cmd: list[str], env: dict[str, str]) -> dict:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))
    ap.add_argument("--cache-dir", default=REPO / "build" / "bench-models")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=4, help="concurrent requests = in-process batch")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per dtype")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per round and side")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="engine intra-op threads")
    ap.add_argument("--omp-wait-policy", default="PASSIVE",
                    help="OMP_WAIT_POLICY for both processes; '' leaves the environment as it is")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy

    build = Path(args.build_dir)
    server_exe = build / "services" / "extractor" / "specwire-extractor"
    inproc_exe = build / "bench" / "specwire-bench-extract"
    load_exe = build / "bench" / "specwire-bench-grpc-extract"
    for exe in (server_exe, inproc_exe, load_exe):
        if not exe.exists():
            print(f"missing {exe}: build it first (cmake --build {build})", file=sys.stderr)
            return 2
    path = build_model(Path(args.cache_dir))
    C, T = args.concurrency, args.seq_len
    print(f"model: qwen3 hidden {QWEN3_H512_L8['hidden_size']}, {QWEN3_H512_L8['num_hidden_layers']} layers, "
          f"vocab {QWEN3_H512_L8['vocab_size']}; {C} x {T} tokens per repetition, threads={args.threads}, "
          f"{args.rounds} rounds x {args.reps} reps per side, "
          f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', '(unset)')}")

    rows = []
    started = time.monotonic()
    for dtype in args.dtypes.split(","):
        inproc, grpc, mib = [], [], []
        with Extractor(server_exe, path, dtype, args.threads, env) as server:
            batches0 = server.batch_requests()
            for rnd in range(args.rounds):
                r = run_json([str(inproc_exe), "--model", str(path), "--dtype", dtype, "--seq_lens", str(T),
                              "--batch", str(C), "--reps", str(args.reps), "--warmup", "1",
                              "--threads", str(args.threads)], env)
                inproc += r["times_s"]
                g = run_json([str(load_exe), "--extractor", server.target, "--wire_dtype", WIRE_DTYPE[dtype],
                              "--seq_len", str(T), "--concurrency", str(C), "--reps", str(args.reps),
                              "--warmup", "1" if rnd == 0 else "0"], env)
                grpc += g["times_s"]
                mib += [g["bytes_per_rep"] / 2**20 / t for t in g["times_s"]]
            batches1 = server.batch_requests()
        # Warm-up calls are in the histogram too; they batch like the timed ones.
        n = batches1[1] - batches0[1]
        mean_batch = (batches1[0] - batches0[0]) / n if n else float("nan")
        rows.append((dtype, C * T / statistics.median(inproc), C * T / statistics.median(grpc),
                     mean_batch, statistics.median(mib)))

    print(f"\n{'dtype':<9} {'in-process tok/s':>17} {'grpc tok/s':>11} {'ratio':>6} "
          f"{'server batch':>13} {'grpc MiB/s':>11}")
    for dtype, t_in, t_grpc, batch, mib in rows:
        print(f"{dtype:<9} {t_in:>17.0f} {t_grpc:>11.0f} {t_grpc / t_in:>6.2f} {batch:>13.2f} {mib:>11.1f}")
    print(f"(wall {time.monotonic() - started:.0f} s; 'server batch' = mean requests per forward pass)")
    print(f"grpc_vs_inprocess_ratio={statistics.median(t_grpc / t_in for _, t_in, t_grpc, _, _ in rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
