#!/usr/bin/env python3
"""Prefill speed of the extractor on a GPU, on random weights of real shapes. Needs torch only.

Driven by scripts/gpu_prefill.sh on a CUDA host. For each target shape the weights are drawn on
the device from a config.json (specwire-bench-extract --random_weights: nothing large travels):
  qwen3-8b         Qwen3-8B's shapes: 36 layers, hidden 4096, 32 heads / 8 kv heads of 128,
                   intermediate 12288, vocab 151936
  qwen3.6-27b-N    Qwen3.6-27B's hybrid shapes (hidden 5120, 3 Gated DeltaNet : 1 gated full
                   attention layer, intermediate 17408, vocab 248320), N layers of its 64
bf16, prompts of --seq-lens tokens in batches of --tokens-per-batch tokens, the drafter-style
capture of 5 layers (and every tap once, for the copy), each at every --packed-rows value.

Per run: prefill tokens/s; the model's FLOP/s (projection GEMMs + causal attention; the Gated
DeltaNet recurrence is not counted); the same GEMMs alone at the forward's shapes and row counts,
timed in the same run (their FLOP/s); gpu_prefill_vs_gemm_ratio = the model's FLOP/s over the
GEMMs'; MFU against a dense 8192^3 bf16 product timed here; the share of attention; the
device-to-host copy of the requested states alone and how much of it the extraction hides behind
the next forward; the host waits (syncs) in one extraction. The anchor: one SpecForge capture
server supplies ~27,000 prompt tokens/s of Qwen3-8B features per H200 (prefill MFU ~43 %).

Prints a table and, last, gpu_prefill_vs_gemm_ratio=<Qwen3-8B, 2048-token prompts, best rows>.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from gpu_decode import QWEN3_8B  # Qwen3-8B's config.json, the decode driver's too

ANCHOR_TOK_S = 27_000  # SpecForge capture server, Qwen3-8B features, one H200


def qwen36_27b(layers: int) -> dict:
    return dict(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text",
                vocab_size=248320, hidden_size=5120, intermediate_size=17408,
                num_hidden_layers=layers, num_attention_heads=24, num_key_value_heads=4,
                head_dim=256, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
                tie_word_embeddings=False, max_position_embeddings=262144,
                layer_types=[("full_attention" if (i + 1) % 4 == 0 else "linear_attention")
                             for i in range(layers)],
                linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_num_key_heads=16, linear_num_value_heads=48, attn_output_gate=True,
                rope_parameters=dict(rope_type="default", rope_theta=10_000_000.0,
                                     partial_rotary_factor=0.25),
                torch_dtype="bfloat16")


def layer_gemms(c: dict, linear: bool) -> list[tuple[int, int]]:
    """[out, in] of one layer's products as the forward runs them (bench/layer_gemms.h)."""
    H = c["hidden_size"]
    g = []
    if linear:
        key = c["linear_num_key_heads"] * c["linear_key_head_dim"]
        value = c["linear_num_value_heads"] * c["linear_value_head_dim"]
        g += [(2 * key + 2 * value, H), (2 * c["linear_num_value_heads"], H), (H, value)]
    else:
        D = c["head_dim"]
        q = c["num_attention_heads"] * D * (2 if c.get("attn_output_gate") else 1)
        g += [(q + 2 * c["num_key_value_heads"] * D, H), (H, c["num_attention_heads"] * D)]
    g += [(2 * c["intermediate_size"], H), (H, c["intermediate_size"])]
    return g


def is_linear(c: dict, i: int) -> bool:
    return c.get("layer_types", ["full_attention"] * c["num_hidden_layers"])[i] == "linear_attention"


def gemm_flops_per_row(c: dict) -> float:
    return sum(2.0 * o * i for l in range(c["num_hidden_layers"]) for o, i in layer_gemms(c, is_linear(c, l)))


def attention_flops(c: dict, T: int, sequences: int) -> float:
    """Causal softmax attention (QK^T and PV over the lower triangle) of every full layer."""
    full = sum(1 for l in range(c["num_hidden_layers"]) if not is_linear(c, l))
    return full * sequences * 2.0 * T * T * c["num_attention_heads"] * c["head_dim"]


def dense_peak(device: str) -> float:
    """bf16 8192^3 products, TFLOP/s (the mean of 10 after 3 warm-ups)."""
    if not device.startswith("cuda"):
        return float("nan")
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * 10 / (time.perf_counter() - t) / 1e12


def run_bench(bench: str, model_dir: Path, device: str, seq_lens: list[int], batches: list[int],
              rows: str, layers: str, reps: int, log) -> list[dict]:
    cmd = [bench, "--model", str(model_dir), "--random_weights", "--device_map", device,
           "--dtype", "bfloat16", "--seq_lens", ",".join(map(str, seq_lens)),
           "--batches", ",".join(map(str, batches)), "--packed_rows", rows, "--layers", layers,
           "--reps", str(reps), "--warmup", "1", "--gemm", "--copy_breakdown", "--count_syncs"]
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log.write(f"$ {' '.join(cmd)}\n# rc={res.returncode} {time.perf_counter() - t:.1f}s\n"
              f"{res.stdout}\n{res.stderr[-4000:]}\n")
    log.flush()
    if res.returncode != 0:
        raise RuntimeError(f"specwire-bench-extract failed: {res.stderr.strip().splitlines()[-1:]}")
    return [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")]


def summarize(name: str, c: dict, j: dict, peak: float, layers: str) -> dict:
    T, B = j["seq_len"], j["batch"]
    tokens = T * B
    med = statistics.median
    t = med(j["times_s"])
    per_row = gemm_flops_per_row(c)
    model_flops = tokens * per_row + attention_flops(c, T, B)
    gemm_t = med(j["gemm_times_s"])
    gemm_rate = j["gemm_calls"] * j["gemm_rows"] * per_row / gemm_t
    fwd, copy = med(j.get("forward_times_s") or [float("nan")]), med(j.get("copy_times_s") or [float("nan")])
    hidden = (fwd + copy - t) / copy if copy > 0 else float("nan")
    return {"model": name, "T": T, "batch": B, "rows": j["packed_rows"], "taps": layers,
            "tok_s": tokens / t, "model_tflops": model_flops / t / 1e12,
            "gemm_tflops": gemm_rate / 1e12, "ratio": model_flops / t / gemm_rate,
            "mfu": model_flops / t / 1e12 / peak if peak == peak else float("nan"),
            "attention_share": med(j["attention_times_s"]) / t,
            "forward_ms": fwd * 1e3, "copy_ms": copy * 1e3, "extract_ms": t * 1e3,
            "copy_hidden": max(0.0, min(1.0, hidden)), "state_mb": j.get("state_bytes", 0) / 2**20,
            "syncs": (j.get("syncs", {}).get("syncs") if j.get("syncs", {}).get("calibrated") else "n/a"),
            "sync_places": j.get("syncs", {}).get("places"),
            "host_copies": j.get("host_copies")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="the specwire-bench-extract binary")
    ap.add_argument("--work", required=True, help="folder for the configs")
    ap.add_argument("--out", required=True, help="folder for prefill.json and the command log")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seq-lens", default="512,2048")
    ap.add_argument("--tokens-per-batch", type=int, default=16384)
    ap.add_argument("--packed-rows", default="2048,8192")
    ap.add_argument("--hybrid-layers", type=int, default=16)
    ap.add_argument("--small", action="store_true", help="tiny shapes (to test the driver on a CPU)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    batches = [max(1, args.tokens_per_batch // T) for T in seq_lens]
    dense, hybrid = dict(QWEN3_8B), qwen36_27b(args.hybrid_layers)
    if args.small:  # the same structure at a size a CPU runs in seconds
        dense.update(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64)
        hybrid = qwen36_27b(4)
        hybrid.update(vocab_size=4096, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                      linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)
    peak = dense_peak(args.device)
    print(f"device: {torch.cuda.get_device_name(0) if args.device.startswith('cuda') else args.device}, "
          f"torch {torch.__version__}; dense bf16 8192^3 product: {peak:.0f} TFLOP/s", flush=True)
    L = dense["num_hidden_layers"]
    five = ",".join(str(x) for x in sorted({1, L // 4, L // 2, 3 * L // 4, L - 3}))
    plans = [("qwen3-8b" if not args.small else "qwen3-small", dense, five, args.packed_rows),
             ("qwen3-8b" if not args.small else "qwen3-small", dense, "all", "0")]
    Lh = hybrid["num_hidden_layers"]
    plans.append((f"qwen3.6-27b-{Lh}" if not args.small else "hybrid-small", hybrid,
                  ",".join(str(x) for x in sorted({1, Lh // 2, Lh - 2})), "0"))
    rows, failures = [], []
    with open(out / "prefill-commands.log", "w") as log:
        for name, cfg, taps, packed in plans:
            d = work / name.replace(".", "_")
            d.mkdir(exist_ok=True)
            (d / "config.json").write_text(json.dumps(cfg))
            try:
                t = time.perf_counter()
                lines = run_bench(args.bench, d, args.device, seq_lens if taps != "all" else seq_lens[-1:],
                                  batches if taps != "all" else batches[-1:], packed, taps, args.reps, log)
                print(f"  {name} taps {taps}: {len(lines)} runs in {time.perf_counter() - t:.0f}s", flush=True)
            except Exception as e:  # noqa: BLE001 (one failed shape must not hide the others)
                failures.append(f"{name} taps {taps}: {e}")
                print(f"  FAILED {name} taps {taps}: {e}", flush=True)
                continue
            rows += [summarize(name, cfg, j, peak, "5 layers" if taps != "all" else "all taps") for j in lines]
    (out / "prefill.json").write_text(json.dumps({"peak_tflops": peak, "rows": rows,
                                                  "failures": failures}, indent=1))
    head = (f"{'model':<16} {'T':>5} {'batch':>5} {'rows':>5} {'taps':<9} {'tok/s':>8} {'TFLOP/s':>8} "
            f"{'GEMM':>6} {'ratio':>6} {'MFU':>5} {'attn':>5} {'fwd ms':>7} {'copy ms':>7} "
            f"{'hidden':>6} {'syncs':>5}")
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        print(f"{r['model']:<16} {r['T']:>5} {r['batch']:>5} {r['rows']:>5} {r['taps']:<9} "
              f"{r['tok_s']:>8,.0f} {r['model_tflops']:>8.0f} {r['gemm_tflops']:>6.0f} "
              f"{r['ratio']:>6.2f} {r['mfu']:>5.2f} {r['attention_share']:>5.2f} {r['forward_ms']:>7.1f} "
              f"{r['copy_ms']:>7.1f} {r['copy_hidden']:>6.2f} {str(r['syncs']):>5}")
    for r in rows:
        if r["sync_places"]:
            print(f"  syncs in {r['model']} T={r['T']}: {'; '.join(r['sync_places'])}")
            break
    for f in failures:
        print(f"FAILED: {f}")
    dense_rows = [r for r in rows if r["model"] in ("qwen3-8b", "qwen3-small") and r["taps"] == "5 layers"]
    if dense_rows:
        best = max(dense_rows, key=lambda r: (r["T"], r["tok_s"]))
        print(f"\nQwen3-8B shapes at {best['T']} tokens: {best['tok_s']:,.0f} prompt tokens/s, MFU "
              f"{best['mfu']:.2f}; the SpecForge anchor {ANCHOR_TOK_S:,} tok/s (MFU ~0.43): "
              f"x{best['tok_s'] / ANCHOR_TOK_S:.2f}")
        print(f"gpu_prefill_vs_gemm_ratio={best['ratio']:.2f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
