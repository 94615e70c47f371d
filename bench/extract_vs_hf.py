#!/usr/bin/env python3
"""Extraction throughput: specwire's C++ forward vs transformers, same CPU, same torch, same threads.

A ~100M-parameter Qwen3 (random weights; speed does not depend on their values) is built once and
cached. For each dtype and sequence length, specwire (specwire-bench-extract, in-process timings)
and transformers (AutoModelForCausalLM with output_hidden_states=True) run in alternating rounds so
both see the same machine state; medians are compared. Two transformers baselines are timed:
  hf        model(ids, output_hidden_states=True)                    what extraction code usually calls
  hf-keep1  the same with logits_to_keep=1 (no full-vocabulary logits)  the strongest plain-HF variant
The headline compares against hf-keep1, the stricter of the two.

Two more figures of the same run:
  vs gemm   the forward's projection GEMMs alone (same shapes, dtype, threads, timed back to back
            with the forward by specwire-bench-extract --gemm) over the forward: 1.0 is the
            machine's GEMM limit. The same run times the attention alone (the kernel the
            forward runs, at its shapes); the table shows GEMM and attention shares of the
            forward and the rest (norms, rope, activations, copies, allocation).
  layouts   a batch of --batch sequences of the same length (no padding to waste: the padded
            layout's best case) in the two batch-invariant layouts, packed (the extractor's
            default: one product per layer over every sequence's rows, attention per sequence)
            and per_sequence (each sequence its own forward), against one padded forward: the
            throughput cost of batch invariance.

Lines at the end: extract_vs_gemm_ratio=, batch_invariance_ratio= (padded time / packed time;
below 1.0 is the cost), and last extract_vs_hf_ratio=<median over configs of hf-keep1
time / specwire time>.
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
from bench_models import random_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

QWEN3_100M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                  max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1_000_000.0)


def build_model(cache_dir: Path) -> Path:
    return random_checkpoint(cache_dir, "qwen3-100m", "qwen3", QWEN3_100M)


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


KERNELS = "auto"  # --kernels for every specwire run (main() sets it from the command line)


def run_ours(exe: Path, path: Path, dtype: str, seq_len: int, reps: int, threads: int,
             batch: int = 1, layout: str = "packed", gemm: bool = False) -> dict:
    cmd = [str(exe), "--model", str(path), "--dtype", dtype, "--seq_lens", str(seq_len),
           "--reps", str(reps), "--warmup", "1", "--threads", str(threads), "--batch", str(batch),
           "--batch_layout", layout, "--kernels", KERNELS]
    if gemm:
        cmd.append("--gemm")
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def time_ours(exe: Path, path: Path, dtype: str, seq_len: int, reps: int, threads: int) -> list[float]:
    return run_ours(exe, path, dtype, seq_len, reps, threads)["times_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))
    ap.add_argument("--cache-dir", default=REPO / "build" / "bench-models")
    ap.add_argument("--seq-lens", default="512,2048")
    ap.add_argument("--kernels", default="auto",
                    help="specwire's kernel set: auto (fast for this dense model), fast, reference")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per config")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions per round")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--batch", type=int, default=4, help="sequences per batch for the layouts")
    ap.add_argument("--layout-seq-len", type=int, default=128,
                    help="sequence length of the layout comparison")
    args = ap.parse_args()

    global KERNELS
    KERNELS = args.kernels
    torch.set_num_threads(args.threads)
    exe = Path(args.build_dir) / "bench" / "specwire-bench-extract"
    path = build_model(Path(args.cache_dir))
    n_params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(path).parameters())
    print(f"model: qwen3 {n_params / 1e6:.0f}M params, threads={args.threads}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"specwire --kernels {args.kernels}")

    rows, layouts = [], []
    for dtype_name in args.dtypes.split(","):
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        model.eval()
        for seq_len in (int(s) for s in args.seq_lens.split(",")):
            ids = torch.tensor([[(t * 7919 + 13) % QWEN3_100M["vocab_size"] for t in range(seq_len)]])
            time_hf(model, ids, 1, keep1=True)  # warm-up
            ours, gemm, attn, hf, hf1 = [], [], [], [], []
            for _ in range(args.rounds):
                run = run_ours(exe, path, dtype_name, seq_len, args.reps, args.threads, gemm=True)
                ours += run["times_s"]
                gemm += run["gemm_times_s"]
                attn += run["attention_times_s"]
                hf += time_hf(model, ids, args.reps, keep1=False)
                hf1 += time_hf(model, ids, args.reps, keep1=True)
            rows.append((dtype_name, seq_len, statistics.median(ours), statistics.median(hf),
                         statistics.median(hf1), statistics.median(gemm),
                         statistics.median(attn)))
        packed, per_seq, padded = [], [], []
        for _ in range(args.rounds):
            for layout, out in (("packed", packed), ("per_sequence", per_seq), ("padded", padded)):
                out += run_ours(exe, path, dtype_name, args.layout_seq_len, args.reps,
                                args.threads, batch=args.batch, layout=layout)["times_s"]
        layouts.append((dtype_name, statistics.median(packed), statistics.median(per_seq),
                        statistics.median(padded)))
        del model

    print(f"\n{'dtype':<9} {'tokens':>6} {'specwire tok/s':>15} {'hf tok/s':>10} {'hf-keep1 tok/s':>15} "
          f"{'vs hf':>7} {'vs keep1':>9} {'vs gemm':>8} {'attention':>10} {'rest':>6}")
    ratios, gemm_ratios = [], []
    for dtype_name, seq_len, t_ours, t_hf, t_hf1, t_gemm, t_attn in rows:
        ratios.append(t_hf1 / t_ours)
        gemm_ratios.append(t_gemm / t_ours)
        rest = max(0.0, t_ours - t_gemm - t_attn) / t_ours
        print(f"{dtype_name:<9} {seq_len:>6} {seq_len / t_ours:>15.0f} {seq_len / t_hf:>10.0f} "
              f"{seq_len / t_hf1:>15.0f} {t_hf / t_ours:>7.2f} {t_hf1 / t_ours:>9.2f} "
              f"{t_gemm / t_ours:>8.2f} {t_attn / t_ours:>10.2f} {rest:>6.2f}")
    print(f"\nbatch of {args.batch} x {args.layout_seq_len} tokens: the invariant layouts vs padded")
    print(f"{'dtype':<9} {'packed tok/s':>13} {'per_sequence tok/s':>19} {'padded tok/s':>13} "
          f"{'padded/packed':>14} {'padded/per_seq':>15}")
    layout_ratios = []
    tokens = args.batch * args.layout_seq_len
    for dtype_name, t_packed, t_seq, t_pad in layouts:
        layout_ratios.append(t_pad / t_packed)
        print(f"{dtype_name:<9} {tokens / t_packed:>13.0f} {tokens / t_seq:>19.0f} "
              f"{tokens / t_pad:>13.0f} {t_pad / t_packed:>14.2f} {t_pad / t_seq:>15.2f}")
    print(f"extract_vs_gemm_ratio={statistics.median(gemm_ratios):.2f}")
    print(f"batch_invariance_ratio={statistics.median(layout_ratios):.2f}")
    print(f"extract_vs_hf_ratio={statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
