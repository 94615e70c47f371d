"""bench/load.py against a real extractor and scorer: N concurrent Extract / Generate / Score
streams for a bounded time, every chunk's crc32c and every reassembly checked.

Two runs on one pair of servers: N = 8 (no slow readers), then N = 64 with 16 slow readers (clients
that read one chunk and then stop reading until the end of the run). Both must finish with 0
errors, 0 mismatches and 0 crc failures. The extractor's memory must be bounded by its limits, not
by the number of clients: its peak RSS over the N = 64 run may exceed the N = 8 run's peak by at
most what the limits allow for the difference — one slow request's states + one chunk per stalled
stream (the stream reactor writes one message at a time and produces the next only when the
previous write completed, so a stalled reader pins no more) plus the activations of one
max_batch_tokens batch — and while the readers stay stalled it may grow by no more than the
fast streams are allowed to hold at once (one message each and one batch).
The figures are printed (pytest -s) and written to load-results.json in the test's tmp_path.
About 30 s on two cores.
"""
from __future__ import annotations

import json

import pytest
import torch
from extractor_harness import ExtractorServer, build_dir
from processes import launch_server, stop_process

import load as load_tool

pytest.importorskip("dflash", reason="the drafter comes from dflash's model code")
import dflash_fixtures as F  # noqa: E402

HIDDEN = 64  # dflash_fixtures.TARGET
LIMITS = {"max_concurrent_streams": 96, "max_batch_tokens": 4096, "max_queue": 96,
          "max_tokens_per_request": 4096, "max_chunk_bytes": 1 << 20}
SLOW = dict(sequences=4, seq_len=256, layers=[0, 1, 2])  # + final_norm: 4 states
# Activations of one forward pass, per batch token: generous for this 3-layer, hidden-64 model
# (q/k/v/o, MLP, norms and one layer's attention working set, in fp32).
ACTIVATION_BYTES_PER_BATCH_TOKEN = 16 << 10


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    target = F.make_target(root / "target", overrides={"num_hidden_layers": 3})
    hf = F.hf_target(target)
    cfg = F.drafter_config(hf.config, block_size=4, target_layer_ids=[1, 2],
                           layer_types=["full_attention"], sliding_window=8)
    drafter = F.save_drafter(F.new_drafter(cfg, seed=1), root / "drafter", zlab_rope={})
    ext = ExtractorServer(target, root, metrics=False,
                          args=tuple(f"--{k}={v}" for k, v in LIMITS.items())).start()
    scorer_exe = build_dir() / "services" / "scorer" / "specwire-scorer"
    try:
        scorer, port = launch_server(
            [str(scorer_exe), f"--extractor={ext.address}", "--listen=127.0.0.1:0",
             # The scorer's defaults (a queue of 16 jobs), as the README starts it: Score
             # streams past the queue are refused (RESOURCE_EXHAUSTED) and the clients back off.
             "--metrics_listen=", "--dtype=float32", "--threads=1", "--cache_dir=none"],
            root / "scorer.log", 60)
        try:
            yield {"extractor": ext, "scorer": f"127.0.0.1:{port}", "scorer_pid": scorer.pid,
                   "drafter": drafter, "root": root}
        finally:
            stop_process(scorer)
    finally:
        ext.stop()


def run_load(s: dict, n: int, duration: float, slow: int) -> dict:
    args = load_tool.parse_args([
        "--extractor", s["extractor"].address, "--scorer", s["scorer"], "--drafter",
        str(s["drafter"]), "--pid", str(s["extractor"].pid), "--pid", str(s["scorer_pid"]),
        "-n", str(n), "--duration", str(duration), "--slow_readers", str(slow),
        "--mix", "extract=4,generate=2,score=1", "--layers", "0,2", "--vocab", "500",
        "--slow_sequences", str(SLOW["sequences"]), "--slow_seq_len", str(SLOW["seq_len"]),
        "--slow_layers", ",".join(map(str, SLOW["layers"])), "--timeout", "60"])
    return load_tool.Load(args).run()


def test_load_n64_with_slow_readers(servers, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 cores: the servers get the other one
    try:
        small = run_load(servers, 8, 3.0, 0)
        big = run_load(servers, 64, 6.0, 16)
    finally:
        torch.set_num_threads(before)
    results = {"n8": small, "n64_slow16": big}
    print(json.dumps(results, indent=1))
    (tmp_path / "load-results.json").write_text(json.dumps(results, indent=1) + "\n")

    for r in (small, big):
        # Refusals (backpressure from full queues) are retried by the clients, not errors.
        assert (r["errors"], r["mismatches"], r["crc_failures"]) == (0, 0, 0), r["ops"]
        assert set(r["ops"]) >= {"extract", "generate", "score"}
        assert all(r["ops"][op]["streams"] > 0 for op in ("extract", "generate", "score"))
        assert r["chunks_verified"] > 0
    assert big["slow_streams_held"] == 16

    pid = str(servers["extractor"].pid)
    peak8 = small["servers"][pid]["rss_peak_mib"]
    peak64 = big["servers"][pid]["rss_peak_mib"]
    slow_state_bytes = (SLOW["sequences"] * SLOW["seq_len"] * (len(SLOW["layers"]) + 1)
                        * HIDDEN * 4)
    allowance = (16 * (slow_state_bytes + LIMITS["max_chunk_bytes"])
                 + LIMITS["max_batch_tokens"] * ACTIVATION_BYTES_PER_BATCH_TOKEN) / 2**20
    assert peak64 <= peak8 + allowance, (peak8, peak64, allowance)
    # While the slow readers stay stalled they add nothing; the fast streams go on, and what they
    # may hold at once beyond what they held when the stall began is what the limits let them
    # hold: one message being written per fast stream and one batch (its states and activations).
    # The bound follows from the configuration, not from how busy the machine is.
    fast_streams = min(LIMITS["max_concurrent_streams"], 64) - 16
    batch_bytes = LIMITS["max_batch_tokens"] * (ACTIVATION_BYTES_PER_BATCH_TOKEN
                                                + (len(SLOW["layers"]) + 1) * HIDDEN * 4)
    growth_bound = (fast_streams * LIMITS["max_chunk_bytes"] + batch_bytes) / 2**20
    growth = big["servers"][pid].get("rss_growth_during_stall_mib")
    assert growth is not None and growth <= growth_bound, (growth_bound, big["servers"][pid])
