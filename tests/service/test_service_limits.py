"""Limits a hostile or careless client meets before the server does any work: text inputs bounded
in bytes before they are tokenized, Tokenize answers that could not be sent refused up front,
health Watch streams that end when the server drains, and reflection that resolves every
served service (health included)."""
from __future__ import annotations

import signal
import threading

import grpc
import pytest
from extractor_harness import wait_for
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
