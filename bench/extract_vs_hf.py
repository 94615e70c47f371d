#!/usr/bin/env python3
"""Extraction throughput: specwire's C++ forward vs transformers, same CPU, same torch, same threads.

A ~100M-parameter Qwen3 (random weights; speed does not depend on their values) is built once and
cached. For each dtype and sequence length, specwire (specwire-bench-extract, in-process timings)
and transformers (AutoModelForCausalLM with output_hidden_states=True) run in alternating rounds so
both see the same machine state; medians are compared. Two transformers baselines are timed:
  hf        model(ids, output_hidden_states=True)                    what extraction code usually calls
  hf-keep1  the same with logits_to_keep=1 (no full-vocabulary logits)  the strongest plain-HF variant
The headline compares against hf-keep1, the stricter of the two.

Last line: extract_vs_hf_ratio=<median over configs of hf-keep1 time / specwire time>.
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

# libgomp threads spin at barriers by default; on a shared 2-core machine a spinning team starves
# the other thread and timings swing by several x. Both sides run with the same passive policy
# (set before torch loads libgomp; the specwire subprocess inherits it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

QWEN3_100M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                  max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1_000_000.0)


def build_model(cache_dir: Path) -> Path:
    path = cache_dir / "qwen3-100m"
    if (path / "config.json").exists():
        return path
    config = transformers.AutoConfig.for_model("qwen3", **QWEN3_100M)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    return path


def time_hf(model, ids: torch.Tensor, reps: int, keep1: bool) -> list[float]:
    times = []
    kwargs = dict(output_hidden_states=True, use_cache=False)
    if keep1:
        kwargs["logits_to_keep"] = 1
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            out = model(input_ids=ids, **kwargs)
            _ = [h.contiguous() for h in out.hidden_states]
            times.append(time.perf_counter() - t0)
    return times


def time_ours(exe: Path, path: Path, dtype: str, seq_len: int, reps: int, threads: int) -> list[float]:
    res = subprocess.run([str(exe), "--model", str(path), "--dtype", dtype, "--seq-lens", str(seq_len),
                          "--reps", str(reps), "--warmup", "1", "--threads", str(threads)],
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])["times_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))
    ap.add_argument("--cache-dir", default=REPO / "build" / "bench-models")
    ap.add_argument("--seq-lens", default="512,2048")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per config")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions per round")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    exe = Path(args.build_dir) / "bench" / "specwire-bench-extract"
    path = build_model(Path(args.cache_dir))
    n_params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(path).parameters())
    print(f"model: qwen3 {n_params / 1e6:.0f}M params, threads={args.threads}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")

    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        model.eval()
        for seq_len in (int(s) for s in args.seq_lens.split(",")):
            ids = torch.tensor([[(t * 7919 + 13) % QWEN3_100M["vocab_size"] for t in range(seq_len)]])
            time_hf(model, ids, 1, keep1=True)  # warm-up
            ours, hf, hf1 = [], [], []
            for _ in range(args.rounds):
                ours += time_ours(exe, path, dtype_name, seq_len, args.reps, args.threads)
                hf += time_hf(model, ids, args.reps, keep1=False)
                hf1 += time_hf(model, ids, args.reps, keep1=True)
            rows.append((dtype_name, seq_len, statistics.median(ours), statistics.median(hf),
                         statistics.median(hf1)))
        del model

    print(f"\n{'dtype':<9} {'tokens':>6} {'specwire tok/s':>15} {'hf tok/s':>10} {'hf-keep1 tok/s':>15} "
          f"{'vs hf':>7} {'vs keep1':>9}")
    ratios = []
    for dtype_name, seq_len, t_ours, t_hf, t_hf1 in rows:
        ratios.append(t_hf1 / t_ours)
        print(f"{dtype_name:<9} {seq_len:>6} {seq_len / t_ours:>15.0f} {seq_len / t_hf:>10.0f} "
              f"{seq_len / t_hf1:>15.0f} {t_hf / t_ours:>7.2f} {t_hf1 / t_ours:>9.2f}")
    print(f"extract_vs_hf_ratio={statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
