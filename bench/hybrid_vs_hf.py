#!/usr/bin/env python3
"""Hybrid extraction throughput and peak memory: specwire vs transformers' torch fallback.

A ~100M-parameter Qwen3.5 text model (Gated DeltaNet layers with full attention every 4th layer;
random weights, speed does not depend on their values) is built once with transformers and cached.
flash-linear-attention and causal-conv1d are expected to be absent, so transformers runs its torch
fallbacks (torch_chunk_gated_delta_rule, torch causal conv1d): the path specwire reproduces bit for
bit; the script prints which path transformers takes.

For each dtype and sequence length, specwire (specwire-bench-extract, in-process timings) and
transformers (AutoModelForCausalLM with output_hidden_states=True) run in alternating rounds so
both see the same machine state; medians are compared. Two transformers baselines are timed:
  hf        model(ids, output_hidden_states=True)                    what extraction code usually calls
  hf-keep1  the same with logits_to_keep=1 (no full-vocabulary logits)  the strongest plain-HF variant
The headline compares against hf-keep1, the stricter of the two.

Peak memory is the peak RSS of a process doing one configuration only (os.wait4's rusage of that
process, started from a small launcher; in MiB, including each runtime's own footprint: libtorch
for specwire, Python + torch + transformers for hf):
  specwire  the specwire-bench-extract processes of the timing rounds (the largest of them)
  hf        a fresh Python child that loads the model and runs one forward (hf and hf-keep1 each)

Allocator: specwire-bench-extract tunes glibc malloc as the extractor does (freed memory kept for
reuse, common/models/torch_util.h KeepFreedMemoryForReuse); transformers runs with Python's
defaults. --malloc-top-pad-mib gives every process a larger heap top pad to narrow that gap.

specwire runs each kernel set of --kernels (default both: reference, the hybrid's default and
bit-identical to transformers; fast, oneDNN products, specwire's attention and the fused delta
rule). Lines at the end: hybrid_fast_extract_vs_gemm_ratio= and hybrid_fast_vs_hf_ratio= for the
fast set, then hybrid_extract_vs_gemm_ratio= and, last, hybrid_vs_hf_ratio=<median over configs of
hf-keep1 time / specwire time> for the default set.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from bench_models import random_checkpoint

REPO = Path(__file__).resolve().parents[1]

# ~104M parameters: 24.6M tied embedding, 12 × 3.5M SwiGLU MLPs, 9 GDN mixers of 3.2M, 3 gated
# attention mixers of 2.8M.
QWEN3_5_100M = dict(vocab_size=32000, hidden_size=768, intermediate_size=1536, num_hidden_layers=12,
                    full_attention_interval=4, num_attention_heads=8, num_key_value_heads=2,
                    head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16,
                    linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                    max_position_embeddings=4096, tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="default", rope_theta=10_000_000.0,
                                         partial_rotary_factor=0.25, mrope_section=[6, 5, 5],
                                         mrope_interleaved=True))
MODEL_NAME = "qwen3_5-hybrid-100m"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KERNEL_PACKAGES = ("fla", "causal_conv1d")


def build_model(cache_dir: Path) -> Path:
    return random_checkpoint(cache_dir, MODEL_NAME, "qwen3_5_text", QWEN3_5_100M)


def token_ids(seq_len: int) -> torch.Tensor:
    # The same ids as specwire-bench-extract (batch row 0).
    return torch.tensor([[(t * 7919 + 13) % QWEN3_5_100M["vocab_size"] for t in range(seq_len)]])


def load_hf(path: Path, dtype_name: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype_name],
                                                              attn_implementation="sdpa")
    return model.eval()


def hf_forward(model, ids: torch.Tensor, keep1: bool) -> None:
    kwargs = dict(output_hidden_states=True, use_cache=False)
    if keep1:
        kwargs["logits_to_keep"] = 1
    out = model(input_ids=ids, **kwargs)
    _ = [h.contiguous() for h in out.hidden_states]


def time_hf(model, ids: torch.Tensor, reps: int, keep1: bool) -> list[float]:
    times = []
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            hf_forward(model, ids, keep1)
            times.append(time.perf_counter() - t0)
    return times


# Runs argv[1:] and then prints its peak RSS (KiB) as the last stdout line. The measured process is
# forked from this small launcher, not from the benchmark: a child's ru_maxrss also counts the
# image it was forked from until exec (the benchmark holds a loaded model), and RUSAGE_CHILDREN
# would be the maximum over every child the benchmark ever waited for.
_LAUNCHER = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
proc.returncode = os.waitstatus_to_exitcode(status)
sys.stdout.flush()
print(f"maxrss_kib={usage.ru_maxrss}", flush=True)
sys.exit(proc.returncode)
"""


def run_child(cmd: list[str]) -> tuple[str, float]:
    """Runs cmd in a fresh process; returns its stdout and its peak RSS in MiB."""
    res = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {res.returncode}")
    *lines, last = res.stdout.strip().splitlines()
    assert last.startswith("maxrss_kib="), last
    return "\n".join(lines), int(last.split("=")[1]) / 1024  # ru_maxrss is in KiB on Linux


def time_ours(exe: Path, path: Path, dtype: str, seq_len: int, reps: int, threads: int,
              kernels: str) -> tuple[list[float], float]:
    stdout, peak = run_child([str(exe), "--model", str(path), "--dtype", dtype, "--seq_lens",
                              str(seq_len), "--reps", str(reps), "--warmup", "1", "--threads",
                              str(threads), "--kernels", kernels])
    return json.loads(stdout.strip().splitlines()[-1])["times_s"], peak


def gemm_ratio(exe: Path, path: Path, dtype: str, seq_len: int, reps: int, threads: int,
               kernels: str) -> float:
    """The forward's projection GEMMs alone over the forward (specwire-bench-extract --gemm, a run
    of its own so that the GEMM weights do not count in the peak memory figures)."""
    stdout, _ = run_child([str(exe), "--model", str(path), "--dtype", dtype, "--seq_lens",
                           str(seq_len), "--reps", str(reps), "--warmup", "1", "--threads",
                           str(threads), "--gemm", "--kernels", kernels])
    line = json.loads(stdout.strip().splitlines()[-1])
    return statistics.median(line["gemm_times_s"]) / statistics.median(line["times_s"])


def hf_peak_mib(path: Path, dtype: str, seq_len: int, keep1: bool, threads: int) -> float:
    _, peak = run_child([sys.executable, str(Path(__file__).resolve()), "--hf-child", "--model",
                         str(path), "--dtypes", dtype, "--seq-lens", str(seq_len), "--threads",
                         str(threads)] + (["--keep1"] if keep1 else []))
    return peak


def hf_child(args) -> int:
    """One configuration, one forward, in a fresh process: its peak RSS is the caller's figure."""
    transformers.logging.set_verbosity_error()  # the parent has said which kernels run
    with torch.inference_mode():
        hf_forward(load_hf(Path(args.model), args.dtypes), token_ids(int(args.seq_lens)), args.keep1)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))
    ap.add_argument("--cache-dir", default=REPO / "build" / "bench-models")
    ap.add_argument("--seq-lens", default="512,2048")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per config")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions per round")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--no-memory", action="store_true", help="skip the hf peak-memory children")
    ap.add_argument("--kernels", default="reference,fast",
                    help="specwire's kernel sets to time, comma-separated (reference: the "
                         "hybrid's default, bit-identical to transformers; fast)")
    ap.add_argument("--malloc-top-pad-mib", type=int, default=0,
                    help="run every process (hf here, specwire, the memory children) with glibc's "
                         "MALLOC_TOP_PAD_ = N MiB, so freed heap tops are kept instead of being "
                         "returned to the kernel and faulted in again; 0: glibc's default")
    ap.add_argument("--hf-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--keep1", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()

    pad = str(args.malloc_top_pad_mib << 20)
    if args.malloc_top_pad_mib and os.environ.get("MALLOC_TOP_PAD_") != pad:
        os.environ["MALLOC_TOP_PAD_"] = pad  # read by glibc at start-up: start again with it
        os.execv(sys.executable, [sys.executable, *sys.argv])
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    if args.hf_child:
        return hf_child(args)

    exe = Path(args.build_dir) / "bench" / "specwire-bench-extract"
    path = build_model(Path(args.cache_dir))
    config = transformers.AutoConfig.from_pretrained(path)
    n_params = sum(p.numel() for p in load_hf(path, "float32").parameters())
    installed = [name for name in KERNEL_PACKAGES if importlib.util.find_spec(name) is not None]
    print(f"model: qwen3_5 hybrid {n_params / 1e6:.0f}M params ({config.num_hidden_layers} layers: "
          f"{config.layer_types.count('linear_attention')} gated-deltanet, "
          f"{config.layer_types.count('full_attention')} full attention), threads={args.threads}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
    print("glibc malloc: " + (f"MALLOC_TOP_PAD_={args.malloc_top_pad_mib} MiB in every process"
                              if args.malloc_top_pad_mib else "default settings"))
    if installed:
        print(f"transformers reference: kernel packages {installed} installed, so transformers runs "
              "their kernels, not its torch fallback (specwire reproduces the fallback)")
    else:
        print("transformers reference: torch fallback (fla and causal_conv1d absent: "
              "torch_chunk_gated_delta_rule, torch causal conv1d)")

    rows = []
    for dtype_name in args.dtypes.split(","):
        model = load_hf(path, dtype_name)
        for seq_len in (int(s) for s in args.seq_lens.split(",")):
            ids = token_ids(seq_len)
            time_hf(model, ids, 1, keep1=True)  # warm-up
            sets = args.kernels.split(",")
            ours = {k: [] for k in sets}
            ours_peak = {k: [] for k in sets}
            hf, hf1 = [], []
            for _ in range(args.rounds):
                for k in sets:
                    times, peak = time_ours(exe, path, dtype_name, seq_len, args.reps,
                                            args.threads, k)
                    ours[k] += times
                    ours_peak[k].append(peak)
                hf += time_hf(model, ids, args.reps, keep1=False)
                hf1 += time_hf(model, ids, args.reps, keep1=True)
            if args.no_memory:
                hf_peak = hf1_peak = float("nan")
            else:
                hf_peak = hf_peak_mib(path, dtype_name, seq_len, False, args.threads)
                hf1_peak = hf_peak_mib(path, dtype_name, seq_len, True, args.threads)
            for k in sets:
                vs_gemm = gemm_ratio(exe, path, dtype_name, seq_len, args.reps, args.threads, k)
                rows.append((k, dtype_name, seq_len, statistics.median(ours[k]),
                             statistics.median(hf), statistics.median(hf1), max(ours_peak[k]),
                             hf_peak, hf1_peak, vs_gemm))
                print(f"  {dtype_name} {seq_len}: specwire --kernels {k} "
                      f"{[round(t, 3) for t in ours[k]]} s", flush=True)
            print(f"  {dtype_name} {seq_len}: hf {[round(t, 3) for t in hf]} s, "
                  f"hf-keep1 {[round(t, 3) for t in hf1]} s", flush=True)
        del model

    print(f"\n{'kernels':<10} {'dtype':<9} {'tokens':>6} {'specwire tok/s':>15} {'hf tok/s':>10} "
          f"{'hf-keep1 tok/s':>15} {'vs hf':>7} {'vs keep1':>9} {'vs gemm':>8} "
          f"{'specwire MiB':>13} {'hf MiB':>8} {'hf-keep1 MiB':>13}")
    ratios: dict[str, list[float]] = {}
    gemm_ratios: dict[str, list[float]] = {}
    for k, dtype_name, seq_len, t_ours, t_hf, t_hf1, m_ours, m_hf, m_hf1, vs_gemm in rows:
        ratios.setdefault(k, []).append(t_hf1 / t_ours)
        gemm_ratios.setdefault(k, []).append(vs_gemm)
        print(f"{k:<10} {dtype_name:<9} {seq_len:>6} {seq_len / t_ours:>15.0f} "
              f"{seq_len / t_hf:>10.0f} {seq_len / t_hf1:>15.0f} {t_hf / t_ours:>7.2f} "
              f"{t_hf1 / t_ours:>9.2f} {vs_gemm:>8.2f} {m_ours:>13.0f} {m_hf:>8.0f} "
              f"{m_hf1:>13.0f}")
    # The sets other than the hybrid's default first; the default's lines last.
    for k in sorted(ratios, key=lambda k: k in ("reference", "auto")):
        prefix = "hybrid" if k in ("reference", "auto") else f"hybrid_{k}"
        print(f"{prefix}_extract_vs_gemm_ratio={statistics.median(gemm_ratios[k]):.2f}")
        print(f"{prefix}_vs_hf_ratio={statistics.median(ratios[k]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
