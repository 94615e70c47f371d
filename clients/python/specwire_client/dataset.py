"""FeatureDataset: training features (hidden states) of a dataset of token sequences, streamed
from an extractor, sharded over torch.distributed ranks and DataLoader workers.

Each iterator runs one background thread that sends its shard's sequences in requests of
`sequences_per_request` and puts each request's finished items on a bounded queue
(`prefetch_depth` requests ahead of the consumer). A request is all or nothing: its items are
queued only once its whole stream arrived and checked, so a failed request is simply sent again
from the start of its batch, after an exponential backoff on a fresh channel (RetryPolicy). Hence
no item is ever yielded twice or skipped, whatever fails in between.

Sharding: an epoch's order is the dataset order, or with shuffle=True a permutation seeded by
(seed, epoch), the same on every rank. After skipping the first `start` samples of that order
(resumption), sample j of the rest goes to rank j % world_size, and within the rank to worker
(j // world_size) % workers: every sample exactly once per epoch over all ranks and workers, and
the ranks' counts differ by at most one whatever the worker count. A DataLoader interleaves its
workers round-robin, so one rank's items come out in its shard's order. Every item carries its
dataset index as "sample_index".

Resumption: a trainer whose every rank consumed n samples of an epoch restarts with
start = n × world_size, the same seed and epoch, and sees exactly the rest.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Union

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


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a failed request is tried again.

    max_retries: attempts after the first for one request before its error is raised.
    backoff_initial / backoff_multiplier / backoff_max: seconds before retry n is
        min(backoff_initial * backoff_multiplier ** (n - 1), backoff_max).
    codes: gRPC codes retried (UNAVAILABLE by default; add RESOURCE_EXHAUSTED to back off from
        a full extractor queue). An IncompleteStream (a stream that started and was cut: the
        server died, restarted, refused the request after its contract) is retried too, unless
        its code says the request itself is wrong (INVALID_ARGUMENT, ...).
    """

    max_retries: int = 5
    backoff_initial: float = 0.1
    backoff_multiplier: float = 2.0
    backoff_max: float = 5.0
    codes: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE})

    def __post_init__(self) -> None:
        object.__setattr__(self, "codes", frozenset(self.codes))
        if self.max_retries < 0:
            raise ValueError(f"RetryPolicy.max_retries: {self.max_retries} is negative")
        if self.backoff_initial < 0 or self.backoff_max < 0 or self.backoff_multiplier < 1:
            raise ValueError("RetryPolicy: backoffs must be >= 0 and backoff_multiplier >= 1")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        return min(self.backoff_initial * self.backoff_multiplier ** (retry - 1), self.backoff_max)

    def retryable(self, e: ExtractorError) -> bool:
        if e.code in self.codes:
            return True
        # A cut stream is retried, unless the server's status says the request itself is wrong.
        return isinstance(e, IncompleteStream) and e.code not in _PERMANENT


_LEGACY_RETRY = {"max_retries": "max_retries", "backoff_initial": "backoff_initial",
                 "backoff_multiplier": "backoff_multiplier", "backoff_max": "backoff_max",
                 "retry_codes": "codes"}


def _legacy_retry_policy(retry: RetryPolicy, given: Mapping[str, Any]) -> RetryPolicy:
    """The five retry arguments of earlier versions, folded into a RetryPolicy (deprecated)."""
    import warnings
    unknown = sorted(set(given) - set(_LEGACY_RETRY))
    if unknown:
        raise TypeError(f"FeatureDataset: unexpected keyword argument(s) {unknown}")
    if retry != RetryPolicy():
        raise TypeError("FeatureDataset: give retry=RetryPolicy(...) or the old retry "
                        f"arguments {sorted(given)}, not both")
    warnings.warn(f"FeatureDataset({', '.join(sorted(given))}=...) is deprecated: pass "
                  "retry=RetryPolicy(...)", DeprecationWarning, stacklevel=3)
    return dataclasses.replace(retry, **{_LEGACY_RETRY[k]: v for k, v in given.items()})


def _distributed_rank() -> tuple[int, int]:
    """(rank, world size) of torch.distributed when it is initialised, else (0, 1)."""
    try:
        import torch.distributed as dist
    except ImportError:  # a torch built without distributed
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class FeatureDataset(IterableDataset):
    """Yields {"input_ids": LongTensor [T], "hidden_states": {name: [T, H] tensor},
    "sample_index": int} per sequence of this rank's shard, in its epoch order (plus any other
    keys of dict items, passed through).

    target: where the extractor is ("host:port", a list, "dns:///..."); or give client_factory,
        a callable returning an ExtractorClient (called in each worker, and again on reconnect).
    sequences: a re-iterable collection (list, datasets.Dataset, ...) of token-id lists, 1-D
        tensors or dicts with "input_ids". A one-shot iterator works for a single epoch with
        num_workers <= 1 only.
    layer_ids, embedding, final_norm, dtype, max_chunk_bytes: as ExtractorClient.extract.
    sequences_per_request: sequences sent in one Extract request.
    prefetch_depth: finished requests kept ready ahead of the consumer (the queue bound).
    retry: a RetryPolicy (attempts, backoff, retried codes).
    expect: a ContractExpectation checked on every stream before its chunks are read.
    pin_contract: also require every later stream to come from the same target (architecture,
        num_layers, hidden_size, vocab_size, weights_digest) as the first one, so a server that
        is restarted on another checkpoint mid-epoch raises ContractMismatch.
    timeout: deadline of each request in seconds.
    security: TLS / client certificate / bearer token of every connection, reconnects included
        (a ChannelSecurity, e.g. ChannelSecurity.resolve(tls_ca=..., token_file=...)); None:
        plaintext, with the token from $SPECWIRE_AUTH_TOKEN(_FILE) when set.
    rank, world_size: this process's shard of the ranks (default: torch.distributed's when it
        is initialised at construction, else 0 of 1).
    shuffle, seed, epoch: a seeded per-epoch permutation, the same on every rank (set_epoch).
    start: samples of the epoch's order already consumed (resumption, see the module notes).
    """

    def __init__(self, target: Target | None, sequences: Iterable[Item],
                 layer_ids: Iterable[int] = (), *, embedding: bool = False,
                 final_norm: bool = False, dtype: Union[str, torch.dtype] = "bf16",
                 sequences_per_request: int = 8, prefetch_depth: int = 2,
                 retry: RetryPolicy = RetryPolicy(),
                 expect: ContractExpectation | None = None, pin_contract: bool = True,
                 timeout: float | None = None, max_chunk_bytes: int | None = None,
                 client_options: Mapping[str, Union[int, str]] | None = None,
                 security: ChannelSecurity | None = None,
                 client_factory: Callable[[], ExtractorClient] | None = None,
                 rank: int | None = None, world_size: int | None = None,
                 shuffle: bool = False, seed: int = 0, epoch: int = 0, start: int = 0,
                 **legacy_retry: Any) -> None:
        super().__init__()
        if legacy_retry:
            retry = _legacy_retry_policy(retry, legacy_retry)
        if target is None and client_factory is None:
            raise ValueError("give target or client_factory")
        if sequences_per_request < 1 or prefetch_depth < 1:
            raise ValueError("sequences_per_request and prefetch_depth must be >= 1")
        if not isinstance(retry, RetryPolicy):
            raise TypeError("retry: expected a RetryPolicy")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither (torch.distributed)")
        if rank is None:
            rank, world_size = _distributed_rank()
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if start < 0 or epoch < 0:
            raise ValueError("start and epoch must be >= 0")
        if (shuffle or start) and not isinstance(sequences, Sequence) and \
                not hasattr(sequences, "__getitem__"):
            raise TypeError("shuffle and start need an indexable dataset (a list, datasets.Dataset, "
                            "...), not a one-shot iterator")
        self.target = target
        self.sequences = sequences
        self.layer_ids = list(layer_ids)
        self.embedding = embedding
        self.final_norm = final_norm
        self.dtype = dtype
        self.sequences_per_request = sequences_per_request
        self.prefetch_depth = prefetch_depth
        self.retry = retry
        self.expect = expect
        self.pin_contract = pin_contract
        self.security = security
        self.timeout = timeout
        self.max_chunk_bytes = max_chunk_bytes
        self.client_options = dict(client_options or {})
        self.client_factory = client_factory
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.seed, self.epoch, self.start = shuffle, seed, epoch, start
        # Retries made so far by iterators of this object in this process (for tests and logs).
        self.retries = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The epoch to iterate next (its shuffle), from sample `start` of its order on. Call it
        before iterating, on every rank (DataLoader workers copy the dataset when an epoch's
        iteration starts)."""
        if epoch < 0 or start < 0:
            raise ValueError("epoch and start must be >= 0")
        self.epoch, self.start = epoch, start

    def epoch_order(self) -> list[int]:
        """The dataset indices of this epoch, in order, after `start` (the same on every rank)."""
        n = len(self.sequences)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed((self.seed * 1_000_003 + self.epoch) % (1 << 63))
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        return order[self.start:]

    def shard_indices(self, worker: int = 0, workers: int = 1) -> list[int]:
        """The dataset indices one worker of this rank yields this epoch."""
        return self.epoch_order()[self.rank::self.world_size][worker::workers]

    def __len__(self) -> int:
        """Samples this rank yields this epoch (all its workers)."""
        order = len(self.epoch_order())
        per = order // self.world_size
        return per + (1 if self.rank < order % self.world_size else 0)

    # --- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if isinstance(self.sequences, Sequence) or hasattr(self.sequences, "__getitem__"):
            try:
                indices = self.shard_indices(worker, workers)
            except TypeError:  # indexable but not sized
                indices = None
            if indices is not None:
                mine = ((i, self.sequences[i]) for i in indices)
                return self._iterate(mine)
        mine = ((i, item) for i, item in enumerate(self.sequences)
                if i % self.world_size == self.rank and (i // self.world_size) % workers == worker)
        return self._iterate(mine)

    def _iterate(self, items: Iterator[tuple[int, Item]]) -> Iterator[dict[str, Any]]:
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

    def _produce(self, items: Iterator[tuple[int, Item]], q: queue.Queue,
                 stop: threading.Event) -> None:
        state: dict[str, Any] = {"client": None, "pinned": None}
        try:
            batch: list[tuple[int, Item]] = []
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

    def _features(self, batch: list[tuple[int, Item]], state: dict[str, Any],
                  stop: threading.Event) -> list[dict[str, Any]]:
        inputs = [_input_of(item) for _, item in batch]
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
                if not self.retry.retryable(e) or attempt >= self.retry.max_retries:
                    raise
                attempt += 1
                self.retries += 1
                delay = self.retry.delay(attempt)
                # A fresh channel: it reconnects at once instead of after gRPC's own backoff.
                state["client"].close()
                state["client"] = None
                if stop.wait(delay):
                    raise _Stopped() from None
        if self.pin_contract and state["pinned"] is None:
            state["pinned"] = ContractExpectation.from_contract(res.contract)
        out = []
        for (index, item), seq in zip(batch, res.sequences):
            features: dict[str, Any] = dict(item) if isinstance(item, Mapping) else {}
            features["sample_index"] = index
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


def pad_collate(batch: Sequence[Mapping[str, Any]], pad_token_id: int = 0) -> dict[str, Any]:
    """A DataLoader collate_fn for FeatureDataset items of different lengths: right-padded

      input_ids       LongTensor [B, T] (pad_token_id after each sequence)
      attention_mask  LongTensor [B, T] (1 on real tokens)
      loss_mask       LongTensor [B, T] (an item's own "loss_mask" where it has one, else the
                      attention mask)
      hidden_states   {name: [B, T, H]} (zeros on padding, the items' dtype)
      sample_index    LongTensor [B]
    and every other key as a list. Use functools.partial(pad_collate, pad_token_id=...) for
    another pad id."""
    if not batch:
        raise ValueError("pad_collate: an empty batch")
    lengths = [int(item["input_ids"].numel()) for item in batch]
    B, T = len(batch), max(lengths)
    input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    loss = torch.zeros((B, T), dtype=torch.long)
    names = list(batch[0]["hidden_states"])
    states: dict[str, torch.Tensor] = {}
    for name in names:
        first = batch[0]["hidden_states"][name]
        states[name] = torch.zeros((B, T) + tuple(first.shape[1:]), dtype=first.dtype)
    rest: dict[str, list[Any]] = {}
    for b, (item, n) in enumerate(zip(batch, lengths)):
        input_ids[b, :n] = item["input_ids"].reshape(-1)
        attention[b, :n] = 1
        if item.get("loss_mask") is not None:
            mask = torch.as_tensor(item["loss_mask"], dtype=torch.long).reshape(-1)
            if mask.numel() != n:
                raise ValueError(f"pad_collate: item {b} has {mask.numel()} loss_mask entries for "
                                 f"{n} tokens")
            loss[b, :n] = mask
        else:
            loss[b, :n] = 1
        if list(item["hidden_states"]) != names:
            raise ValueError(f"pad_collate: item {b} has states {list(item['hidden_states'])}, "
                             f"item 0 has {names}")
        for name in names:
            states[name][b, :n] = item["hidden_states"][name]
        for key, value in item.items():
            if key not in ("input_ids", "hidden_states", "loss_mask", "sample_index"):
                rest.setdefault(key, []).append(value)
    out: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss,
                           "hidden_states": states}
    if all("sample_index" in item for item in batch):
        out["sample_index"] = torch.tensor([int(item["sample_index"]) for item in batch])
    out.update(rest)
    return out
