"""ExtractorClient: the specwire.v1.Extractor API with every stream checked and rebuilt.

Each streaming call is consumed completely and checked before anything is returned:
  1. the first message is the ExtractionContract; an `expect` is checked against it before any
     chunk is read (ContractMismatch);
  2. every chunk's crc32c, dtype, hidden_size, hf_hidden_states_index and row range are checked
     (CorruptStream) and its rows copied into place;
  3. the stream must end with its trailer, and the trailer's counts must match what arrived
     (IncompleteStream / CorruptStream).
gRPC failures become ExtractorError (code and details of the server's status).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Union

import grpc
import torch

from ._assembly import WIRE_DTYPES, StateAssembler, tensor_from_le_bytes
from ._stubs import pb, pb_grpc
from .contract import Contract, ContractExpectation
from .crc32c import crc32c
from ._request import SequenceLike, StatesAsk, states_ask
from .errors import CorruptStream, ExtractorError, IncompleteStream
from .security import ChannelSecurity, PemLike, make_channel
from .session import LiveSession

try:
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - the digest check is skipped without it
    _xxhash = None

Target = Union[str, Sequence[str]]
# One expectation, or several (all checked).
Expectations = Union[ContractExpectation, Sequence[ContractExpectation], None]

# Responses carry chunks of up to the server's --max_chunk_bytes (4 MiB by default) plus framing,
# over gRPC's 4 MiB default receive limit.
DEFAULT_OPTIONS: dict[str, Any] = {
    "grpc.max_receive_message_length": 256 << 20,
    "grpc.max_send_message_length": 64 << 20,
    # Reconnect soon after a restarted server comes back (gRPC's default starts at 1 s). Not
    # grpc.min_reconnect_backoff_ms: gRPC also uses it as each connection attempt's timeout.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 2000,
}

_UNSET: Any = object()


class SequenceStates(dict):
    """{state name: [T, H] tensor} of one sequence, plus the token ids the server ran
    (`token_ids`, useful for text inputs)."""

    token_ids: list[int]

    def __init__(self, states: Mapping[str, torch.Tensor], token_ids: list[int]) -> None:
        super().__init__(states)
        self.token_ids = token_ids


@dataclasses.dataclass
class GenerateResult:
    """A greedy completion and the states of every position of prompt + completion."""

    sequence_index: int
    prompt_ids: list[int]
    completion_ids: list[int]  # includes the stop token when one stopped it
    finish_reason: str  # "stop_token" | "max_new_tokens"
    states: dict[str, torch.Tensor] = dataclasses.field(repr=False)  # each [P + C, H]

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


@dataclasses.dataclass
class StreamResult:
    """What an Extract stream delivered, with the contract it was produced under."""

    contract: Contract
    sequences: list[SequenceStates]
    trailer: Any  # specwire.v1.StreamTrailer


def channel_target(target: Target) -> tuple[str, bool]:
    """(gRPC target string, whether to balance round-robin over several addresses).

    "host:port" is used as is; "dns:///name:port" (or any "scheme:" target) resolves every
    address of the name and balances over them; a list of "host:port" becomes one
    "ipv4:a:p,b:p" (or "ipv6:") target, host names resolved here.
    """
    if isinstance(target, str):
        if target.startswith(("dns:", "ipv4:", "ipv6:", "unix:")):
            return target, True
        if "," not in target:
            return target, False
        target = [t.strip() for t in target.split(",") if t.strip()]
    addrs = list(target)
    if not addrs:
        raise ValueError("target: an empty list of addresses")
    v4: list[str] = []
    v6: list[str] = []
    for addr in addrs:
        host, sep, port = addr.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"target {addr!r}: expected host:port")
        host = host.strip("[]")
        try:
            ips = [ipaddress.ip_address(host)]
        except ValueError:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            ips = [ipaddress.ip_address(i[4][0]) for i in infos]
        for ip in dict.fromkeys(ips):
            (v4 if ip.version == 4 else v6).append(
                f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}")
    if v4 and v6:
        raise ValueError(f"target {addrs}: mixes IPv4 and IPv6 addresses, which one gRPC "
                         "target cannot hold")
    return ("ipv4:" + ",".join(v4)) if v4 else ("ipv6:" + ",".join(v6)), True


class ExtractorClient:
    """A client of one extractor (or of several, balanced round-robin).

    target: "host:port", a list of "host:port" addresses, or "dns:///name:port".
    timeout: default deadline of every call in seconds (None: none); each method takes
        `timeout=` to override it.
    options: gRPC channel options added to (and overriding) DEFAULT_OPTIONS.
    tls, tls_ca, tls_client_cert, tls_client_key, tls_server_name: TLS (on when tls or a CA or
        client certificate is given; PEM paths or bytes; no CA: the system roots), mTLS with a
        client certificate + key, and the name to check the server's certificate against.
    token / token_file: bearer token sent with every call; neither: $SPECWIRE_AUTH_TOKEN, else
        the file named by $SPECWIRE_AUTH_TOKEN_FILE, else none.
    security: a ready ChannelSecurity instead of the keywords above.
    """

    def __init__(self, target: Target, *, timeout: float | None = None,
                 options: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
                 tls: bool = False, tls_ca: PemLike = None, tls_client_cert: PemLike = None,
                 tls_client_key: PemLike = None, tls_server_name: str | None = None,
                 token: str | None = None, token_file: Any = None,
                 security: ChannelSecurity | None = None) -> None:
        self.target, balanced = channel_target(target)
        self.timeout = timeout
        opts = dict(DEFAULT_OPTIONS)
        if balanced:
            opts["grpc.lb_policy_name"] = "round_robin"
        opts.update(dict(options.items() if isinstance(options, Mapping) else options or ()))
        self.options = opts
        if security is None:
            security = ChannelSecurity.resolve(
                tls=tls, tls_ca=tls_ca, tls_client_cert=tls_client_cert,
                tls_client_key=tls_client_key, tls_server_name=tls_server_name, token=token,
                token_file=token_file)
        self.security = security
        self._channel = make_channel(self.target, list(opts.items()), security)
        self.stub = pb_grpc.ExtractorStub(self._channel)  # the raw API

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "ExtractorClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel is connected (ExtractorError UNAVAILABLE after timeout)."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise ExtractorError(grpc.StatusCode.UNAVAILABLE,
                                 f"{self.target} not ready after {timeout} s") from None

    def _timeout(self, timeout: Any) -> float | None:
        return self.timeout if timeout is _UNSET else timeout

    # --- unary calls ---------------------------------------------------------------------------

    def model_info(self, *, timeout: float | None = _UNSET) -> Contract:
        try:
            msg = self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise ExtractorError.from_rpc_error(e, "GetModelInfo") from None
        return Contract.from_proto(msg)

    def check_contract(self, expect: ContractExpectation, *,
                       timeout: float | None = _UNSET) -> Contract:
        """The server's contract, after checking `expect` against it (ContractMismatch)."""
        contract = self.model_info(timeout=timeout)
        expect.check(contract)
        return contract

    def tokenize(self, texts: str | Sequence[str], *, add_special_tokens: bool = False,
                 timeout: float | None = _UNSET) -> list[list[int]]:
        """Token ids of each text (a single str counts as a list of one)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        req = pb.TokenizeRequest(texts=texts, add_special_tokens=add_special_tokens)
        try:
            resp = self.stub.Tokenize(req, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise ExtractorError.from_rpc_error(e, "Tokenize") from None
        return [list(s.ids) for s in resp.sequences]

    def detokenize(self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool = False,
                   timeout: float | None = _UNSET) -> list[str]:
        req = pb.DetokenizeRequest(sequences=[pb.TokenIds(ids=[int(t) for t in s])
                                              for s in sequences],
                                   skip_special_tokens=skip_special_tokens)
        try:
            resp = self.stub.Detokenize(req, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise ExtractorError.from_rpc_error(e, "Detokenize") from None
        return list(resp.texts)

    # --- streams -------------------------------------------------------------------------------

    def _stream(self, method: str, call: Any) -> Iterator[Any]:
        """The messages of a streaming call; gRPC errors become ExtractorError, or
        IncompleteStream once the stream has started (its first message arrived)."""
        started = False
        try:
            for msg in call:
                started = True
                yield msg
        except grpc.RpcError as e:
            if started:
                raise IncompleteStream(e.code(), e.details() or "", method=method) from None
            raise ExtractorError.from_rpc_error(e, method) from None
        finally:
            call.cancel()  # no-op when the call finished; stops the server when we bail out

    def _read_contract(self, method: str, stream: Iterator[Any], expect: Expectations) -> Contract:
        try:
            first = next(stream)
        except StopIteration:
            raise IncompleteStream(None, "the stream was empty (no contract)",
                                   method=method) from None
        if first.WhichOneof("message") != "contract":
            raise CorruptStream(f"the stream started with {first.WhichOneof('message')}, not the "
                                "contract", method=method)
        contract = Contract.from_proto(first.contract)
        for e in (expect if isinstance(expect, (list, tuple)) else [expect]):
            if e is not None:
                e.check(contract)  # before any chunk is read
        return contract

    @staticmethod
    def _check_trailer(method: str, trailer: Any, request_id: str, sequences: int,
                       asm: StateAssembler) -> None:
        problems = []
        if trailer.request_id != request_id:
            problems.append(f"request_id {trailer.request_id!r} != {request_id!r}")
        if trailer.sequences != sequences:
            problems.append(f"sequences {trailer.sequences} != {sequences}")
        if trailer.chunks != asm.chunks:
            problems.append(f"chunks {trailer.chunks} != {asm.chunks} received")
        if trailer.bytes != asm.bytes:
            problems.append(f"bytes {trailer.bytes} != {asm.bytes} received")
        missing = asm.missing()
        if missing:
            problems.append("incomplete states: " + "; ".join(missing[:5]))
        if problems:
            raise CorruptStream("trailer disagrees with the stream: " + ", ".join(problems),
                                method=method)

    def _states_stream(self, method: str, call: Any, expect: Expectations, ask: StatesAsk,
                       per_sequence: str, on_sequence: Callable[[Any], tuple[int, int]]
                       ) -> tuple[Contract, StateAssembler, list[Any], Any]:
        """Reads a states stream (Extract's, Generate's): the contract first (checked against
        `expect`), then chunks and one `per_sequence` message per input (on_sequence checks it
        and gives (index, states length)), then the trailer, checked against what arrived.
        Returns the contract, the assembled states, each input's message and the trailer."""
        stream = self._stream(method, call)
        try:
            contract = self._read_contract(method, stream, expect)
            asm = StateAssembler(contract, len(ask.inputs), ask.names, ask.wire,
                                 ask.max_chunk_bytes, method)
            messages: list[Any] = [None] * len(ask.inputs)
            trailer = None
            received = 0
            for msg in stream:
                kind = msg.WhichOneof("message")
                if trailer is not None:
                    raise CorruptStream(f"a {kind} message after the trailer", method=method)
                received += 1
                if kind == "chunk":
                    asm.add(msg.chunk)
                elif kind == per_sequence:
                    part = getattr(msg, kind)
                    i, length = on_sequence(part)
                    asm.set_length(i, length)
                    messages[i] = part
                elif kind == "trailer":
                    trailer = msg.trailer
                else:
                    raise CorruptStream(f"unexpected {kind} message", method=method)
            if trailer is None:
                raise IncompleteStream(None, "the call ended OK", method=method,
                                       received=f"{received} messages")
            self._check_trailer(method, trailer, ask.request_id, len(ask.inputs), asm)
        finally:
            stream.close()
        return contract, asm, messages, trailer

    def extract_stream(self, sequences: Sequence[SequenceLike], layer_ids: Iterable[int] = (), *,
                       embedding: bool = False, final_norm: bool = False, dtype: Any = "bf16",
                       max_chunk_bytes: int | None = None,
                       expect: Expectations = None, request_id: str | None = None,
                       add_special_tokens: bool = False,
                       timeout: float | None = _UNSET) -> StreamResult:
        """extract(), returning the contract and trailer beside the states."""
        method = "Extract"
        ask = states_ask(sequences, "sequences", layer_ids, embedding, final_norm, dtype,
                         max_chunk_bytes, request_id, add_special_tokens)
        inputs = ask.inputs
        req = pb.ExtractRequest(**ask.fields("sequences"))

        def on_sequence(seq: Any) -> tuple[int, int]:
            i = seq.sequence_index
            sent = inputs[i]
            if sent.HasField("tokens") and list(seq.token_ids) != list(sent.tokens.ids):
                raise CorruptStream(f"sequence {i}: the server ran other token ids than were "
                                    "sent", method=method)
            return i, len(seq.token_ids)

        contract, asm, seqs, trailer = self._states_stream(
            method, self.stub.Extract(req, timeout=self._timeout(timeout)), expect, ask,
            "sequence", on_sequence)
        out = [SequenceStates(asm.tensors(i), list(seqs[i].token_ids) if seqs[i] else [])
               for i in range(len(inputs))]
        return StreamResult(contract, out, trailer)

    def extract(self, sequences: Sequence[SequenceLike], layer_ids: Iterable[int] = (), *,
                embedding: bool = False, final_norm: bool = False, dtype: Any = "bf16",
                max_chunk_bytes: int | None = None, expect: Expectations = None,
                request_id: str | None = None, add_special_tokens: bool = False,
                timeout: float | None = _UNSET) -> list[SequenceStates]:
        """Hidden states of each sequence: a list (one per sequence, in order) of
        {"layer.k" | "embedding" | "final_norm": [T, H] tensor}, bfloat16 for dtype="bf16" and
        float32 for "fp32". layer.k is the output of decoder layer k (HF hidden_states[k+1]).
        `sequences` are token-id lists or texts (tokenized by the server)."""
        return self.extract_stream(
            sequences, layer_ids, embedding=embedding, final_norm=final_norm, dtype=dtype,
            max_chunk_bytes=max_chunk_bytes, expect=expect, request_id=request_id,
            add_special_tokens=add_special_tokens, timeout=timeout).sequences

    def generate(self, prompts: Sequence[SequenceLike], max_new_tokens: int, *,
                 stop_token_ids: Iterable[int] = (), ignore_model_eos: bool = False,
                 layer_ids: Iterable[int] = (), final_norm: bool = False, embedding: bool = False,
                 dtype: Any = "bf16", max_chunk_bytes: int | None = None,
                 expect: Expectations = None, request_id: str | None = None,
                 add_special_tokens: bool = False,
                 timeout: float | None = _UNSET) -> list[GenerateResult]:
        """Greedy completions of each prompt and (when layers are asked for) the states of every
        position of prompt + completion."""
        method = "Generate"
        ask = states_ask(prompts, "prompts", layer_ids, embedding, final_norm, dtype,
                         max_chunk_bytes, request_id, add_special_tokens)
        inputs = ask.inputs
        req = pb.GenerateRequest(
            **ask.fields("prompts"), max_new_tokens=max_new_tokens,
            stop_token_ids=[int(t) for t in stop_token_ids], ignore_model_eos=ignore_model_eos)

        def on_completion(c: Any) -> tuple[int, int]:
            i = c.sequence_index
            sent = inputs[i]
            if sent.HasField("tokens") and list(c.prompt_token_ids) != list(sent.tokens.ids):
                raise CorruptStream(f"completion {i}: prompt ids differ from those sent",
                                    method=method)
            return i, len(c.prompt_token_ids) + len(c.completion_token_ids)

        _, asm, completions, _ = self._states_stream(
            method, self.stub.Generate(req, timeout=self._timeout(timeout)), expect, ask,
            "completion", on_completion)
        return [GenerateResult(i, list(c.prompt_token_ids), list(c.completion_token_ids),
                               c.finish_reason, asm.tensors(i))
                for i, c in enumerate(completions)]

    def session(self, prompt: SequenceLike, layer_ids: Iterable[int] = (), **kwargs: Any) -> Any:
        """Opens a live verification session (specwire_client.session.LiveSession): the prompt
        is prefilled and the first token drawn. Keywords: embedding, final_norm, dtype,
        max_new_tokens, max_draft_tokens, temperature, top_p, top_k, seed, add_special_tokens,
        timeout (the whole session's deadline), request_id."""
        kwargs.setdefault("timeout", self.timeout)
        return LiveSession(self, prompt, layer_ids, **kwargs)

    def get_tensors(self, names: Sequence[str], *, max_chunk_bytes: int | None = None,
                    timeout: float | None = _UNSET) -> dict[str, torch.Tensor]:
        """Named target tensors in their stored dtype. Every chunk's crc32c is checked, and the
        xxh3-128 digest of each whole tensor when the `xxhash` package is installed."""
        method = "GetTensors"
        if isinstance(names, str):
            names = [names]
        req = pb.GetTensorsRequest(names=list(names), max_chunk_bytes=max_chunk_bytes or 0)
        stream = self._stream(method, self.stub.GetTensors(req, timeout=self._timeout(timeout)))
        bufs: dict[str, tuple[Any, bytearray]] = {}  # name -> (first chunk, bytes)
        done: dict[str, torch.Tensor] = {}
        try:
            for m in stream:
                where = f"tensor {m.name!r}"
                if m.dtype not in WIRE_DTYPES:
                    raise CorruptStream(f"{where}: unknown dtype {m.dtype}", method=method)
                itemsize = WIRE_DTYPES[m.dtype][1]
                numel = 1
                for d in m.shape:
                    numel *= d
                if m.total_bytes != numel * itemsize:
                    raise CorruptStream(f"{where}: total_bytes {m.total_bytes} != shape "
                                        f"{list(m.shape)} x {itemsize} bytes", method=method)
                if m.offset == 0:
                    if m.name in bufs:
                        raise CorruptStream(f"{where}: restarted before it was complete",
                                            method=method)
                    bufs[m.name] = (m, bytearray())
                elif m.name not in bufs:
                    raise CorruptStream(f"{where}: first chunk at offset {m.offset}", method=method)
                first, buf = bufs[m.name]
                if (list(m.shape) != list(first.shape) or m.dtype != first.dtype
                        or m.total_bytes != first.total_bytes or m.digest != first.digest):
                    raise CorruptStream(f"{where}: shape/dtype/size/digest changed between "
                                        "chunks", method=method)
                if m.offset != len(buf) or m.offset + len(m.data) > m.total_bytes:
                    raise CorruptStream(f"{where}: chunk at offset {m.offset} (+{len(m.data)}), "
                                        f"expected {len(buf)} of {m.total_bytes}", method=method)
                got = crc32c(m.data)
                if got != m.crc32c:
                    raise CorruptStream(f"{where} offset {m.offset}: crc32c {got:#010x} != "
                                        f"{m.crc32c:#010x} sent", method=method)
                buf += m.data
                if len(buf) == m.total_bytes:
                    self._check_digest(method, m.name, m.digest, buf)
                    done[m.name] = tensor_from_le_bytes(buf, m.dtype, tuple(m.shape))
                    del bufs[m.name]
        finally:
            stream.close()
        missing = [n for n in names if n not in done]
        if missing or bufs:
            raise IncompleteStream(None, f"tensors not (fully) received: {missing}",
                                   method=method)
        return {n: done[n] for n in names}

    @staticmethod
    def _check_digest(method: str, name: str, digest: str, data: bytearray) -> None:
        if _xxhash is None or not digest.startswith("xxh3-128:"):
            return
        got = "xxh3-128:" + _xxhash.xxh3_128(bytes(data)).hexdigest()
        if got != digest:
            raise CorruptStream(f"tensor {name!r}: digest {got} != {digest} sent", method=method)
