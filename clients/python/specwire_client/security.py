"""Channel security of the clients: TLS / mTLS credentials and the bearer token.

The servers (specwire-extractor, specwire-scorer) take --tls_cert/--tls_key (TLS),
--tls_client_ca (mTLS: a client certificate signed by that CA is required) and --auth_token_file
(every call must carry "authorization: Bearer <token>"; grpc.health.v1 stays open by default).

The token is added to every call by a channel interceptor rather than call credentials, because
gRPC refuses call credentials on a plaintext channel and loopback deployments use plaintext.
Without an explicit token, SPECWIRE_AUTH_TOKEN, then the file named by SPECWIRE_AUTH_TOKEN_FILE,
is used.
"""
from __future__ import annotations

import collections
import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence, Union

import grpc

PathLike = Union[str, os.PathLike]
PemLike = Union[bytes, PathLike, None]


def read_token_file(path: PathLike) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ValueError(f"token file {str(path)!r}: cannot read ({e.strerror})") from None
    if not token:
        raise ValueError(f"token file {str(path)!r}: empty")
    return token


def _pem(value: PemLike, field: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    try:
        data = Path(value).read_bytes()
    except OSError as e:
        raise ValueError(f"{field}: cannot read {str(value)!r} ({e.strerror})") from None
    if not data:
        raise ValueError(f"{field}: {str(value)!r} is empty")
    return data


@dataclasses.dataclass(frozen=True)
class ChannelSecurity:
    """What a client channel needs: TLS material (PEM bytes) and the token, already read.

    Build it with `ChannelSecurity.resolve(...)` (paths or bytes, token from the environment
    when none is given)."""
    tls: bool = False
    ca: bytes | None = None
    client_cert: bytes | None = None
    client_key: bytes | None = dataclasses.field(default=None, repr=False)  # secrets stay
    server_name: str | None = None                                          # out of logs
    token: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def resolve(cls, *, tls: bool = False, tls_ca: PemLike = None,
                tls_client_cert: PemLike = None, tls_client_key: PemLike = None,
                tls_server_name: str | None = None, token: str | None = None,
                token_file: PathLike | None = None) -> "ChannelSecurity":
        if (tls_client_cert is None) != (tls_client_key is None):
            raise ValueError("tls_client_cert and tls_client_key go together")
        if token is not None and token_file is not None:
            raise ValueError("give token or token_file, not both")
        if token_file is not None:
            token = read_token_file(token_file)
        elif token is None:
            token = os.environ.get("SPECWIRE_AUTH_TOKEN", "").strip() or None
            if token is None and os.environ.get("SPECWIRE_AUTH_TOKEN_FILE"):
                token = read_token_file(os.environ["SPECWIRE_AUTH_TOKEN_FILE"])
        elif not token.strip():
            raise ValueError("token: empty")
        return cls(
            tls=bool(tls or tls_ca is not None or tls_client_cert is not None),
            ca=_pem(tls_ca, "tls_ca"), client_cert=_pem(tls_client_cert, "tls_client_cert"),
            client_key=_pem(tls_client_key, "tls_client_key"), server_name=tls_server_name,
            token=token.strip() if token else None)


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):
    pass


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d: grpc.ClientCallDetails) -> _CallDetails:
        metadata = [m for m in (d.metadata or ()) if m[0] != "authorization"]
        metadata.append(self._header)
        return _CallDetails(d.method, d.timeout, metadata, d.credentials,
                            getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def make_channel(target: str, options: Sequence[tuple[str, Any]],
                 security: ChannelSecurity | None) -> grpc.Channel:
    """A channel to `target`: TLS when security.tls, the token on every call when given."""
    security = security or ChannelSecurity()
    opts = list(options)
    if security.tls:
        if security.server_name:
            opts.append(("grpc.ssl_target_name_override", security.server_name))
        creds = grpc.ssl_channel_credentials(root_certificates=security.ca,
                                             private_key=security.client_key,
                                             certificate_chain=security.client_cert)
        channel = grpc.secure_channel(target, creds, options=opts)
    else:
        channel = grpc.insecure_channel(target, options=opts)
    if security.token:
        channel = grpc.intercept_channel(channel, _TokenInterceptor(security.token))
    return channel
