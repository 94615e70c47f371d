"""What a request to the extractor is made of, shared by the client's calls and the live session:
the wire dtype, the states asked for and the sequences sent."""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch

from ._stubs import pb

# A sequence: token ids, or text the server tokenizes with the model's tokenizer.
SequenceLike = Union[str, Sequence[int], torch.Tensor]

_DTYPES = {
    "bf16": pb.WIRE_DTYPE_BF16, "bfloat16": pb.WIRE_DTYPE_BF16, torch.bfloat16: pb.WIRE_DTYPE_BF16,
    "fp32": pb.WIRE_DTYPE_F32, "float32": pb.WIRE_DTYPE_F32, "f32": pb.WIRE_DTYPE_F32,
    torch.float32: pb.WIRE_DTYPE_F32,
}


def wire_dtype(dtype: Any) -> int:
    """"bf16" / "fp32" (or torch.bfloat16 / torch.float32) -> the WireDType enum value."""
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype must be 'bf16' or 'fp32', got {dtype!r}") from None


def state_names(layer_ids: Iterable[int], embedding: bool, final_norm: bool) -> list[str]:
    names = ["embedding"] if embedding else []
    for k in layer_ids:
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"layer ids must be ints, got {k!r}")
        if f"layer.{k}" not in names:
            names.append(f"layer.{k}")
    return names + (["final_norm"] if final_norm else [])


def layer_selection(names: Sequence[str], embedding: bool, final_norm: bool) -> Any:
    """The LayerSelection of the states `names` (from state_names) asks for."""
    return pb.LayerSelection(layer_ids=[int(n.split(".")[1]) for n in names
                                        if n.startswith("layer.")],
                             embedding=embedding, final_norm=final_norm)


def as_list(sequences: Any, field: str) -> list:
    """A list of sequences; a 2-D tensor (or array) counts as one sequence per row."""
    if isinstance(sequences, str) or (hasattr(sequences, "ndim") and sequences.ndim != 2):
        raise TypeError(f"{field}: expected a list of sequences or a 2-D tensor of token ids")
    return list(sequences)


def sequence_input(seq: SequenceLike, index: int, field: str) -> Any:
    if isinstance(seq, str):
        return pb.SequenceInput(text=seq)
    if hasattr(seq, "tolist"):  # a 1-D tensor or array
        seq = seq.tolist()
    try:
        ids = [int(t) for t in seq]
    except (TypeError, ValueError):
        raise TypeError(f"{field}[{index}]: expected a str or a list of token ids, got "
                        f"{type(seq).__name__}") from None
    return pb.SequenceInput(tokens=pb.TokenIds(ids=ids))


@dataclass
class StatesAsk:
    """What a states request (Extract's, Generate's) asks for: its inputs, the states by name,
    the wire dtype, the chunk size and the request id."""
    inputs: list[Any]
    names: list[str]
    wire: int
    max_chunk_bytes: int | None
    request_id: str
    embedding: bool
    final_norm: bool
    add_special_tokens: bool

    def fields(self, inputs_field: str) -> dict[str, Any]:
        """The request message's fields this ask fills, the inputs under `inputs_field`."""
        return {inputs_field: self.inputs,
                "layers": layer_selection(self.names, self.embedding, self.final_norm),
                "dtype": self.wire, "max_chunk_bytes": self.max_chunk_bytes or 0,
                "request_id": self.request_id, "add_special_tokens": self.add_special_tokens}


def states_ask(sequences: Any, field: str, layer_ids: Iterable[int], embedding: bool,
               final_norm: bool, dtype: Any, max_chunk_bytes: int | None,
               request_id: str | None, add_special_tokens: bool) -> StatesAsk:
    """The ask of a call's arguments, each checked (errors name `field` and the index); a fresh
    request id where none is given."""
    sequences = as_list(sequences, field)
    wire = wire_dtype(dtype)
    names = state_names(layer_ids, embedding, final_norm)
    inputs = [sequence_input(s, i, field) for i, s in enumerate(sequences)]
    return StatesAsk(inputs, names, wire, max_chunk_bytes, request_id or uuid.uuid4().hex,
                     embedding, final_norm, add_special_tokens)
