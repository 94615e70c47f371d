#!/usr/bin/env python3
"""Load tool: N concurrent Extract / Generate / Score streams against running servers for a
bounded time.

Every Extract and Generate stream goes through specwire_client.ExtractorClient, which checks each
chunk's crc32c, dtype, geometry and row range, rebuilds every state and checks the trailer's
totals; a CorruptStream naming a crc is counted as a crc failure, any other failure as an error.
The rebuilt data is also compared with a reference (the first answer to the same request, to
1e-4: batching with other requests moves fp32 results by ~1e-7) and greedy completions must be
identical, so a chunk put in the wrong place is a mismatch even when its crc is right. Score
streams must end with a summary for every prompt, with the same τ as the reference job.

Slow readers (--slow_readers K): K of the N clients open a large Extract, read the contract and
one chunk, then stop reading until the end of the run, then cancel. The servers' memory must not
grow with them beyond what the limits allow (one request's states + one chunk + HTTP/2 windows
per stream): peak RSS is sampled from /proc/<pid>/status (VmRSS every 50 ms, and VmHWM) for each
--pid.

Prints one JSON object (also written to --json): per operation count, errors, mismatches, crc
failures, p50/p99 latency; throughput (streams/s, tokens/s, MB/s of states); chunks verified;
per server peak RSS.

    python bench/load.py --extractor 127.0.0.1:50051 --pid $EXTRACTOR_PID -n 64 --duration 30 \
        [--scorer 127.0.0.1:50061 --drafter models/tiny-qwen3-dflash --pid $SCORER_PID] \
        [--slow_readers 8] [--mix extract=4,generate=2,score=1] [--tls_ca ca.pem ...]
"""
from __future__ import annotations

import argparse
import json
from os import getpid as os_getpid
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch

from specwire_client import ChannelSecurity, CorruptStream, ExtractorClient, ExtractorError
from specwire_client._generated.proto.specwire.v1 import scorer_pb2 as spb
from specwire_client._generated.proto.specwire.v1 import scorer_pb2_grpc as spb_grpc
from specwire_client._stubs import pb, pb_grpc
from specwire_client.security import make_channel


def read_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


class RssSampler(threading.Thread):
    def __init__(self, pids: list[int], period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.period = period
        self.start_status = {p: read_status(p) for p in pids}
        self.peak = {p: s["VmRSS"] for p, s in self.start_status.items()}
        self.samples: dict[int, list[tuple[float, int]]] = {p: [] for p in pids}
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop_event.is_set():
            for p in self.pids:
                try:
                    rss = read_status(p)["VmRSS"]
                except (OSError, KeyError):
                    continue
                self.peak[p] = max(self.peak[p], rss)
                self.samples[p].append((time.monotonic() - self.t0, rss))
            self.stop_event.wait(self.period)

    def report(self, settled_at: float | None = None) -> dict[str, dict]:
        """Per pid; with `settled_at` (monotonic), also the RSS growth from 1 s after it to the
        end: what stalled streams add while they stay stalled."""
        out = {}
        for p in self.pids:
            end = read_status(p) if Path(f"/proc/{p}").exists() else {}
            out[str(p)] = {"rss_start_mib": self.start_status[p]["VmRSS"] / 2**20,
                           "rss_peak_mib": self.peak[p] / 2**20,
                           "vmhwm_start_mib": self.start_status[p]["VmHWM"] / 2**20,
                           "vmhwm_end_mib": end.get("VmHWM", 0) / 2**20,
                           "rss_end_mib": end.get("VmRSS", 0) / 2**20}
            if settled_at is not None:
                after = [r for t, r in self.samples[p] if t >= settled_at + 1.0 - self.t0]
                if len(after) >= 2:
                    out[str(p)]["rss_at_stall_mib"] = after[0] / 2**20
                    out[str(p)]["rss_growth_during_stall_mib"] = (max(after) - after[0]) / 2**20
        return out


def _is_backpressure(e: Exception) -> bool:
    code = e.code() if isinstance(e, grpc.RpcError) else getattr(e, "code", None)
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED


@dataclass
class OpStats:
    count: int = 0
    errors: int = 0
    # RESOURCE_EXHAUSTED: the server's queue or stream slots were full ("retry later"); the
    # client backs off and tries again, as a real client would. Backpressure, not an error.
    refused: int = 0
    mismatches: int = 0
    crc_failures: int = 0
    tokens: int = 0
    state_bytes: int = 0
    chunks: int = 0
    latencies: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        lat = sorted(self.latencies)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2) if lat else None

        return {"streams": self.count, "errors": self.errors, "refused": self.refused,
                "mismatches": self.mismatches,
                "crc_failures": self.crc_failures, "tokens": self.tokens,
                "state_mib": round(self.state_bytes / 2**20, 2), "chunks": self.chunks,
                "p50_ms": pct(0.50), "p99_ms": pct(0.99), "error_samples": self.error_samples[:5]}


class Load:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.security = ChannelSecurity.resolve(
            tls=args.tls, tls_ca=args.tls_ca, tls_client_cert=args.tls_client_cert,
            tls_client_key=args.tls_client_key, tls_server_name=args.tls_server_name,
            token_file=args.auth_token_file)
        self.lock = threading.Lock()
        self.stats: dict[str, OpStats] = {}
        self.references: dict[tuple, object] = {}
        self.deadline = 0.0
        self.slow_held = 0
        self.all_held_at: float | None = None
        self.slow_chunks = 0
        rng = random.Random(args.seed)
        self.info = None
        # A small pool of distinct requests per operation, so that every answer has a reference.
        self.sequences = [[[rng.randrange(1, args.vocab) for _ in range(rng.randint(8, args.seq_len))]
                           for _ in range(args.sequences)] for _ in range(4)]
        self.prompts = [[[rng.randrange(1, args.vocab) for _ in range(6)]
                         for _ in range(args.sequences)] for _ in range(4)]

    def stat(self, op: str) -> OpStats:
        with self.lock:
            return self.stats.setdefault(op, OpStats())

    def check_reference(self, key: tuple, value, same) -> bool:
        with self.lock:
            ref = self.references.setdefault(key, value)
        return ref is value or same(ref, value)

    # --- one stream of each kind --------------------------------------------------------------

    def extract(self, client: ExtractorClient, k: int, st: OpStats) -> None:
        seqs = self.sequences[k]
        r = client.extract_stream(seqs, self.args.layers, final_norm=True, dtype="fp32",
                                  max_chunk_bytes=self.args.chunk_bytes, timeout=self.args.timeout)
        st.tokens += sum(len(s) for s in seqs)
        st.state_bytes += sum(t.numel() * 4 for s in r.sequences for t in s.values())
        st.chunks += r.trailer.chunks
        states = [{n: t.clone() for n, t in s.items()} for s in r.sequences]

        def same(a, b) -> bool:
            return all(x.keys() == y.keys() and all(torch.allclose(x[n], y[n], rtol=1e-4,
                                                                   atol=1e-5) for n in x)
                       for x, y in zip(a, b))
        if not self.check_reference(("extract", k), states, same):
            st.mismatches += 1

    def generate(self, client: ExtractorClient, k: int, st: OpStats) -> None:
        res = client.generate(self.prompts[k], self.args.max_new_tokens, ignore_model_eos=True,
                              layer_ids=self.args.layers[:1], dtype="fp32",
                              max_chunk_bytes=self.args.chunk_bytes, timeout=self.args.timeout)
        st.tokens += sum(len(r.completion_ids) for r in res)
        st.state_bytes += sum(t.numel() * 4 for r in res for t in r.states.values())
        ids = [list(r.completion_ids) for r in res]
        if not self.check_reference(("generate", k), ids, lambda a, b: a == b):
            st.mismatches += 1

    def score(self, stub: spb_grpc.ScorerStub, k: int, st: OpStats) -> None:
        prompts = [spb.PromptInput(tokens={"ids": p}) for p in self.prompts[k]]
        req = spb.ScoreRequest(drafter_path=self.args.drafter, prompts=prompts,
                               max_new_tokens=self.args.max_new_tokens)
        msgs = list(stub.Score(req, timeout=self.args.timeout))
        results = [m.result for m in msgs if m.WhichOneof("message") == "result"]
        if not msgs or msgs[-1].WhichOneof("message") != "summary" or len(results) != len(prompts):
            raise RuntimeError(f"Score stream incomplete: {[m.WhichOneof('message') for m in msgs]}")
        st.tokens += sum(r.completion_tokens for r in results)
        taus = sorted((r.prompt_index, round(r.tau, 9)) for r in results)
        if not self.check_reference(("score", k), taus, lambda a, b: a == b):
            st.mismatches += 1

    # --- workers ----------------------------------------------------------------------------

    def worker(self, index: int, ops: list[str]) -> None:
        client = ExtractorClient(self.args.extractor, timeout=self.args.timeout,
                                 security=self.security)
        scorer = None
        if self.args.scorer:
            channel = make_channel(self.args.scorer, [], self.security)
            scorer = spb_grpc.ScorerStub(channel)
        i = index
        backoff = 0.025  # seconds; doubles while the server refuses, up to 1 s
        try:
            while time.monotonic() < self.deadline:
                op = ops[i % len(ops)]
                k = (index + i) % 4
                i += 1
                st = self.stat(op)
                t0 = time.monotonic()
                try:
                    if op == "extract":
                        self.extract(client, k, st)
                    elif op == "generate":
                        self.generate(client, k, st)
                    else:
                        self.score(scorer, k, st)
                except CorruptStream as e:
                    with self.lock:
                        if "crc" in str(e).lower():
                            st.crc_failures += 1
                        else:
                            st.errors += 1
                        st.error_samples.append(str(e))
                    continue
                except (ExtractorError, grpc.RpcError, RuntimeError) as e:
                    if _is_backpressure(e):
                        with self.lock:
                            st.refused += 1
                        backoff = min(1.0, backoff * 2)
                        time.sleep(min(backoff * (0.5 + random.random()),
                                       max(0.0, self.deadline - time.monotonic())))
                        continue
                    with self.lock:
                        st.errors += 1
                        st.error_samples.append(f"{op}: {e}")
                    continue
                backoff = 0.025
                with self.lock:
                    st.count += 1
                    st.latencies.append(time.monotonic() - t0)
        finally:
            client.close()

    def slow_reader(self, index: int) -> None:
        """Opens a large Extract, reads the contract and one chunk, then stops reading."""
        channel = make_channel(self.args.extractor, [("grpc.max_receive_message_length", 64 << 20)],
                               self.security)
        stub = pb_grpc.ExtractorStub(channel)
        rng = random.Random(1000 + index)
        seqs = [pb.SequenceInput(tokens=pb.TokenIds(
            ids=[rng.randrange(1, self.args.vocab) for _ in range(self.args.slow_seq_len)]))
            for _ in range(self.args.slow_sequences)]
        req = pb.ExtractRequest(sequences=seqs,
                                layers=pb.LayerSelection(layer_ids=self.args.slow_layers
                                                         or self.args.layers,
                                                         final_norm=True),
                                dtype=pb.WIRE_DTYPE_F32, max_chunk_bytes=self.args.chunk_bytes)
        call = stub.Extract(req, timeout=self.args.duration + self.args.timeout)
        try:
            got = 0
            for _ in call:
                got += 1
                if got == 2:  # the contract and one chunk
                    break
            with self.lock:
                self.slow_held += 1
                self.slow_chunks += got - 1
                if self.slow_held == self.args.slow_readers:
                    self.all_held_at = time.monotonic()
            while time.monotonic() < self.deadline:
                time.sleep(0.05)
        except grpc.RpcError as e:
            with self.lock:
                self.stat("slow_reader").errors += 1
                self.stat("slow_reader").error_samples.append(str(e))
        finally:
            call.cancel()
            channel.close()

    def run(self) -> dict:
        a = self.args
        weights = dict(kv.split("=") for kv in a.mix.split(","))
        ops = [op for op, w in weights.items() for _ in range(int(w))
               if op != "score" or a.scorer]
        unknown = set(weights) - {"extract", "generate", "score"}
        if unknown or not ops:
            raise SystemExit(f"--mix: unknown or empty operations {sorted(unknown) or a.mix}")
        if a.scorer and not a.drafter:
            raise SystemExit("--scorer needs --drafter (a drafter directory on the scorer host)")
        # Warm-up: one of each request, sequentially, so that the references come from an
        # unloaded server and start-up costs stay out of the figures.
        warm = ExtractorClient(a.extractor, timeout=a.timeout, security=self.security)
        self.info = warm.model_info()
        warm_stats = OpStats()
        self.deadline = time.monotonic() + 3600
        for k in range(4):
            self.extract(warm, k, warm_stats)
            if "generate" in ops:
                self.generate(warm, k, warm_stats)
        if "score" in ops:
            stub = spb_grpc.ScorerStub(make_channel(a.scorer, [], self.security))
            for k in range(4):
                self.score(stub, k, warm_stats)
        warm.close()
        sampler = RssSampler(a.pid)
        sampler.start()
        t0 = time.monotonic()
        self.deadline = t0 + a.duration
        threads = [threading.Thread(target=self.slow_reader, args=(i,), daemon=True)
                   for i in range(a.slow_readers)]
        threads += [threading.Thread(target=self.worker, args=(i, ops), daemon=True)
                    for i in range(a.slow_readers, a.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        sampler.stop_event.set()
        sampler.join()
        ops_out = {op: s.summary() for op, s in sorted(self.stats.items())}
        total = sum(s.count for s in self.stats.values())
        return {
            "n": a.n, "slow_readers": a.slow_readers, "duration_s": round(wall, 2),
            "streams": total,
            "streams_per_s": round(total / wall, 2),
            "tokens_per_s": round(sum(s.tokens for s in self.stats.values()) / wall, 1),
            "state_mib_per_s": round(sum(s.state_bytes for s in self.stats.values()) / wall
                                     / 2**20, 2),
            "errors": sum(s.errors for s in self.stats.values()),
            "refused": sum(s.refused for s in self.stats.values()),
            "mismatches": sum(s.mismatches for s in self.stats.values()),
            "crc_failures": sum(s.crc_failures for s in self.stats.values()),
            "chunks_verified": sum(s.chunks for s in self.stats.values()),
            "slow_streams_held": self.slow_held,
            "stall_seconds": (round(self.deadline - self.all_held_at, 2)
                              if self.all_held_at else None),
            "ops": ops_out, "servers": sampler.report(self.all_held_at),
            # this process: what slow readers' unread messages cost on the client side
            "client_vmhwm_mib": round(read_status(os_getpid())["VmHWM"] / 2**20, 1),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--extractor", required=True, help="extractor address host:port")
    p.add_argument("--scorer", default="", help="scorer address (enables score streams)")
    p.add_argument("--drafter", default="", help="drafter directory on the scorer host")
    p.add_argument("-n", type=int, default=64, help="concurrent streams (clients)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    p.add_argument("--mix", default="extract=4,generate=2,score=1",
                   help="operation weights; score only with --scorer")
    p.add_argument("--slow_readers", type=int, default=0,
                   help="clients (of the n) that stop reading after one chunk")
    p.add_argument("--pid", type=int, action="append", default=[],
                   help="server process id whose RSS is sampled (repeatable)")
    p.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1],
                   help="layer ids asked for")
    p.add_argument("--sequences", type=int, default=2, help="sequences per request")
    p.add_argument("--seq_len", type=int, default=48, help="longest sequence of a request")
    p.add_argument("--max_new_tokens", type=int, default=8)
    p.add_argument("--chunk_bytes", type=int, default=16384, help="max_chunk_bytes asked for")
    p.add_argument("--slow_sequences", type=int, default=4,
                   help="sequences of a slow reader's request")
    p.add_argument("--slow_seq_len", type=int, default=256,
                   help="tokens of each of them")
    p.add_argument("--slow_layers", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="layer ids of a slow reader's request (default: --layers)")
    p.add_argument("--vocab", type=int, default=500, help="token ids are drawn below this")
    p.add_argument("--timeout", type=float, default=60.0, help="deadline of each stream (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="also write the result here")
    p.add_argument("--tls", action="store_true")
    p.add_argument("--tls_ca")
    p.add_argument("--tls_client_cert")
    p.add_argument("--tls_client_key")
    p.add_argument("--tls_server_name")
    p.add_argument("--auth_token_file")
    a = p.parse_args(argv)
    if a.n < 1 or not 0 <= a.slow_readers < a.n or a.duration <= 0:
        p.error("need n >= 1, 0 <= slow_readers < n, duration > 0")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = Load(args).run()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    bad = result["errors"] + result["mismatches"] + result["crc_failures"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
