"""Limits a hostile or careless client meets before the server does any work: text inputs bounded
in bytes before they are tokenized, Tokenize answers that could not be sent refused up front,
health Watch streams that end when the server drains, and reflection that resolves every
served service (health included)."""
from __future__ import annotations

import shutil
import signal
import sys
import threading
from pathlib import Path

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


def _reflection_v1_stubs(tmp: Path):
    """Python stubs of proto/grpc/reflection/v1/reflection.proto, made with grpc_tools."""
    import importlib

    from grpc_tools import protoc
    repo = Path(__file__).resolve().parents[2]
    out = tmp / "gen"
    out.mkdir()
    # A file name of its own, so the generated module is top-level and unique.
    shutil.copy(repo / "proto/grpc/reflection/v1/reflection.proto",
                out / "specwire_test_reflection_v1.proto")
    assert protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                        str(out / "specwire_test_reflection_v1.proto")]) == 0
    sys.path.insert(0, str(out))
    try:
        pb2 = importlib.import_module("specwire_test_reflection_v1_pb2")
        pb2_grpc = importlib.import_module("specwire_test_reflection_v1_pb2_grpc")
    finally:
        sys.path.remove(str(out))
    return pb2, pb2_grpc


def test_reflection_v1_lists_and_resolves_every_service(fp32_server, tmp_path):
    """grpc.reflection.v1 (what current grpcurl and grpcui ask first) answers like v1alpha: the
    same services, each resolvable from the files it returns; unknown names are NOT_FOUND in the
    stream's error response, and the stream stays usable."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)

    pb2, pb2_grpc = _reflection_v1_stubs(tmp_path)
    R = pb2.ServerReflectionRequest
    with grpc.insecure_channel(fp32_server.address) as ch:
        alpha = set(ProtoReflectionDescriptorDatabase(ch).get_services())
        stub = pb2_grpc.ServerReflectionStub(ch)
        requests = [R(list_services="")]
        requests += [R(file_containing_symbol=name) for name in sorted(alpha)]
        requests += [R(file_by_filename="no/such.proto"), R(file_containing_symbol="no.Such"),
                     R(file_by_filename="proto/specwire/v1/extractor.proto")]
        responses = list(stub.ServerReflectionInfo(iter(requests), timeout=30))
    assert len(responses) == len(requests)
    listed = {s.name for s in responses[0].list_services_response.service}
    assert listed == alpha | {"grpc.reflection.v1.ServerReflection"}, (listed, alpha)
    assert "grpc.reflection.v1alpha.ServerReflection" in alpha
    for name, r in zip(sorted(alpha), responses[1:1 + len(alpha)]):
        assert r.original_request.file_containing_symbol == name
        pool = DescriptorPool()
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in r.file_descriptor_response.file_descriptor_proto]
        assert files, name
        for f in reversed(files):  # dependencies come after the file that needs them
            pool.Add(f)
        assert pool.FindServiceByName(name).methods, name
    for r in responses[-3:-1]:
        assert r.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0], r
    files = responses[-1].file_descriptor_response.file_descriptor_proto
    first = descriptor_pb2.FileDescriptorProto.FromString(files[0])
    assert first.name == "proto/specwire/v1/extractor.proto"
    assert {m.name for m in first.service[0].method} >= {"Extract", "Generate", "GetTensors"}


def test_health_is_not_serving_while_every_stream_slot_is_taken(server_factory, checkpoint):
    """--max_concurrent_streams=2 held by two streams (one of them never read): health says
    NOT_SERVING for the server and the Extractor service while nothing can be admitted, and
    SERVING again once a slot frees."""
    server = server_factory(checkpoint, args=("--max_concurrent_streams=2",))

    def status(ch, service: str) -> int:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10).status

    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.ExtractorStub(ch)
        held = []
        for i in range(2):
            call = stub.Generate(pb.GenerateRequest(
                prompts=[pb.SequenceInput(tokens=pb.TokenIds(ids=[1, 2, 3]))],
                max_new_tokens=100000, ignore_model_eos=True, request_id=f"held-{i}"), timeout=120)
            assert next(call).WhichOneof("message") == "contract"
            held.append(call)
        for service in ("", "specwire.v1.Extractor"):
            wait_for(lambda: status(ch, service) == health_pb2.HealthCheckResponse.NOT_SERVING,
                     10, f"health of {service!r} to say NOT_SERVING")
        held[0].cancel()
        for service in ("", "specwire.v1.Extractor"):
            wait_for(lambda: status(ch, service) == health_pb2.HealthCheckResponse.SERVING,
                     10, f"health of {service!r} to say SERVING again")
        held[1].cancel()


@pytest.mark.parametrize("method", ["Extract", "Generate"])
def test_a_request_that_is_not_the_message_is_invalid_argument(fp32_server, method):
    """Extract and Generate parse their own requests (raw methods, for the zero-copy chunks):
    bytes that are not the request message are INVALID_ARGUMENT naming the message type, and
    the server goes on serving."""
    with grpc.insecure_channel(fp32_server.address) as channel:
        call = channel.unary_stream(f"/specwire.v1.Extractor/{method}",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        for garbage in (b"\xff\xff\xff", b"\x0a\x05ab", bytes(range(256)) * 3):
            with pytest.raises(grpc.RpcError) as info:
                list(call(garbage, timeout=30))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
            assert f"request: not a valid specwire.v1.{method}Request message" in \
                info.value.details()
    with ExtractorClient(fp32_server.address, timeout=30) as c:
        assert c.extract([[1, 2, 3]], [0])[0]["layer.0"].shape[0] == 3
