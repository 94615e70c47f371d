"""Errors of the specwire client. Every error is an ExtractorError, so `except ExtractorError`
catches them all; `code` is the gRPC status code where one applies."""
from __future__ import annotations

from typing import Any

import grpc


class ExtractorError(Exception):
    """A failed call: the server's gRPC status (code and details), or a client-side check."""

    def __init__(self, code: grpc.StatusCode | None, details: str, *, method: str = "") -> None:
        self.code = code
        self.details = details
        self.method = method
        where = f"{method}: " if method else ""
        name = code.name if code is not None else "CLIENT"
        super().__init__(f"{where}{name}: {details}")

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError, method: str = "") -> "ExtractorError":
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code, details or "", method=method)


class ContractMismatch(ExtractorError):
    """The extractor's contract differs from what the caller depends on (raised before any hidden
    state is consumed). `field`, `expected` and `actual` name the difference."""

    def __init__(self, field: str, expected: Any, actual: Any, *, note: str = "") -> None:
        self.field = field
        self.expected = expected
        self.actual = actual
        msg = f"contract mismatch on {field}: expected {expected!r}, extractor has {actual!r}"
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, msg + (f" ({note})" if note else ""))


class IncompleteStream(ExtractorError):
    """A stream that had started (its contract arrived) ended without its trailer: the server
    stopped or the call was cut, and what arrived must not be used. `code` is the gRPC status the
    call ended with, or None when it ended "OK" without a trailer (a server bug)."""

    def __init__(self, code: grpc.StatusCode | None, details: str, *, method: str = "",
                 received: str = "") -> None:
        self.received = received
        extra = f" (after {received})" if received else ""
        super().__init__(code, f"stream ended without a trailer{extra}: {details}", method=method)


class CorruptStream(ExtractorError):
    """A message broke the wire convention: crc32c mismatch, a chunk inconsistent with the
    contract or with the rows before it, an unexpected message."""

    def __init__(self, details: str, *, method: str = "") -> None:
        super().__init__(grpc.StatusCode.DATA_LOSS, details, method=method)
