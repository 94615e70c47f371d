"""FeatureDataset: training features (hidden states) of a dataset of token sequences, streamed
from an extractor.

Each iterator runs one background thread that sends the dataset's sequences in requests of
`sequences_per_request`, in dataset order, and puts each request's finished items on a bounded
queue (`prefetch_depth` requests ahead of the consumer). A request is all or nothing: its items
are queued only once its whole stream arrived and checked, so a failed request is simply sent
again from the start of its batch, after an exponential backoff on a fresh channel. Hence no item
is ever yielded twice or skipped, whatever fails in between.

Under DataLoader(num_workers=W) the worker with id w takes the items i with i % W == w; with
batch_size=None the DataLoader interleaves its workers round-robin, so items come out in dataset
order.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .client import ExtractorClient, StreamResult, Target
from .contract import ContractExpectation
from .errors import ExtractorError, IncompleteStream
from .security import ChannelSecurity

# A dataset item: a list of token ids, a 1-D tensor, or a dict with "input_ids" (whose other keys
# pass through to the features).
Item = Any

# Codes that no retry can fix.
_PERMANENT = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED})


class _Stopped(Exception):
    """The consumer went away; the producer thread ends quietly."""


class FeatureDataset(IterableDataset):
    """Yields {"input_ids": LongTensor [T], "hidden_states": {name: [T, H] tensor}} per sequence,
    in dataset order (plus any other keys of dict items, passed through).

    target: where the extractor is ("host:port", a list, "dns:///..."); or give client_factory,
        a callable returning an ExtractorClient (called in each worker, and again on reconnect).
    sequences: a re-iterable collection (list, datasets.Dataset, ...) of token-id lists, 1-D
        tensors or dicts with "input_ids". A one-shot iterator works for a single epoch with
        num_workers <= 1 only.
    layer_ids, embedding, final_norm, dtype, max_chunk_bytes: as ExtractorClient.extract.
    sequences_per_request: sequences sent in one Extract request.
    prefetch_depth: finished requests kept ready ahead of the consumer (the queue bound).
    max_retries: attempts after the first for one request before its error is raised.
    backoff_initial / backoff_multiplier / backoff_max: seconds before retry n is
        min(backoff_initial * backoff_multiplier ** (n - 1), backoff_max).
    retry_codes: gRPC codes retried (UNAVAILABLE by default; add RESOURCE_EXHAUSTED to back off
        from a full extractor queue). An IncompleteStream (a stream that started and was cut:
        the server died, restarted, refused the request after its contract) is retried too,
        unless its code says the request itself is wrong (INVALID_ARGUMENT, ...).
    expect: a ContractExpectation checked on every stream before its chunks are read.
    pin_contract: also require every later stream to come from the same target (architecture,
        num_layers, hidden_size, vocab_size, weights_digest) as the first one, so a server that
        is restarted on another checkpoint mid-epoch raises ContractMismatch.
    timeout: deadline of each request in seconds.
    security: TLS / client certificate / bearer token of every connection, reconnects included
        (a ChannelSecurity, e.g. ChannelSecurity.resolve(tls_ca=..., token_file=...)); None:
        plaintext, with the token from $SPECWIRE_AUTH_TOKEN(_FILE) when set.
    """

    def __init__(self, target: Target | None, sequences: Iterable[Item],
                 layer_ids: Iterable[int] = (), *, embedding: bool = False,
                 final_norm: bool = False, dtype: Any = "bf16", sequences_per_request: int = 8,
                 prefetch_depth: int = 2, max_retries: int = 5, backoff_initial: float = 0.1,
                 backoff_multiplier: float = 2.0, backoff_max: float = 5.0,
                 retry_codes: Iterable[grpc.StatusCode] = (grpc.StatusCode.UNAVAILABLE,),
                 expect: ContractExpectation | None = None, pin_contract: bool = True,
                 timeout: float | None = None, max_chunk_bytes: int | None = None,
                 client_options: Mapping[str, Any] | None = None,
                 security: ChannelSecurity | None = None,
                 client_factory: Callable[[], ExtractorClient] | None = None) -> None:
        super().__init__()
        if target is None and client_factory is None:
            raise ValueError("give target or client_factory")
        if sequences_per_request < 1 or prefetch_depth < 1 or max_retries < 0:
            raise ValueError("sequences_per_request and prefetch_depth must be >= 1, "
                             "max_retries >= 0")
        self.target = target
        self.sequences = sequences
        self.layer_ids = list(layer_ids)
        self.embedding = embedding
        self.final_norm = final_norm
        self.dtype = dtype
        self.sequences_per_request = sequences_per_request
        self.prefetch_depth = prefetch_depth
        self.max_retries = max_retries
        self.backoff_initial = backoff_initial
        self.backoff_multiplier = backoff_multiplier
        self.backoff_max = backoff_max
        self.retry_codes = frozenset(retry_codes)
        self.expect = expect
        self.pin_contract = pin_contract
        self.security = security
        self.timeout = timeout
        self.max_chunk_bytes = max_chunk_bytes
        self.client_options = dict(client_options or {})
        self.client_factory = client_factory
        # Retries made so far by iterators of this object in this process (for tests and logs).
        self.retries = 0

    # --- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = (item for i, item in enumerate(self.sequences) if i % workers == worker)
        return self._iterate(mine)

    def _iterate(self, items: Iterator[Item]) -> Iterator[dict[str, Any]]:
        q: queue.Queue = queue.Queue(maxsize=self.prefetch_depth)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(items, q, stop), daemon=True,
                                  name="specwire-feature-prefetch")
        thread.start()
        try:
            while True:
                kind, value = q.get()
                if kind == "items":
                    yield from value
                elif kind == "done":
                    return
                else:
                    raise value
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.05)

    @staticmethod
    def _put(q: queue.Queue, stop: threading.Event, entry: tuple[str, Any]) -> None:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stopped()

    def _produce(self, items: Iterator[Item], q: queue.Queue, stop: threading.Event) -> None:
        state: dict[str, Any] = {"client": None, "pinned": None}
        try:
            batch: list[Item] = []
            for item in items:
                batch.append(item)
                if len(batch) == self.sequences_per_request:
                    self._put(q, stop, ("items", self._features(batch, state, stop)))
                    batch = []
            if batch:
                self._put(q, stop, ("items", self._features(batch, state, stop)))
            self._put(q, stop, ("done", None))
        except _Stopped:
            pass
        except BaseException as e:  # handed to the consumer, raised there
            try:
                self._put(q, stop, ("error", e))
            except _Stopped:
                pass
        finally:
            if state["client"] is not None:
                state["client"].close()

    # --- one request, with retries ---------------------------------------------------------------

    def _make_client(self) -> ExtractorClient:
        if self.client_factory is not None:
            return self.client_factory()
        return ExtractorClient(self.target, timeout=self.timeout, options=self.client_options,
                               security=self.security)

    def _retryable(self, e: ExtractorError) -> bool:
        if e.code in self.retry_codes:
            return True
        # A cut stream is retried, unless the server's status says the request itself is wrong.
        return isinstance(e, IncompleteStream) and e.code not in _PERMANENT

    def _features(self, batch: list[Item], state: dict[str, Any],
                  stop: threading.Event) -> list[dict[str, Any]]:
        inputs = [_input_of(item) for item in batch]
        attempt = 0
        while True:
            if stop.is_set():
                raise _Stopped()
            try:
                if state["client"] is None:
                    state["client"] = self._make_client()
                expect = [e for e in (self.expect, state["pinned"]) if e is not None]
                res: StreamResult = state["client"].extract_stream(
                    inputs, self.layer_ids, embedding=self.embedding,
                    final_norm=self.final_norm, dtype=self.dtype,
                    max_chunk_bytes=self.max_chunk_bytes, expect=expect, timeout=self.timeout)
                break
            except ExtractorError as e:
                if not self._retryable(e) or attempt >= self.max_retries:
                    raise
                attempt += 1
                self.retries += 1
                delay = min(self.backoff_initial * self.backoff_multiplier ** (attempt - 1),
                            self.backoff_max)
                # A fresh channel: it reconnects at once instead of after gRPC's own backoff.
                state["client"].close()
                state["client"] = None
                if stop.wait(delay):
                    raise _Stopped() from None
        if self.pin_contract and state["pinned"] is None:
            state["pinned"] = ContractExpectation.from_contract(res.contract)
        out = []
        for item, seq in zip(batch, res.sequences):
            features: dict[str, Any] = dict(item) if isinstance(item, Mapping) else {}
            features["input_ids"] = torch.tensor(seq.token_ids, dtype=torch.long)
            features["hidden_states"] = dict(seq)
            out.append(features)
        return out


def _input_of(item: Item) -> Any:
    """What to send for one dataset item: its token ids (or text)."""
    if isinstance(item, Mapping):
        item = item["input_ids"]
    if isinstance(item, str):
        return item
    if isinstance(item, torch.Tensor):
        return item.reshape(-1).tolist()
    if isinstance(item, Sequence) or hasattr(item, "tolist"):
        return [int(t) for t in (item.tolist() if hasattr(item, "tolist") else item)]
    raise TypeError(f"dataset item: expected token ids or a dict with 'input_ids', got "
                    f"{type(item).__name__}")
