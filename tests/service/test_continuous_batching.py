"""Continuous batching of Generate in a real specwire-extractor (dense and hybrid targets).

- Many concurrent Generate requests (random prompt lengths, some across the prefill chunk, random
  max_new_tokens, several prompts per request) complete with the tokens, finish reasons and
  features (bit for bit) of the same request sent alone, in fp32 and bf16; the extractor's
  metrics show decoding steps that served several sequences.
- Fair scheduling, by the order of completion (no timing): a short Extract sent after four long
  Generates started completes before any of them.
- The cache budget: a prompt whose cache can never fit --kv_cache_bytes is refused with
  RESOURCE_EXHAUSTED naming the flag; with a budget that runs one sequence at a time (and
  --max_running_sequences 2), concurrent requests wait their turn, a request with more prompts
  than run at once runs them in waves, and all get the same tokens as alone.
"""
from __future__ import annotations

import json
import random
import re
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import torch
from extractor_harness import metric_sum, wait_for_metric

import hybrid_fixtures as H  # noqa: E402  (tests/parity, on sys.path via extractor_harness)
from specwire_client import ExtractorClient, ExtractorError

VOCAB = 512
LAYERS = [0, 2]


@pytest.fixture(scope="module")
def hybrid_checkpoint(tmp_path_factory) -> Path:
    return H.save_text(H.random_causal_lm("interval4", seed=3),
                       tmp_path_factory.mktemp("hybrid") / "interval4")


def random_requests(seed: int, n: int) -> list[dict]:
    g = random.Random(seed)
    out = []
    for _ in range(n):
        prompts = []
        for _ in range(g.choice([1, 1, 2, 3])):
            length = g.randint(260, 560) if g.random() < 0.2 else g.randint(1, 48)
            prompts.append([g.randrange(VOCAB) for _ in range(length)])
        out.append({"prompts": prompts, "max_new_tokens": g.randint(1, 40)})
    return out


def generate(client: ExtractorClient, r: dict):
    return client.generate(r["prompts"], r["max_new_tokens"], ignore_model_eos=True,
                           layer_ids=LAYERS, final_norm=True, dtype="fp32")


def same(a, b, what: str) -> None:
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.completion_ids == y.completion_ids, f"{what}: prompt {i} tokens"
        assert x.finish_reason == y.finish_reason, f"{what}: prompt {i} finish reason"
        assert x.states.keys() == y.states.keys()
        for name in x.states:
            assert torch.equal(x.states[name], y.states[name]), f"{what}: prompt {i} {name}"


@pytest.mark.parametrize("target,compute", [("dense", "float32"), ("dense", "bfloat16"),
                                            ("hybrid", "float32")])
def test_concurrent_generates_equal_each_request_alone(server_factory, checkpoint,
                                                       hybrid_checkpoint, target, compute):
    model = checkpoint if target == "dense" else hybrid_checkpoint
    server = server_factory(model, dtype=compute)
    requests = random_requests(seed=zlib.crc32(f"{target}-{compute}".encode()), n=10)
    with ExtractorClient(server.address, timeout=300) as c:
        alone = [generate(c, r) for r in requests]
        before = server.metrics()
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda r: generate(c, r), requests))
        after = server.metrics()
    for i, (a, b) in enumerate(zip(alone, together)):
        same(a, b, f"{target} {compute} request {i}")
    assert served_several(after) - served_several(before) > 0, \
        "no decoding step served several sequences"


def served_several(metrics: str) -> float:
    """Decoding steps that served more than one sequence: the step histogram's count minus its
    le="1" bucket."""
    one = 0.0
    for line in metrics.splitlines():
        m = re.match(r'^specwire_extractor_decode_step_sequences_bucket\{le="([^"]+)"\}\s+(\S+)$',
                     line)
        if m and float(m.group(1)) == 1.0:
            one = float(m.group(2))
    return metric_sum(metrics, "specwire_extractor_decode_step_sequences_count") - one


def test_a_short_extract_overtakes_long_generations(server_factory, checkpoint):
    """Completion order, not timing: four long Generates are running (their first tokens have
    come), then a 16-token Extract is sent; it must complete before every Generate does."""
    server = server_factory(checkpoint, dtype="float32")
    order: list[str] = []
    lock = threading.Lock()
    started = threading.Barrier(5)

    def long_generate(i: int) -> None:
        with ExtractorClient(server.address, timeout=600) as c:
            started.wait()
            c.generate([[1 + i, 2, 3]], 1500, ignore_model_eos=True)
            with lock:
                order.append(f"generate-{i}")

    threads = [threading.Thread(target=long_generate, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait()
    with ExtractorClient(server.address, timeout=600) as c:
        # The four are admitted and decoding before the Extract is sent.
        wait_for_metric(server, "specwire_extractor_running_sequences", lambda v: v >= 4, 60)
        c.extract([list(range(16))], [0], dtype="fp32")
        with lock:
            order.append("extract")
    for t in threads:
        t.join()
    assert order[0] == "extract", order


def cache_bytes_per_token(checkpoint: Path) -> int:
    """fp32 K and V of every layer for one position."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * 4


def test_cache_budget_refuses_what_never_fits_and_queues_the_rest(server_factory, checkpoint):
    # Room for one sequence of up to 300 positions at a time.
    budget = 300 * cache_bytes_per_token(checkpoint)
    server = server_factory(checkpoint, dtype="float32",
                            args=(f"--kv_cache_bytes={budget}", "--max_running_sequences=2"))
    with ExtractorClient(server.address, timeout=300) as c:
        with pytest.raises(ExtractorError) as e:
            c.generate([[1, 2, 3]], 400, ignore_model_eos=True)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--kv_cache_bytes" in e.value.details and "max_new_tokens" in e.value.details
        requests = [{"prompts": [[i + 1] * (5 + i)], "max_new_tokens": 200} for i in range(6)]
        # More prompts than run at once (two): they run in waves, as room frees up.
        requests.append({"prompts": [[7, 8], [9], [10, 11, 12]], "max_new_tokens": 50})
        alone = [generate(c, r) for r in requests]
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda r: generate(c, r), requests))
    for i, (a, b) in enumerate(zip(alone, together)):
        same(a, b, f"budgeted request {i}")
