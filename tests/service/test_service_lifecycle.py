"""Many clients at once, cancellation, admission control, deadlines and graceful shutdown, on
real servers. The long-running work is a greedy Generate of thousands of tokens on the tiny model
(~3 ms per token on one thread), so a request that does not get stopped is seconds long.

Every step waits on what the server exposes (its metrics, the messages and status of a stream,
its log, its exit status), never on sleeping or on elapsed time; the waits' timeouts are safety
nets for a condition that never comes."""
from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
import torch
from extractor_harness import (metric_sum, metric_value, random_sequences, wait_for,
                               wait_for_metric)

from specwire_client import ExtractorClient, ExtractorError, extractor_pb2 as pb

# Tokens: a tiny model on an idle machine decodes thousands of tokens a second, so this is
# minutes of work, always cancelled long before it ends.
LONG_GENERATE = 100000
DRAIN_GENERATE = 6000  # tokens of the Generate that SIGTERM must let finish


def long_generate(stub, request_id: str = "long") -> grpc.Call:
    """A raw Generate stream that runs for many seconds unless cancelled."""
    req = pb.GenerateRequest(prompts=[pb.SequenceInput(tokens=pb.TokenIds(ids=[1, 2, 3]))],
                             max_new_tokens=LONG_GENERATE, ignore_model_eos=True,
                             request_id=request_id)
    return stub.Generate(req, timeout=120)


# --- many clients --------------------------------------------------------------------------------

def _workload(thread: int) -> list[tuple]:
    """Three requests per thread, different in kind, lengths, layers and dtypes."""
    seqs = random_sequences([3 + thread, 20 - thread, 7 + 2 * thread], seed=100 + thread)
    layers = [[0], [2, 1], [0, 1, 2]][thread % 3]
    dtype = "fp32" if thread % 2 else "bf16"
    return [
        ("extract", dict(sequences=seqs, layer_ids=layers, dtype=dtype,
                         final_norm=thread % 3 == 0, max_chunk_bytes=512 + 97 * thread)),
        ("generate", dict(prompts=[seqs[0]], max_new_tokens=4 + thread, ignore_model_eos=True,
                          layer_ids=layers, embedding=thread % 2 == 0, dtype=dtype)),
        ("extract", dict(sequences=seqs[1:], layer_ids=[2], embedding=True, dtype=dtype)),
    ]


def _run(c: ExtractorClient, kind: str, kw: dict):
    if kind == "extract":
        return [dict(s) for s in c.extract(**kw)]
    return [(g.completion_ids, g.finish_reason, g.states) for g in c.generate(**kw)]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _alone_then_together(server, repeats: int, between=lambda: None) -> tuple[dict, Any, dict]:
    """8 threads' workloads (_workload), each run alone on one channel, then all at once, each
    thread on its own channel and released together, `repeats` times over: (alone, what
    `between` returned when called between the two, together); alone and together map each
    thread to its results in order."""
    work = {t: _workload(t) for t in range(8)}
    with ExtractorClient(server.address, timeout=60) as c:
        alone = {t: [_run(c, kind, kw) for kind, kw in reqs] for t, reqs in work.items()}
    seen = between()
    barrier = threading.Barrier(len(work))

    def thread_main(t: int):
        with ExtractorClient(server.address, timeout=60) as c:
            c.wait_ready()
            barrier.wait()
            return [_run(c, kind, kw) for kind, kw in work[t] * repeats]

    with ThreadPoolExecutor(len(work)) as pool:
        together = dict(zip(work, pool.map(thread_main, work)))
    return alone, seen, together


def test_concurrent_clients_get_their_own_exact_data(server_factory, checkpoint):
    """8 threads, each with its own channel, mixed Extract and Generate: every result equals the
    same request run alone. --max_batch_tokens=1 keeps each request in a forward pass of its own
    (values depend on the padded batch in the last bits; see test_service_bits), so any
    difference here would be corruption or cross-talk between streams."""
    server = server_factory(checkpoint, metrics=False, args=("--max_batch_tokens=1",))
    alone, _, together = _alone_then_together(server, repeats=2)
    for t, results in together.items():
        for i, got in enumerate(results):
            assert _same(got, alone[t][i % 3]), f"thread {t} request {i} differs"


def test_cobatched_requests_are_routed_correctly(server_factory, checkpoint):
    """The same 8-thread load on a server that batches requests together (the default): each
    request gets its own sequences, states and dtype. Values are compared with a tolerance of
    the size the padded batch can change them by (fp32 ~1e-7 relative, bf16 one rounding
    step), which is far below what a mix-up would show; the exact comparison is the test above."""
    server = server_factory(checkpoint)
    alone, before, together = _alone_then_together(server, repeats=3, between=lambda: metric_value(
        server.metrics(), "specwire_extractor_batch_requests_bucket", le="1"))
    text = server.metrics()
    batches = metric_value(text, "specwire_extractor_batch_requests_count")
    single = metric_value(text, "specwire_extractor_batch_requests_bucket", le="1")
    assert batches - single >= 1, "no two requests ran in one batch: nothing was tested"
    assert single >= before
    for t, results in together.items():
        for i, got in enumerate(results):
            _close(got, alone[t][i % 3], f"thread {t} request {i}")


def _close(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        tol = dict(rtol=8e-3, atol=1e-3) if a.dtype == torch.bfloat16 else dict(rtol=1e-5,
                                                                                 atol=1e-6)
        torch.testing.assert_close(a, b, **tol, msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where} {k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for x, y in zip(a, b):
            _close(x, y, where)
    else:
        assert a == b, where


# --- cancellation --------------------------------------------------------------------------------

def test_cancelled_stream_frees_the_worker(server_factory, checkpoint):
    """A cancelled Generate is stopped in the engine, not run to its end: the worker hands the
    job back (its stream ends CANCELLED, with no completion counted) before the next request is
    sent, and that request then runs on the freed worker."""
    server = server_factory(checkpoint)
    with ExtractorClient(server.address, timeout=30) as c:
        call = long_generate(c.stub)
        first = next(call)
        assert first.WhichOneof("message") == "contract"
        wait_for(lambda: _active_streams(server) == 1, 5, "the Generate stream to be open")
        call.cancel()
        _assert_worker_released_the_cancelled_generate(server)
        out = c.extract([[5, 6, 7]], [1], dtype="fp32", timeout=10)
        assert out[0]["layer.1"].shape == (3, 64)
        # (A call is counted just after its client saw the end.)
        wait_for_metric(server, "specwire_extractor_requests_total", 1, method="Extract",
                        code="OK")
        text = server.metrics()
        assert metric_value(text, "specwire_extractor_requests_total", method="Generate",
                            code="OK") == 0
        assert metric_value(text, "specwire_extractor_batch_requests_count") == 2
        assert _active_streams(server) == 0


def _assert_worker_released_the_cancelled_generate(server) -> None:
    """The one Generate of a fresh server was cancelled while it ran: waits until the worker has
    handed it back, then checks it ended without a result. (The stream's status comes from the
    worker's callback, after the engine returned and reported its batch: counted CANCELLED means
    the worker is free.)"""
    wait_for_metric(server, "specwire_extractor_requests_total", 1, method="Generate",
                    code="CANCELLED")
    text = server.metrics()
    assert metric_value(text, "specwire_extractor_batch_requests_count") == 1
    assert metric_sum(text, "specwire_extractor_tokens_total", method="Generate") == 0
    assert metric_sum(text, "specwire_extractor_requests_total", method="Generate") == 1
    assert _active_streams(server) == 0


def test_client_that_stops_reading_is_cancelled(server_factory, checkpoint):
    """Leaving a stream half-read (closing the channel) cancels it on the server too."""
    server = server_factory(checkpoint)
    c = ExtractorClient(server.address, timeout=30)
    call = long_generate(c.stub)
    next(call)
    c.close()
    # The next client comes once the server has stopped the abandoned Generate.
    _assert_worker_released_the_cancelled_generate(server)
    with ExtractorClient(server.address, timeout=30) as c2:
        out = c2.extract([[1, 2]], [0], timeout=10)
        assert out[0]["layer.0"].shape == (2, 64)
    wait_for_metric(server, "specwire_extractor_requests_total", 1, method="Extract", code="OK")


# --- admission control ---------------------------------------------------------------------------

def test_queue_full_is_resource_exhausted(server_factory, checkpoint):
    """--max_queue=1 (and one sequence generated at a time): one request runs, one waits, the
    others are refused at once: with a plain status before any message (a request that had been
    queued would have had its contract first), while the running and the waiting one are both
    still open."""
    server = server_factory(checkpoint, metrics=False,
                            args=("--max_queue=1", "--max_concurrent_streams=100",
                                  "--max_running_sequences=1"))
    with ExtractorClient(server.address, timeout=30) as c:
        calls = []
        outcomes: dict[int, object] = {}
        threads = []

        def consume(i: int, call, received: int) -> None:
            try:
                for _ in call:
                    received += 1
                outcomes[i] = "OK"
            except grpc.RpcError as e:
                outcomes[i] = (e.code(), e.details(), received)

        def follow(i: int, call, received: int) -> None:
            calls.append(call)
            threads.append(threading.Thread(target=consume, args=(i, call, received)))
            threads[-1].start()

        def admitted(i: int) -> bool:
            """Sends long-i: True once its contract came (the server sends it only after the
            request entered the queue), False if it was refused because the queue is full."""
            call = long_generate(c.stub, f"long-{i}")
            try:
                first = next(call)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert "queue is full" in e.details(), e.details()
                return False
            assert first.WhichOneof("message") == "contract"
            follow(i, call, 1)
            return True

        assert admitted(0)
        # The queue has room for a second only after the worker took the first out of it to
        # run it: the first is running and the second waits once the second is admitted.
        wait_for(lambda: admitted(1), 10, "the worker to start the first Generate, making room "
                 "in the queue for a second")
        for i in range(2, 5):
            follow(i, long_generate(c.stub, f"long-{i}"), 0)
        wait_for(lambda: len(outcomes) >= 3, 10, "three refusals")
        refused = {i: o for i, o in outcomes.items() if isinstance(o, tuple)}
        assert sorted(refused) == [2, 3, 4], outcomes
        for code, details, received in refused.values():
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "queue is full" in details
            assert received == 0  # refused on arrival: never queued
        assert 0 not in outcomes and 1 not in outcomes, outcomes  # nothing left to make room
        with pytest.raises(ExtractorError) as info:
            c.extract([[1]], [0])
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        for call in calls:
            call.cancel()
        for t in threads:
            t.join(timeout=10)
        wait_for(lambda: _extract_ok(c), 5, "the server to take requests again")


def _active_streams(server) -> float:
    return metric_value(server.metrics(), "specwire_extractor_active_streams")


def _extract_ok(c: ExtractorClient) -> bool:
    try:
        c.extract([[1, 2]], [0], timeout=2)
        return True
    except ExtractorError:
        return False


def test_too_many_streams_is_resource_exhausted(server_factory, checkpoint):
    server = server_factory(checkpoint, metrics=False, args=("--max_concurrent_streams=1",))
    with ExtractorClient(server.address, timeout=30) as c:
        call = long_generate(c.stub)
        next(call)
        with pytest.raises(ExtractorError) as info:
            c.extract([[1]], [0])
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max_concurrent_streams" in info.value.details
        call.cancel()
        wait_for(lambda: _extract_ok(c), 5, "the stream slot to be released")


# --- deadlines -----------------------------------------------------------------------------------

def test_deadline_exceeded_and_the_server_keeps_serving(server_factory, checkpoint):
    # One sequence generated at a time: a second Generate waits in the queue behind the first.
    server = server_factory(checkpoint, args=("--max_running_sequences=1",))
    with ExtractorClient(server.address, timeout=30) as c:
        c.wait_ready()
        with pytest.raises(ExtractorError) as info:
            c.extract([[1, 2, 3]] * 8, [0, 1, 2], timeout=0.001)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        # (The timed-out request, if it got to the server at all, has left it: a submitted
        # job's callback, which observes its queue wait, runs before its stream slot is freed.)
        wait_for(lambda: _active_streams(server) == 0, 10, "the server to close every stream")
        waits = metric_value(server.metrics(), "specwire_extractor_queue_wait_seconds_count")
        # A deadline that passes while the request waits behind a long Generate.
        call = long_generate(c.stub)
        next(call)
        with pytest.raises(ExtractorError) as info:
            c.generate([[4, 5]], 3, timeout=0.5)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server takes it out of the queue at its deadline, not after the running Generate:
        # its callback runs (one more queue wait observed) and its stream ends (one open stream
        # left), while the first Generate still runs.
        wait_for(lambda: _active_streams(server) == 1 and metric_value(
            server.metrics(), "specwire_extractor_queue_wait_seconds_count") == waits + 1, 10,
            "the timed-out Generate to leave the queue and the server")
        assert metric_sum(server.metrics(), "specwire_extractor_requests_total",
                          method="Generate", code="OK") == 0
        # An Extract does not wait for the generation: it runs between decoding steps.
        out = c.extract([[1, 2, 3]], [0], dtype="fp32", timeout=10)
        assert out[0]["layer.0"].shape == (3, 64)
        with pytest.raises(ExtractorError) as info:
            c.generate([[4, 5]], 3, timeout=0.3)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        call.cancel()
        out = c.extract([[1, 2, 3]], [0], dtype="fp32", timeout=10)
        assert out[0]["layer.0"].shape == (3, 64)
        [g] = c.generate([[4, 5]], 3, ignore_model_eos=True, timeout=10)
        assert len(g.completion_ids) == 3
    # Counted, as DEADLINE_EXCEEDED or (see the next test) CANCELLED.
    wait_for(lambda: metric_value(server.metrics(), "specwire_extractor_requests_total",
                                  method="Extract", code="DEADLINE_EXCEEDED") + metric_value(
        server.metrics(), "specwire_extractor_requests_total", method="Extract",
        code="CANCELLED") >= 1 and metric_value(
        server.metrics(), "specwire_extractor_requests_total", method="Generate",
        code="DEADLINE_EXCEEDED") + metric_value(
        server.metrics(), "specwire_extractor_requests_total", method="Generate",
        code="CANCELLED") >= 3, 10, "the timed-out requests to be counted")


def test_deadline_is_counted_as_deadline_exceeded(server_factory, checkpoint):
    server = server_factory(checkpoint, args=("--max_running_sequences=1",))
    with ExtractorClient(server.address, timeout=30) as c:
        call = long_generate(c.stub)
        next(call)
        with pytest.raises(ExtractorError) as info:
            c.generate([[1, 2, 3]], 3, timeout=0.3)  # waits behind the first
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        call.cancel()
        wait_for(lambda: metric_value(server.metrics(), "specwire_extractor_requests_total",
                                      method="Generate", code="CANCELLED") == 1, 10, "the cancel")
        text = server.metrics()
        assert metric_value(text, "specwire_extractor_requests_total", method="Generate",
                            code="DEADLINE_EXCEEDED") == 1, [
            line for line in text.splitlines() if line.startswith("specwire_extractor_requests")]


# --- graceful shutdown ---------------------------------------------------------------------------

def test_sigterm_drains_in_flight_requests(server_factory, checkpoint):
    """SIGTERM: a running Generate and a two-prompt Generate queued behind it (one sequence
    generated at a time; an Extract would not wait: it runs between decoding steps) both finish
    OK with their trailers; a request sent after SIGTERM is refused; then the process exits 0."""
    # Long enough to still run when the second arrives on an idle machine (a tiny model decodes
    # thousands of tokens a second), with a drain window that a loaded one cannot exceed.
    server = server_factory(checkpoint, args=("--drain_seconds=150", "--max_running_sequences=1"))
    prompt = random_sequences([4], seed=7)[0]
    seqs = random_sequences([6, 9], seed=8)
    results: dict[str, object] = {}
    with ExtractorClient(server.address, timeout=60) as c:
        c.wait_ready()

        def run(name, fn):
            try:
                results[name] = fn()
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                results[name] = e

        gen = threading.Thread(target=run, args=("generate", lambda: c.generate(
            [prompt], DRAIN_GENERATE, ignore_model_eos=True, layer_ids=[1], dtype="fp32")))
        gen.start()
        wait_for(lambda: _active_streams(server) == 1, 5, "the Generate to start")
        ext = threading.Thread(target=run, args=("queued", lambda: c.generate(
            seqs, 5, ignore_model_eos=True, layer_ids=[0, 2], dtype="fp32")))
        ext.start()
        wait_for(lambda: _active_streams(server) == 2, 5, "the second Generate to be queued")
        server.signal(signal.SIGTERM)
        wait_for(lambda: "draining" in server.log(), 5, "the server to start draining")
        with pytest.raises(ExtractorError) as info:
            c.extract([[1, 2]], [0], timeout=10)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        gen.join(timeout=180)
        ext.join(timeout=180)
    assert not isinstance(results["generate"], Exception), results["generate"]
    assert not isinstance(results["queued"], Exception), results["queued"]
    [g] = results["generate"]
    assert len(g.completion_ids) == DRAIN_GENERATE
    assert g.states["layer.1"].shape == (DRAIN_GENERATE + 4, 64)
    queued = results["queued"]
    assert [r.states["layer.2"].shape[0] for r in queued] == [6 + 5, 9 + 5]
    assert server.proc.wait(timeout=60) == 0
    assert "stopped" in server.log()

