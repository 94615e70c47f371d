"""Rebuilding hidden states from HiddenStateChunk messages, checking every chunk against the
wire convention of proto/specwire/v1/extractor.proto before its bytes are accepted."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from ._stubs import pb
from .contract import Contract
from .crc32c import crc32c
from .errors import CorruptStream

# Wire dtype enum -> (torch dtype, bytes per element, little-endian numpy view for byte swapping).
WIRE_DTYPES: dict[int, tuple[torch.dtype, int, str]] = {
    pb.WIRE_DTYPE_BF16: (torch.bfloat16, 2, "<u2"),
    pb.WIRE_DTYPE_F32: (torch.float32, 4, "<u4"),
    pb.WIRE_DTYPE_F16: (torch.float16, 2, "<u2"),
}


def state_name(tap: int, layer_id: int) -> str:
    """The client's name of a state: "layer.{k}", "embedding" or "final_norm"."""
    if tap == pb.TAP_LAYER_OUTPUT:
        return f"layer.{layer_id}"
    if tap == pb.TAP_EMBEDDING:
        return "embedding"
    if tap == pb.TAP_FINAL_NORM:
        return "final_norm"
    raise CorruptStream(f"chunk with unknown tap {tap}")


def tensor_from_le_bytes(buf: bytearray, wire_dtype: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over little-endian `buf` (no copy on little-endian hosts)."""
    dtype, _, le = WIRE_DTYPES[wire_dtype]
    if sys.byteorder == "big":  # pragma: no cover - the wire is little-endian
        buf = bytearray(np.frombuffer(buf, dtype=le).astype(le[1:]).tobytes())
    if len(buf) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).reshape(shape)


class _StateBuffer:
    __slots__ = ("rows", "hidden", "row_bytes", "buf", "next_row")

    def __init__(self, rows: int, hidden: int, itemsize: int) -> None:
        self.rows = rows
        self.hidden = hidden
        self.row_bytes = hidden * itemsize
        self.buf = bytearray(rows * self.row_bytes)
        self.next_row = 0


class StateAssembler:
    """Collects the chunks of one Extract / Generate stream.

    `wanted` are the state names every sequence must deliver; a sequence's length must be known
    (set_length, from its SequenceInfo or Completion) before its first chunk arrives.
    """

    def __init__(self, contract: Contract, num_sequences: int, wanted: list[str], wire_dtype: int,
                 max_chunk_bytes: int | None, method: str) -> None:
        self.contract = contract
        self.num_sequences = num_sequences
        self.wanted = wanted
        self.wire_dtype = wire_dtype
        self.itemsize = WIRE_DTYPES[wire_dtype][1]
        self.max_chunk_bytes = max_chunk_bytes
        self.method = method
        self.lengths: list[int | None] = [None] * num_sequences
        self.states: list[dict[str, _StateBuffer]] = [{} for _ in range(num_sequences)]
        self.chunks = 0
        self.bytes = 0

    def _fail(self, msg: str) -> CorruptStream:
        return CorruptStream(msg, method=self.method)

    def set_length(self, seq: int, length: int) -> None:
        if not 0 <= seq < self.num_sequences:
            raise self._fail(f"sequence_index {seq} outside the {self.num_sequences} requested")
        if self.lengths[seq] is not None:
            raise self._fail(f"sequence {seq} announced twice")
        if length <= 0:
            raise self._fail(f"sequence {seq} announced with {length} tokens")
        self.lengths[seq] = length

    def add(self, chunk: Any) -> None:
        seq = chunk.sequence_index
        if not 0 <= seq < self.num_sequences:
            raise self._fail(f"chunk sequence_index {seq} outside the {self.num_sequences} "
                             "requested")
        length = self.lengths[seq]
        if length is None:
            raise self._fail(f"chunk of sequence {seq} before its SequenceInfo / Completion")
        name = state_name(chunk.state.tap, chunk.state.layer_id)
        where = f"sequence {seq} state {name}"
        if name not in self.wanted:
            raise self._fail(f"{where}: not requested (requested {self.wanted})")
        want_hf = self.contract.hf_hidden_states_index(name)
        if chunk.hf_hidden_states_index != want_hf:
            raise self._fail(f"{where}: hf_hidden_states_index {chunk.hf_hidden_states_index}, "
                             f"the convention says {want_hf} (layer k = hidden_states[k+1], "
                             "embedding = 0, final_norm = num_layers = "
                             f"{self.contract.num_layers})")
        if chunk.hidden_size != self.contract.hidden_size:
            raise self._fail(f"{where}: hidden_size {chunk.hidden_size}, contract says "
                             f"{self.contract.hidden_size}")
        dtype = chunk.dtype or pb.WIRE_DTYPE_BF16  # UNSPECIFIED means BF16
        if dtype != self.wire_dtype:
            raise self._fail(f"{where}: dtype {pb.WireDType.Name(chunk.dtype)}, requested "
                             f"{pb.WireDType.Name(self.wire_dtype)}")
        if chunk.sequence_length != length:
            raise self._fail(f"{where}: sequence_length {chunk.sequence_length}, the sequence has "
                             f"{length} tokens")
        st = self.states[seq].get(name)
        if st is None:
            st = self.states[seq][name] = _StateBuffer(length, chunk.hidden_size, self.itemsize)
        if chunk.token_start != st.next_row:
            raise self._fail(f"{where}: chunk starts at row {chunk.token_start}, expected row "
                             f"{st.next_row} (rows must be contiguous and in order)")
        end = chunk.token_start + chunk.token_count
        if chunk.token_count == 0 or end > length:
            raise self._fail(f"{where}: rows [{chunk.token_start}, {end}) outside [0, {length})")
        data = chunk.data
        if len(data) != chunk.token_count * st.row_bytes:
            raise self._fail(f"{where}: {len(data)} data bytes for {chunk.token_count} rows of "
                             f"{st.row_bytes} bytes")
        if (self.max_chunk_bytes and len(data) > self.max_chunk_bytes
                and chunk.token_count > 1):
            raise self._fail(f"{where}: {len(data)} bytes in one chunk exceed max_chunk_bytes "
                             f"{self.max_chunk_bytes}")
        got = crc32c(data)
        if got != chunk.crc32c:
            raise self._fail(f"{where} rows [{chunk.token_start}, {end}): crc32c {got:#010x} != "
                             f"{chunk.crc32c:#010x} sent")
        st.buf[chunk.token_start * st.row_bytes: end * st.row_bytes] = data
        st.next_row = end
        self.chunks += 1
        self.bytes += len(data)

    def missing(self) -> list[str]:
        out = []
        for seq in range(self.num_sequences):
            if self.lengths[seq] is None:
                out.append(f"sequence {seq}: never announced")
                continue
            for name in self.wanted:
                st = self.states[seq].get(name)
                rows = st.next_row if st else 0
                if rows != self.lengths[seq]:
                    out.append(f"sequence {seq} {name}: {rows} of {self.lengths[seq]} rows")
        return out

    def tensors(self, seq: int) -> dict[str, torch.Tensor]:
        return {name: tensor_from_le_bytes(self.states[seq][name].buf, self.wire_dtype,
                                           (self.lengths[seq], self.contract.hidden_size))
                for name in self.wanted}
