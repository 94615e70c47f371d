#!/usr/bin/env python3
"""Decoding, live sessions and the scorer's loop on a GPU. Needs torch only.

Driven by scripts/gpu_decode.sh on a CUDA host, with the binaries scripts/gpu_env.sh found:
  unit       the model tests that decode, pack, verify and roll back (models_tests: batched
             decode = the sequence alone, target-session rollback = a fresh cache sent only the
             committed tokens, packed forwards = each sequence alone) rerun on the device
             (SPECWIRE_TEST_DEVICE=cuda); absent when the binaries were built on the host
  invariance a sequence decoded beside others (staggered joins, shuffled rows) against the same
             sequence alone, bit for bit at every step: the tiny reference targets (dense and
             hybrid) and Qwen3-8B's shapes (random weights), fp32 and bf16; with the
             default row count of a decode step and with a floor of 64 rows
  packed     the extraction's packed layout: a sequence's states packed beside others against
             the sequence alone, bit for bit (tiny targets fp32, Qwen3-8B's shapes fp32 and bf16)
  gemm_rows  whether a row's bits depend on a product's row count, for Qwen3-8B's shapes
  throughput Generate's schedule on Qwen3-8B's shapes (bf16): decode tokens/s at each batch
  graphs     one decode step eager against the same step as a CUDA graph replay
  replay     the committed drafters (DFlash, DFlash2, EAGLE-3) replayed on the committed target
             with target and drafter on the GPU in fp32, against the same replay on the host's
             CPU on the same trajectories: step lengths and tau
  live       the real loop in-process (specwire-replay --live: a target session on the GPU),
             dense and hybrid targets: its steps equal the replay's; its cost beside the replay's

Prints a table and ends with live_vs_replay_cost=... and generate_batching_ratio=... lines.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

QWEN3_8B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936,
                hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
                torch_dtype="bfloat16")
SMALL = dict(QWEN3_8B, vocab_size=4096, hidden_size=256, intermediate_size=512,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64)

REPO = Path(__file__).resolve().parents[1]
# The chi-square test of the session's draws (thousands of sessions of a tiny model: launch-bound
# on a GPU) is left to the CPU.
UNIT_FILTER = ("*TargetSessionRollback*:*BatchedDecode*:*PackedForward*:*KvCache*:*PaddedBatch*:"
               "TargetSession.GreedyChainAndTree*:TargetSession.RefusedCalls*")


class Driver:
    def __init__(self, args):
        self.args = args
        self.rows: list[dict] = []
        self.out = Path(args.out)
        self.work = Path(args.work)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "decode-commands.log", "w")
        self.ratios: dict[str, float] = {}

    def row(self, check: str, result: str, numbers: str) -> None:
        self.rows.append({"check": check, "result": result, "numbers": numbers})
        print(f"  {result:<5} {check:<40} {numbers}", flush=True)

    def run(self, cmd: list, env: dict | None = None, timeout: int = 600):
        import os
        t = time.perf_counter()
        try:
            res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                                 env=dict(os.environ, **(env or {})))
        except subprocess.TimeoutExpired as e:  # keep what it printed before
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            res = subprocess.CompletedProcess(cmd, 124, out, f"timed out after {timeout}s")
        secs = time.perf_counter() - t
        self.log.write(f"$ {' '.join(str(c) for c in cmd)}\n# rc={res.returncode} {secs:.1f}s\n"
                       f"{res.stdout[-6000:]}\n{res.stderr[-4000:]}\n")
        self.log.flush()
        return res, secs

    @staticmethod
    def lines(res) -> list[dict]:
        return [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")]

    @staticmethod
    def failure(res) -> str:
        lines = (res.stderr or res.stdout).strip().splitlines()
        return (lines[-1] if lines else f"exit {res.returncode}")[:200]

    def model_dir(self, name: str, config: dict) -> Path:
        d = self.work / name
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps(config))
        return d

    # -- checks --------------------------------------------------------------------------------
    def unit(self) -> None:
        if not self.args.models_tests:
            return self.row("unit tests on the device", "SKIP", "binaries built on this host: no GTest here")
        res, secs = self.run([self.args.models_tests, f"--gtest_filter={UNIT_FILTER}"],
                             {"SPECWIRE_TEST_DEVICE": self.args.device_name},
                             timeout=self.args.unit_timeout)
        ok_tests = re.findall(r"\[       OK \] (\S+) \((\d+) ms\)", res.stdout)
        failed = sorted(set(f for f in re.findall(r"\[  FAILED  \] (\S+)", res.stdout) if "." in f))
        timed_out = res.returncode == 124
        ok = res.returncode == 0 and not failed
        slowest = sorted(ok_tests, key=lambda t: -int(t[1]))[:2]
        self.row("unit tests on the device", "PASS" if ok else ("INFO" if timed_out and not failed else "FAIL"),
                 f"{len(ok_tests)} passed, {len(failed)} failed ({UNIT_FILTER}); {secs:.0f}s"
                 + (f"; stopped at the {self.args.unit_timeout}s limit" if timed_out else "")
                 + (f"; slowest: {', '.join(f'{n} {int(ms) / 1000:.0f}s' for n, ms in slowest)}" if slowest else "")
                 + (f"; failed: {', '.join(failed)[:300]}" if failed else ""))

    def decode_modes(self, name: str, model: Path, dtype: str, modes: str, random: bool,
                     extra: list | None = None, label: str = "") -> list[dict]:
        cmd = [self.args.bench_decode, "--model", model, "--device_map", self.args.device,
               "--dtype", dtype, "--mode", modes] + (["--random_weights"] if random else []) + (extra or [])
        res, secs = self.run(cmd, timeout=150)
        if res.returncode != 0:
            self.row(f"{modes} {name} {dtype}{label}", "ERROR", self.failure(res))
            return []
        return self.lines(res)

    def invariance(self, name: str, model: Path, dtype: str, random: bool, floor: int = 0,
                   cases: int = 8) -> None:
        extra = ["--cases", cases] + (["--decode_row_floor", floor] if floor else [])
        label = f" floor {floor}" if floor else ""
        for j in self.decode_modes(name, model, dtype, "invariance", random, extra, label):
            if j["mode"] != "invariance":
                continue
            self.row(f"invariance {name} {dtype}{label}", "PASS" if j["identical"] else "FAIL",
                     f"{j['steps'] - j['differing_steps']}/{j['steps']} steps bit-identical over "
                     f"{j['sequences']} sequences (up to {j['max_rows']} rows)"
                     + ("" if j["identical"] else
                        f"; max |diff| {j['max_abs_diff']:.2e}, {j['argmax_differences']} argmax "
                        f"changes, first at {j['first_difference']}") + f"; {j['seconds']:.0f}s")

    def packed(self, name: str, model: Path, dtype: str, random: bool) -> None:
        for j in self.decode_modes(name, model, dtype, "packed_invariance", random,
                                   ["--cases", 12, "--max_prompt", 700]):
            if j["mode"] != "packed_invariance":
                continue
            self.row(f"packed extraction {name} {dtype}", "PASS" if j["identical"] else "FAIL",
                     f"{j['taps_compared'] - j['taps_differing']}/{j['taps_compared']} taps bit-identical "
                     f"packed beside others vs alone" +
                     ("" if j["identical"] else f"; max |diff| {j['max_abs_diff']:.2e}"))

    def gemm_rows(self, name: str, model: Path, dtype: str) -> None:
        for j in self.decode_modes(name, model, dtype, "gemm_rows", True):
            if j["mode"] != "gemm_rows":
                continue
            bad = {f"{s['out']}x{s['in']}": s["row_counts_differing_from_8"] for s in j["shapes"]}
            differ = {k: v for k, v in bad.items() if v}
            self.row(f"gemm rows {name} {dtype}", "INFO",
                     "every row count gives rows 0-7 the bits of an 8-row product" if not differ else
                     "row counts whose rows 0-7 differ from 8 rows: " +
                     "; ".join(f"{k}: {v}" for k, v in differ.items()))

    def throughput(self, name: str, model: Path) -> None:
        lines = self.decode_modes(name, model, "bfloat16", "throughput", True,
                                  ["--batches", self.args.batches, "--prompt_len", 128,
                                   "--new_tokens", self.args.new_tokens])
        t = {j["batch"]: j for j in lines if j["mode"] == "throughput"}
        for b, j in sorted(t.items()):
            self.row(f"generate {name} bf16 batch {b}", "INFO",
                     f"decode {j['decode_tok_s']:,.0f} tok/s ({j['step_ms_median']:.1f} ms/step), "
                     f"with prefill {j['generate_tok_s']:,.0f} tok/s")
        if 1 in t and len(t) > 1:
            top = max(t)
            self.ratios["generate_batching_ratio"] = t[top]["decode_tok_s"] / t[1]["decode_tok_s"]
            self.row(f"generate batching {name}", "INFO",
                     f"batch {top} / batch 1 decode tokens/s = {self.ratios['generate_batching_ratio']:.2f}")

    def graphs(self, name: str, model: Path) -> None:
        for j in self.decode_modes(name, model, "bfloat16", "graphs", True,
                                   ["--batches", self.args.graph_batches]):
            if j["mode"] != "graphs":
                continue
            if "error" in j:
                self.row(f"cuda graph {name} batch {j['batch']}", "INFO", j["error"][:200])
                continue
            self.row(f"cuda graph {name} batch {j['batch']}", "INFO",
                     f"{j['rows']} rows: eager {j['eager_ms']:.2f} ms, graph replay {j['graph_ms']:.2f} ms "
                     f"(x{j['speedup']:.2f}); replay = eager bits: {j['replay_equals_eager']}")

    def replay(self) -> None:
        prompts = Path(self.args.prompts)
        models = REPO / "models"
        target = models / "tiny-qwen3"
        for drafter in ("tiny-qwen3-dflash", "tiny-qwen3-dflash2", "tiny-qwen3-eagle3"):
            name = f"replay {drafter} fp32"
            base = [self.args.replay, "replay", "--drafter", models / drafter,
                    "--target_checkpoint", target, "--max_new_tokens", 64, "--dtype", "float32",
                    "--ddtree", "none"]
            cpu, _ = self.run(base + ["--tokens_file", prompts, "--device_map", "cpu"])
            if cpu.returncode != 0:
                self.row(name, "ERROR", "cpu: " + self.failure(cpu))
                continue
            c = json.loads(cpu.stdout)
            traj = self.work / f"{drafter}.trajectories.json"
            prompt_list = json.loads(prompts.read_text())
            traj.write_text(json.dumps([{"prompt": p, "completion": r["completion"]}
                                        for p, r in zip(prompt_list, c["responses"])]))
            gpu, _ = self.run(base + ["--trajectories_file", traj, "--device_map", self.args.device])
            if gpu.returncode != 0:
                self.row(name, "ERROR", "gpu: " + self.failure(gpu))
                continue
            g = json.loads(gpu.stdout)
            same_steps = sum(a["step_lengths"] == b["step_lengths"] for a, b in zip(c["responses"], g["responses"]))
            tau_c = c["summary"]["tau_mean_of_means"] if "summary" in c else None
            tau_g = g["summary"]["tau_mean_of_means"] if "summary" in g else None
            n = len(c["responses"])
            ok = same_steps == n and (tau_c == tau_g)
            self.row(name, "PASS" if ok else "FAIL",
                     f"{same_steps}/{n} responses step for step; tau cpu {tau_c} gpu {tau_g}")

    def live(self) -> None:
        prompts = Path(self.args.prompts)
        models = REPO / "models"
        costs = []
        for target in ("tiny-qwen3", "tiny-qwen3_5"):
            res, _ = self.run([self.args.replay, "replay", "--drafter", models / "tiny-qwen3-dflash",
                               "--target_checkpoint", models / target, "--tokens_file", prompts,
                               "--max_new_tokens", 64, "--dtype", "float32", "--device_map",
                               self.args.device, "--ddtree", "none", "--live"])
            if res.returncode != 0:
                self.row(f"live {target} fp32", "ERROR", self.failure(res))
                continue
            j = json.loads(res.stdout)
            live, t = j["live"], j["timing"]
            replay_s = t["generate_seconds"] + t["features_seconds"] + t["replay_seconds"]
            cost = live["seconds"] / replay_s
            costs.append(cost)
            n = live["of"]
            self.row(f"live {target} fp32", "PASS" if live["equal_to_replay"] == n else "FAIL",
                     f"{live['equal_to_replay']}/{n} responses step for step = replay; live "
                     f"{live['seconds'] / n * 1e3:.0f} ms/prompt, replay {replay_s / n * 1e3:.0f} ms/prompt "
                     f"(generate {t['generate_seconds']:.2f}s + features {t['features_seconds']:.2f}s "
                     f"+ replay {t['replay_seconds']:.2f}s); cost x{cost:.2f}")
        if costs:
            self.ratios["live_vs_replay_cost"] = max(costs)

    def main(self) -> int:
        a = self.args
        t0 = time.perf_counter()
        big = SMALL if a.small else QWEN3_8B
        big_name = "qwen3-small" if a.small else "qwen3-8b"
        big_dir = self.model_dir(big_name, big)
        ref = Path(a.ref)
        manifest = json.loads((ref / "manifest.json").read_text())
        steps = []
        for c in manifest["checkpoints"]:
            steps.append((f"packed extraction {c['name']}",
                          lambda c=c: self.packed(c["name"], ref / c["model"], "float32", False)))
            for dtype in ("float32", "bfloat16"):
                steps.append((f"invariance {c['name']} {dtype}",
                              lambda c=c, dtype=dtype: self.invariance(c["name"], ref / c["model"], dtype,
                                                                       False, cases=16)))
        for dtype in ("bfloat16", "float32"):
            steps.append((f"invariance {big_name} {dtype}",
                          lambda dtype=dtype: self.invariance(big_name, big_dir, dtype, True, cases=24)))
            steps.append((f"invariance {big_name} {dtype} floor",
                          lambda dtype=dtype: self.invariance(big_name, big_dir, dtype, True, floor=64,
                                                              cases=24)))
            steps.append((f"gemm rows {big_name} {dtype}", lambda dtype=dtype: self.gemm_rows(big_name, big_dir, dtype)))
            steps.append((f"packed extraction {big_name} {dtype}",
                          lambda dtype=dtype: self.packed(big_name, big_dir, dtype, True)))
        steps += [("throughput", lambda: self.throughput(big_name, big_dir)),
                  ("graphs", lambda: self.graphs(big_name, big_dir)),
                  ("replay", self.replay), ("live", self.live), ("unit", self.unit)]
        for name, fn in steps:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 (one broken check must not hide the others)
                self.row(name, "ERROR", f"{type(e).__name__}: {str(e)[:160]}")
        width = max(len(r["check"]) for r in self.rows)
        lines = [f"{'check':<{width}}  result  numbers", "-" * (width + 60)]
        lines += [f"{r['check']:<{width}}  {r['result']:<6}  {r['numbers']}" for r in self.rows]
        bad = [r for r in self.rows if r["result"] in ("FAIL", "ERROR")]
        lines.append(f"{len(self.rows)} checks, {len(bad)} failed; gpu_decode.py {time.perf_counter() - t0:.0f}s")
        for k in ("live_vs_replay_cost", "generate_batching_ratio"):
            if k in self.ratios:
                lines.append(f"{k}={self.ratios[k]:.2f}")
        table = "\n".join(lines)
        print("\n" + table)
        (self.out / "decode-summary.txt").write_text(table + "\n")
        return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-decode", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--models-tests", default="", help="models_tests (empty: skip the unit tests)")
    ap.add_argument("--ref", required=True, help="build/gpu-kit/ref")
    ap.add_argument("--prompts", required=True, help="token ids of the held-out prompts (JSON)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="device map for the binaries")
    ap.add_argument("--device-name", default="cuda", help="SPECWIRE_TEST_DEVICE for the unit tests")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--unit-timeout", type=int, default=100)
    ap.add_argument("--graph-batches", default="1,8,64")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--small", action="store_true", help="tiny shapes (to test the driver on a CPU)")
    return Driver(ap.parse_args()).main()


if __name__ == "__main__":
    sys.exit(main())
