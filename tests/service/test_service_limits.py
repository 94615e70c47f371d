"""Limits a hostile or careless client meets before the server does any work: text inputs bounded
in bytes before they are tokenized, Tokenize answers that could not be sent refused up front,
health Watch streams that end when the server drains, and reflection that resolves every
served service (health included)."""
from __future__ import annotations

import signal
import threading

import grpc
import pytest
from extractor_harness import metric_sum, metric_value, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specwire_client import ExtractorClient, ExtractorError, extractor_pb2 as pb
from specwire_client import extractor_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def small_limits(server_factory, checkpoint_with_tokenizer):
    # 64 KiB chunks: the server sends messages of at most 64 KiB + 1 MiB.
    return server_factory(checkpoint_with_tokenizer,
                          args=("--max_text_bytes=4096", "--max_chunk_bytes=65536"))


@pytest.mark.parametrize("method", ["extract", "generate"])
def test_text_over_max_text_bytes_is_refused_before_tokenizing(small_limits, method):
    with ExtractorClient(small_limits.address, timeout=30) as c:
        long_text = "def f(x):\n    return x\n" * 400  # 23 bytes x 400
        with pytest.raises(ExtractorError) as info:
            if method == "extract":
                c.extract(["short", long_text], [0])
            else:
                c.generate([long_text], 2)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        msg = str(info.value)
        assert f"text: {len(long_text)} bytes exceed the limit of 4096 (--max_text_bytes)" in msg, msg
        # A text within the limit still works.
        assert c.extract(["short"], [0])[0]["layer.0"].shape[0] >= 1


def test_tokenize_refuses_long_texts_and_unsendable_answers_up_front(small_limits):
    with grpc.insecure_channel(small_limits.address) as ch:
        stub = pb_grpc.ExtractorStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(pb.TokenizeRequest(texts=["x" * 5000]), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "texts[0]: 5000 bytes exceed the limit of 4096 (--max_text_bytes)" in \
            info.value.details()
        # 400 texts of 4 KiB could answer with more than the server may send in one message:
        # refused before any of them is tokenized, naming the flag that sets the size.
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(pb.TokenizeRequest(texts=["ab" * 2048] * 400), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "--max_chunk_bytes" in info.value.details()
        assert "fewer or shorter texts" in info.value.details()
        ok = stub.Tokenize(pb.TokenizeRequest(texts=["ab" * 100] * 3), timeout=30)
        assert len(ok.sequences) == 3


def test_health_watch_ends_when_the_server_drains(server_factory, checkpoint):
    """An open Watch must not hold a draining server: it gets NOT_SERVING and then OK, and the
    server exits although its drain window (--drain_seconds 600) is far longer."""
    server = server_factory(checkpoint, args=("--drain_seconds=600",))
    seen: list[int] = []
    ended: dict[str, object] = {}
    with grpc.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=300)

        def read() -> None:
            try:
                for resp in stream:
                    seen.append(resp.status)
                ended["code"] = stream.code()
            except grpc.RpcError as e:
                ended["code"] = e.code()

        reader = threading.Thread(target=read)
        reader.start()
        wait_for(lambda: seen, 30, "the first Watch status")
        assert seen[0] == health_pb2.HealthCheckResponse.SERVING
        server.signal(signal.SIGTERM)
        reader.join(timeout=120)
        assert not reader.is_alive(), "the Watch stream did not end on drain"
    assert ended["code"] == grpc.StatusCode.OK, ended
    assert seen[-1] == health_pb2.HealthCheckResponse.NOT_SERVING, seen
    assert server.proc.wait(timeout=120) == 0
    assert "stopped" in server.log()


def test_reflection_resolves_every_served_service(fp32_server):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)

    with grpc.insecure_channel(fp32_server.address) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        pool = DescriptorPool(db)
        for name in db.get_services():
            service = pool.FindServiceByName(name)  # raises when the schema is not served
            assert service.methods, name
        health = pool.FindServiceByName("grpc.health.v1.Health")
        assert {m.name for m in health.methods} == {"Check", "Watch"}


def _big_extract(c_stub, request_id: str):
    """An Extract whose answer (~20 MB of fp32 states) is far more than flow control lets through
    to a client that does not read: the server's writes wait on it."""
    seqs = [pb.SequenceInput(tokens=pb.TokenIds(ids=[(7 * i + s) % 500 for i in range(4000)]))
            for s in range(4)]
    req = pb.ExtractRequest(sequences=seqs, dtype=pb.WIRE_DTYPE_F32, request_id=request_id,
                            layers=pb.LayerSelection(layer_ids=[0, 1, 2], embedding=True,
                                                     final_norm=True))
    return c_stub.Extract(req, timeout=300)


def test_a_stream_nobody_reads_is_cancelled_and_frees_its_slot(server_factory, checkpoint):
    server = server_factory(checkpoint, args=("--stream_idle_seconds=1",
                                              "--max_concurrent_streams=2"))
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.ExtractorStub(ch)
        held = [_big_extract(stub, f"idle-{k}") for k in range(2)]  # never read
        # Both slots are taken, then freed by the watchdog: the cancelled streams are counted
        # and the open-streams gauge returns to 0 (no reading happened in between).
        wait_for(lambda: metric_sum(server.metrics(), "specwire_extractor_requests_total",
                                    method="Extract", code="CANCELLED") >= 2,
                 60, "the idle streams to be cancelled")
        wait_for(lambda: metric_value(server.metrics(), "specwire_extractor_active_streams") == 0,
                 30, "the slots to be free")
        for call in held:
            with pytest.raises(grpc.RpcError) as info:
                for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.CANCELLED
        # A client that reads is served as before.
        with ExtractorClient(server.address, timeout=60) as c:
            out = c.extract([[1, 2, 3]] * 2, [0], dtype="fp32")
            assert [s["layer.0"].shape[0] for s in out] == [3, 3]


def test_streams_per_peer_are_capped(server_factory, checkpoint):
    server = server_factory(checkpoint, args=("--max_streams_per_peer=1",
                                              "--stream_idle_seconds=0"))
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.ExtractorStub(ch)
        first = _big_extract(stub, "peer-0")  # holds the peer's only slot while unread
        wait_for(lambda: metric_value(server.metrics(), "specwire_extractor_active_streams") == 1,
                 30, "the first stream to be open")
        with pytest.raises(grpc.RpcError) as info:
            for _ in _big_extract(stub, "peer-1"):
                pass
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max_streams_per_peer" in info.value.details()
        first.cancel()
        wait_for(lambda: metric_value(server.metrics(), "specwire_extractor_active_streams") == 0,
                 30, "the first stream to close")
        with ExtractorClient(server.address, timeout=60) as c:
            assert c.extract([[1, 2]], [0])[0]["layer.0"].shape[0] == 2
