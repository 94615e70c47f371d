"""LiveSession: the Extractor's Session method, the target's half of the real speculative loop.

    with client.session(prompt_ids, layer_ids=[1, 3], temperature=0.8, seed=7) as s:
        s.next_token                      # the pending token (drawn at open)
        s.prompt_states["layer.1"]        # [P, hidden] the drafter's first context
        v = s.verify([d1, d2, d3])        # accepted count, next token, the block's states
        s.commit(v.accepted)              # keep the accepted drafts (the rest is rolled back)

The contract (rules, draws, rollback) is commented in proto/specwire/v1/extractor.proto. A refused
verify or commit raises ExtractorError with the server's code and message, and the session goes
on unchanged; anything else ends it.
"""
from __future__ import annotations

import dataclasses
import queue
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
import numpy as np
import torch

from ._assembly import StateAssembler, state_name
from ._request import sequence_input, state_names, wire_dtype
from ._stubs import pb
from .errors import CorruptStream, ExtractorError

_RULES = {"argmax_draft": pb.RULE_ARGMAX_DRAFT, "draft_distribution": pb.RULE_DRAFT_DISTRIBUTION}


@dataclasses.dataclass
class Verified:
    position: int                # of the block's first row (the pending token)
    accepted: int                # drafted tokens accepted
    accepted_tokens: list[int]
    path: list[int]              # trees: the accepted nodes
    next_token: int              # the correction or the bonus token
    target_argmax: list[int]     # the target's argmax after each row verification ran
    rule: str
    states: dict[str, torch.Tensor]  # [rows, hidden] of the rows verification ran
    committed: "Committed | None" = None  # with verify(..., commit=True)


@dataclasses.dataclass
class Committed:
    tokens: int           # prompt + committed completion tokens
    next_token: int       # the pending token
    rollback_tokens: int  # tokens the server ran again for this commit


class LiveSession:
    """One session on one stream (use ExtractorClient.session to open it)."""

    def __init__(self, client: Any, prompt: Any, layer_ids: Iterable[int] = (), *,
                 embedding: bool = False, final_norm: bool = False, dtype: Any = "bf16",
                 max_new_tokens: int = 256, max_draft_tokens: int = 15,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                 add_special_tokens: bool = False, timeout: float | None = None,
                 request_id: str = "") -> None:
        self.contract = client.model_info()
        self._wire = wire_dtype(dtype)
        self._wanted = state_names(layer_ids, embedding, final_norm)
        self._requests: queue.Queue = queue.Queue()
        self._closed = False
        open_msg = pb.SessionOpen(
            prompt=sequence_input(prompt, 0, "prompt"), add_special_tokens=add_special_tokens,
            layers=pb.LayerSelection(layer_ids=list(layer_ids), embedding=embedding,
                                     final_norm=final_norm),
            dtype=self._wire, max_new_tokens=max_new_tokens, max_draft_tokens=max_draft_tokens,
            sampling=pb.SessionSampling(temperature=temperature, top_p=top_p, top_k=top_k,
                                        seed=seed),
            request_id=request_id)
        self._call = client.stub.Session(iter(self._requests.get, None), timeout=timeout)
        answer, states = self._exchange(pb.SessionRequest(open=open_msg), "opened")
        o = answer.opened
        self.session_id: str = o.session_id
        self.prompt_token_ids: list[int] = list(o.prompt_token_ids)
        self.next_token: int = o.next_token
        self.capacity: int = o.capacity
        self.max_draft_tokens: int = o.max_draft_tokens
        self.eos_token_ids: list[int] = list(o.eos_token_ids)
        self.prompt_states = states

    # --- calls -------------------------------------------------------------------------------

    def verify(self, draft_tokens: Sequence[int], *, rule: str = "argmax_draft",
               draft_probs: Any = None, parents: Sequence[int] | None = None,
               commit: bool = False) -> Verified:
        """commit=True commits every accepted draft in the same call (no commit() after it)."""
        if rule not in _RULES:
            raise ValueError(f"rule: {rule!r} is not one of {sorted(_RULES)}")
        msg = pb.SessionVerify(draft_tokens=[int(t) for t in draft_tokens], rule=_RULES[rule],
                               parents=list(parents or ()), commit_accepted=commit)
        if draft_probs is not None:
            q = torch.as_tensor(draft_probs, dtype=torch.float32).contiguous()
            msg.draft_probs = np.ascontiguousarray(q.numpy(), dtype="<f4").tobytes()
        answer, states = self._exchange(pb.SessionRequest(verify=msg), "verified")
        v = answer.verified
        committed = None
        if v.HasField("committed"):
            c = v.committed
            committed = Committed(c.tokens, c.next_token, c.rollback_tokens)
            self.next_token = c.next_token
        return Verified(v.position, v.accepted, list(v.accepted_tokens), list(v.path),
                        v.next_token, list(v.target_argmax), v.rule, states, committed)

    def commit(self, accepted: int) -> Committed:
        if accepted < 0:
            raise ValueError(f"commit: accepted = {accepted} is negative")
        answer, _ = self._exchange(pb.SessionRequest(commit=pb.SessionCommit(accepted=accepted)),
                                   "committed")
        c = answer.committed
        self.next_token = c.next_token
        return Committed(c.tokens, c.next_token, c.rollback_tokens)

    def close(self) -> None:
        """Ends the stream (the server frees the session)."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)
        try:
            for _ in self._call:
                pass
        except grpc.RpcError:
            pass

    def __enter__(self) -> "LiveSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the stream --------------------------------------------------------------------------

    def _exchange(self, request: Any, want: str) -> tuple[Any, dict[str, torch.Tensor]]:
        if self._closed:
            raise ExtractorError(grpc.StatusCode.FAILED_PRECONDITION, "the session is closed",
                                 method="Session")
        self._requests.put(request)
        chunks = []
        try:
            while True:
                msg = next(self._call)
                kind = msg.WhichOneof("message")
                if kind != "chunk":
                    break
                chunks.append(msg.chunk)
        except StopIteration:
            self._closed = True
            raise ExtractorError(None, "the server ended the session's stream",
                                 method="Session") from None
        except grpc.RpcError as e:
            self._closed = True
            raise ExtractorError.from_rpc_error(e, "Session") from None
        if kind == "refused":
            if chunks:
                raise CorruptStream("states sent before a refusal", method="Session")
            r = msg.refused
            raise ExtractorError(grpc.StatusCode(_CODES[r.code]), r.message, method="Session")
        if kind != want:
            raise CorruptStream(f"answered {kind}, expected {want}", method="Session")
        rows = getattr(msg, want).state_rows if want != "committed" else 0
        if not chunks:
            if self._wanted and rows:
                raise CorruptStream(f"no states for {rows} rows", method="Session")
            return msg, {}
        asm = StateAssembler(self.contract, 1, self._wanted, self._wire, None, "Session")
        asm.set_length(0, rows)
        for c in chunks:
            asm.add(c)
        missing = asm.missing()
        if missing:
            raise CorruptStream("; ".join(missing), method="Session")
        return msg, asm.tensors(0)


_CODES = {c.value[0]: c for c in grpc.StatusCode}
__all__ = ["Committed", "LiveSession", "Verified", "state_name"]
