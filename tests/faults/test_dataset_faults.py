"""FeatureDataset when its extractor is SIGKILLed in the middle of an Extract stream: restarted on
the same port, or with a second replica at hand, the dataset reconnects, asks for the cut batch
again and yields exactly the items of an uninterrupted run (none twice, none lost, same values).

The streams are several MiB each (long sequences, all layers, fp32), far more than gRPC keeps in
flight with a fixed 64 KiB window, so the kill after the first chunk really cuts a stream: the
wrapper below records that the stream broke after it had started.
"""
from __future__ import annotations

import threading

import pytest
import torch
from faults_harness import random_sequences, wait_for

from specwire_client import ExtractorClient, FeatureDataset, IncompleteStream, RetryPolicy

pytest.importorskip("transformers")
import hf_fixtures  # noqa: E402  (tests/parity, on sys.path through the service harness)

LAYERS = [0, 1, 2]
PER_REQUEST = 2
SEQS = random_sequences([1500 + 37 * i for i in range(10)], seed=21)
KILL_IN_STREAM = 2  # the third stream is cut
# Without BDP probing the receive window stays at gRPC's initial 64 KiB, so the server cannot
# have sent a multi-MiB stream ahead of the reader: the kill after its first chunk cuts it.
SMALL_WINDOW = {"grpc.http2.bdp_probe": 0}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return hf_fixtures.make_checkpoint("qwen3_gqa2_tied", tmp_path_factory.mktemp("ckpt"))


def reference(address: str) -> list[dict]:
    """The uninterrupted run: the same batches sent directly."""
    out = []
    with ExtractorClient(address, timeout=60) as c:
        for i in range(0, len(SEQS), PER_REQUEST):
            out += [dict(s) for s in c.extract(SEQS[i:i + PER_REQUEST], LAYERS, dtype="fp32",
                                               final_norm=True)]
    return out


class KillingClient(ExtractorClient):
    """Calls `kill(chunk)` right after the first hidden-state chunk of stream number `kill_in`
    has arrived (so in the middle of that stream) and records how the stream then ended."""

    def __init__(self, target, kill, kill_in: int, state: dict, **kw) -> None:
        super().__init__(target, **kw)
        self.kill, self.kill_in, self.state = kill, kill_in, state

    def _stream(self, method, call):
        n = self.state["streams"]
        self.state["streams"] += 1
        killed_here = False
        try:
            for msg in super()._stream(method, call):
                yield msg
                if (n == self.kill_in and not self.state["killed"]
                        and msg.WhichOneof("message") == "chunk"):
                    self.kill(msg.chunk)
                    self.state["killed"] = killed_here = True
        except IncompleteStream as e:
            if killed_here:
                self.state["cut"] = e
            raise


def assert_same_items(items: list[dict], ref: list[dict]) -> None:
    assert [it["input_ids"].tolist() for it in items] == SEQS
    for i, (it, want) in enumerate(zip(items, ref)):
        assert it["hidden_states"].keys() == want.keys()
        for name in want:
            assert torch.equal(it["hidden_states"][name], want[name]), f"item {i} {name}"


def test_extractor_killed_mid_stream_and_restarted(extractor_factory, checkpoint):
    server = extractor_factory(checkpoint, metrics=False)
    ref = reference(server.address)
    restarted = threading.Event()

    def kill_and_restart_later(_chunk) -> None:
        server.kill()

        def run() -> None:
            # Some retries hit the closed port first: the cut stream and one retry have failed.
            wait_for(lambda: ds.retries >= 2, 60, "a retry to fail on the closed port")
            server.start()
            restarted.set()
        threading.Thread(target=run, daemon=True).start()

    state = {"streams": 0, "killed": False}
    ds = FeatureDataset(None, SEQS, LAYERS, final_norm=True, dtype="fp32",
                        sequences_per_request=PER_REQUEST, prefetch_depth=1, max_chunk_bytes=65536,
                        retry=RetryPolicy(max_retries=40, backoff_initial=0.05,
                                          backoff_multiplier=1.5, backoff_max=0.3), timeout=60,
                        client_factory=lambda: KillingClient(server.address,
                                                             kill_and_restart_later,
                                                             KILL_IN_STREAM, state, timeout=60,
                                                             options=SMALL_WINDOW))
    items = list(ds)
    assert restarted.is_set() and server.starts == 2
    assert "cut" in state, "the kill did not cut the stream it was sent in"
    assert ds.retries >= 1
    assert_same_items(items, ref)


def test_extractor_killed_mid_stream_with_a_second_replica(extractor_factory, checkpoint):
    """The dataset's target is both replicas (round-robin); the one serving the cut stream is
    killed for good, and the retry goes to the other. The replicas chunk differently (256 and
    512 rows per chunk by default), so a chunk tells which one sent it."""
    replicas = {256: extractor_factory(checkpoint, metrics=False,
                                       args=("--default_chunk_bytes=65536",)),
                512: extractor_factory(checkpoint, metrics=False,
                                       args=("--default_chunk_bytes=131072",))}
    ref = reference(replicas[256].address)
    killed = []

    def kill_sender(chunk) -> None:
        server = replicas[chunk.token_count]
        server.kill()
        killed.append(server)

    state = {"streams": 0, "killed": False}
    target = [r.address for r in replicas.values()]
    ds = FeatureDataset(None, SEQS, LAYERS, final_norm=True, dtype="fp32",
                        sequences_per_request=PER_REQUEST, prefetch_depth=1,
                        retry=RetryPolicy(max_retries=5, backoff_initial=0.05), timeout=60,
                        client_factory=lambda: KillingClient(target, kill_sender, KILL_IN_STREAM,
                                                             state, timeout=60,
                                                             options=SMALL_WINDOW))
    items = list(ds)
    assert "cut" in state, "the kill did not cut the stream it was sent in"
    assert len(killed) == 1 and killed[0].proc.poll() is not None
    assert ds.retries >= 1
    assert_same_items(items, ref)
