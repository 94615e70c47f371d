"""Deadlines and cancellations release the extractor's work: a request that waits in the queue
and passes its deadline, or is cancelled there or while it runs, leaves the queue and the
scheduler at once. The gauges (queue depth, open streams) return to 0 and the next request runs
without waiting for the abandoned work. The server generates one sequence at a time
(--max_running_sequences=1), so further Generates wait in the queue behind a running one."""
from __future__ import annotations

import grpc
import pytest
from faults_harness import metric_value, wait_for

from specwire_client import ExtractorClient, ExtractorError
from specwire_client._generated.proto.specwire.v1 import extractor_pb2 as pb

pytest.importorskip("transformers")
import hf_fixtures  # noqa: E402  (tests/parity, on sys.path through the service harness)


@pytest.fixture(scope="module")
def server(extractor_factory, tmp_path_factory):
    ckpt = hf_fixtures.make_checkpoint("qwen3_gqa2_tied", tmp_path_factory.mktemp("ckpt"))
    return extractor_factory(ckpt, args=("--max_running_sequences=1",))


def endless_generate(stub, request_id: str) -> grpc.Call:
    req = pb.GenerateRequest(prompts=[pb.SequenceInput(tokens=pb.TokenIds(ids=[1, 2, 3]))],
                             max_new_tokens=50000, ignore_model_eos=True,
                             request_id=request_id)
    return stub.Generate(req, timeout=120)


def gauges(server) -> tuple[float, float]:
    text = server.metrics()
    return (metric_value(text, "specwire_extractor_queue_depth"),
            metric_value(text, "specwire_extractor_active_streams"))


def count(server, method: str, code: str) -> float:
    return metric_value(server.metrics(), "specwire_extractor_requests_total", method=method,
                        code=code)


def test_queued_requests_leave_on_deadline_and_cancel(server):
    with ExtractorClient(server.address, timeout=30) as c:
        running = endless_generate(c.stub, "running")
        assert next(running).WhichOneof("message") == "contract"
        wait_for(lambda: gauges(server)[1] == 1, 10, "one running Generate")
        # The queue-depth gauge is sampled when the scheduler forms a batch (a running
        # Generate goes back to the queue between its steps): the open streams say what is
        # still held while it runs, and both gauges must be 0 at the end.

        # Queued behind it: a Generate whose deadline passes while it waits.
        with pytest.raises(ExtractorError) as info:
            c.generate([[4, 5]], 3, timeout=0.5)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: gauges(server)[1] == 1, 10, "the timed-out Generate to leave")

        # Queued behind it: a Generate cancelled by its client.
        queued = endless_generate(c.stub, "queued")
        assert next(queued).WhichOneof("message") == "contract"
        wait_for(lambda: gauges(server)[1] == 2, 10, "the second Generate to wait")
        queued.cancel()
        wait_for(lambda: gauges(server)[1] == 1, 10, "the cancelled Generate to leave")

        # The running one, cancelled: the scheduler drops it and the next request runs.
        running.cancel()
        wait_for(lambda: gauges(server) == (0, 0), 10, "the gauges to return to 0")
        out = c.extract([[1, 2, 3]], [0], dtype="fp32", timeout=10)
        assert out[0]["layer.0"].shape == (3, 64)

    wait_for(lambda: count(server, "Generate", "CANCELLED") == 2, 10, "both cancels counted")
    assert count(server, "Generate", "DEADLINE_EXCEEDED") == 1
    assert count(server, "Generate", "OK") == 0
    assert count(server, "Extract", "OK") == 1
