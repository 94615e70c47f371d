"""The GPU drivers (bench/gpu_decode.py, bench/gpu_prefill.py) run end to end on the CPU.

They are meant for a borrowed CUDA host (scripts/gpu_all.sh), which CI never has: these runs keep
them, and the binaries' modes they drive (specwire-bench-decode's invariance, packed invariance,
throughput, graphs and gemm_rows; specwire-bench-extract's --random_weights, --copy_breakdown and
--count_syncs; specwire-replay --live), working between GPU sessions. On the CPU every check that
compares bits must pass: decoding and packed extraction are batch-invariant there.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "parity"))

from hf_fixtures import QWEN3_5_TINY, make_checkpoint  # noqa: E402

BUILD = Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))


def binary(*parts: str) -> Path:
    exe = BUILD.joinpath(*parts)
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    return exe


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> Path:
    """A kit-shaped reference folder: the tiny targets and the held-out prompts as token ids."""
    from tokenizers import Tokenizer

    out = tmp_path_factory.mktemp("gpu-ref")
    checkpoints = []
    for name, overrides, hybrid in (("qwen3_gqa2_tied", None, False),
                                    ("qwen3_5_hybrid", QWEN3_5_TINY, True)):
        (out / name).mkdir()
        path = make_checkpoint(name, out / name, seed=7, overrides=overrides)
        path.rename(out / name / "model")
        checkpoints.append({"name": name, "model": f"{name}/model", "hybrid": hybrid})
    (out / "manifest.json").write_text(json.dumps({"checkpoints": checkpoints}))
    tok = Tokenizer.from_file(str(REPO / "models" / "tiny-qwen3" / "tokenizer.json"))
    prompts = [json.loads(line)["prompt"] for line in open(REPO / "models" / "heldout_prompts.jsonl")]
    (out / "replay_prompts.json").write_text(json.dumps([tok.encode(p).ids for p in prompts[:4]]))
    return out


def test_decode_driver_on_the_cpu(ref: Path, tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_decode.py"),
         "--bench-decode", binary("bench", "specwire-bench-decode"),
         "--replay", binary("services", "scorer", "specwire-replay"),
         "--models-tests", binary("common", "models_tests"), "--unit-timeout", "300",
         "--ref", ref, "--prompts", ref / "replay_prompts.json", "--work", tmp_path / "work",
         "--out", tmp_path / "out", "--device", "cpu", "--device-name", "cpu", "--small",
         "--batches", "1,4", "--graph-batches", "1", "--new-tokens", "6"],
        capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    table = res.stdout[res.stdout.index("check "):]
    for check in ("invariance qwen3_gqa2_tied float32", "invariance qwen3_5_hybrid bfloat16",
                  "invariance qwen3-small float32 floor 64", "packed extraction qwen3_5_hybrid",
                  "replay tiny-qwen3-eagle3 fp32", "live tiny-qwen3_5 fp32",
                  "unit tests on the device"):
        line = next((l for l in table.splitlines() if l.startswith(check)), None)
        assert line is not None and " PASS " in line, f"{check}: {line}\n{table}"
    graph = next(l for l in table.splitlines() if l.startswith("cuda graph"))
    assert "not on one CUDA device" in graph or "built without CUDA headers" in graph, graph
    assert re.search(r"^live_vs_replay_cost=\d", res.stdout, re.M)
    assert re.search(r"^generate_batching_ratio=\d", res.stdout, re.M)


def test_prefill_driver_on_the_cpu(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_prefill.py"),
         "--bench", binary("bench", "specwire-bench-extract"), "--work", tmp_path / "work",
         "--out", tmp_path / "out", "--device", "cpu", "--small", "--seq-lens", "64,128",
         "--tokens-per-batch", "512", "--packed-rows", "256,512", "--reps", "1"],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "prefill.json").read_text())
    assert not result["failures"]
    rows = result["rows"]
    # Every shape and capture ran: two lengths at two row counts, every tap once, the hybrid.
    assert {(r["model"], r["taps"]) for r in rows} == {
        ("qwen3-small", "5 layers"), ("qwen3-small", "all taps"), ("hybrid-small", "5 layers")}
    assert sorted({r["rows"] for r in rows if r["taps"] == "5 layers" and r["model"] == "qwen3-small"}) == [256, 512]
    for r in rows:
        assert r["tok_s"] > 0 and r["gemm_tflops"] > 0 and 0 <= r["copy_hidden"] <= 1
        assert r["host_copies"] == "sync"  # the CPU has no copy stream
    assert re.search(r"^gpu_prefill_vs_gemm_ratio=\d", res.stdout, re.M)
