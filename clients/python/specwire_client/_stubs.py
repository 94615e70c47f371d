"""The generated protobuf / gRPC modules (made by setup.py at build time)."""
from __future__ import annotations

try:
    from ._generated.proto.specwire.v1 import extractor_pb2 as pb
    from ._generated.proto.specwire.v1 import extractor_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - a broken install
    raise ImportError(
        "specwire_client: the generated gRPC stubs are missing; install the package with pip "
        "(`pip install clients/python` or `pip install -e clients/python` from the repository "
        "root), which runs protoc on proto/specwire/v1/*.proto") from e

__all__ = ["pb", "pb_grpc"]
