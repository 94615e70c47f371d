"""The extraction contract (what the extractor actually runs) and the checks a consumer makes
against it before it uses any hidden state."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .errors import ContractMismatch


@dataclasses.dataclass(frozen=True)
class SkippedTensors:
    prefix: str
    count: int
    reason: str
    # Every tensor's name for the group a drafter is made of ("mtp.": the checkpoint's own
    # multi-token-prediction head, which GetTensors serves); empty for the others.
    names: tuple[str, ...] = ()
    digest: str = ""  # over the named tensors (as weights_digest); "" for the others


@dataclasses.dataclass(frozen=True)
class Contract:
    """specwire.v1.ExtractionContract as a plain value (every field of the message)."""

    architecture: str
    model_type: str
    source_layout: str
    source_architecture: str
    weight_prefix: str
    tensors_loaded: int
    tensors_skipped: int
    skipped: tuple[SkippedTensors, ...]
    num_layers: int
    hidden_size: int
    vocab_size: int
    layer_types: tuple[str, ...]
    compute_dtype: str
    devices: tuple[str, ...]
    kernel_variant: str
    weights_digest: str
    tokenizer_digest: str
    specwire_version: str
    chat_template_digest: str = ""  # of the target's chat template ("" when it has none)
    # The canary fingerprint: statistics of every tap on a fixed input, computed at load
    # ({"token_ids", "compute_dtype", "taps": [{"tap", "mean", "std", "rms", "sketch"}]});
    # specwire_client.audit.compare_fingerprints compares two.
    canary: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)
    # The checkpoint's config.json as the extractor read it ("" from older extractors).
    config_json: str = dataclasses.field(default="", compare=False, hash=False)

    @classmethod
    def from_proto(cls, msg: Any) -> "Contract":
        return cls(
            architecture=msg.architecture,
            model_type=msg.model_type,
            source_layout=msg.source_layout,
            source_architecture=msg.source_architecture,
            weight_prefix=msg.weight_prefix,
            tensors_loaded=msg.tensors_loaded,
            tensors_skipped=msg.tensors_skipped,
            skipped=tuple(SkippedTensors(s.prefix, s.count, s.reason, tuple(s.names), s.digest)
                          for s in msg.skipped),
            num_layers=msg.num_layers,
            hidden_size=msg.hidden_size,
            vocab_size=msg.vocab_size,
            layer_types=tuple(msg.layer_types),
            compute_dtype=msg.compute_dtype,
            devices=tuple(msg.devices),
            kernel_variant=msg.kernel_variant,
            weights_digest=msg.weights_digest,
            tokenizer_digest=msg.tokenizer_digest,
            specwire_version=msg.specwire_version,
            chat_template_digest=msg.chat_template_digest,
            canary={"token_ids": list(msg.canary.token_ids),
                    "compute_dtype": msg.canary.compute_dtype,
                    "taps": [{"tap": t.tap, "mean": t.mean, "std": t.std, "rms": t.rms,
                              "sketch": list(t.sketch)} for t in msg.canary.taps]},
            config_json=msg.config_json,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hf_hidden_states_index(self, state: str) -> int:
        """Index into transformers' output_hidden_states of a state name ("layer.k",
        "embedding", "final_norm")."""
        if state == "embedding":
            return 0
        if state == "final_norm":
            return self.num_layers
        return int(state.split(".", 1)[1]) + 1


@dataclasses.dataclass(frozen=True)
class ContractExpectation:
    """The contract fields a consumer depends on; None means "not checked".

    A drafter records what it was trained against, e.g.
    ContractExpectation(num_layers=64, hidden_size=5120, vocab_size=248320,
                        target_layer_ids=[1, 16, 31, 46, 61], architecture="Qwen3_5ForCausalLM"),
    and every stream it consumes is checked before the first chunk is read.
    target_layer_ids must all be decoder layers of the target (0 <= k < num_layers).
    """

    num_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    target_layer_ids: Sequence[int] | None = None
    architecture: str | None = None
    weights_digest: str | None = None
    model_type: str | None = None
    compute_dtype: str | None = None
    tokenizer_digest: str | None = None
    layer_types: Sequence[str] | None = None

    # Fields compared for equality, in the order they are checked.
    _EQUAL = ("architecture", "model_type", "num_layers", "hidden_size", "vocab_size",
              "layer_types", "compute_dtype", "weights_digest", "tokenizer_digest")

    @classmethod
    def from_contract(cls, contract: Contract, *, fields: Sequence[str] = (
            "architecture", "num_layers", "hidden_size", "vocab_size", "weights_digest"),
            target_layer_ids: Sequence[int] | None = None) -> "ContractExpectation":
        """An expectation pinning `fields` of a contract seen before (e.g. at training time)."""
        values = {f: getattr(contract, f) for f in fields}
        return cls(target_layer_ids=target_layer_ids, **values)

    def check(self, contract: Contract) -> None:
        """Raises ContractMismatch naming the first field that differs."""
        for name in self._EQUAL:
            want = getattr(self, name)
            if want is None:
                continue
            have = getattr(contract, name)
            if name == "layer_types":
                want, have = tuple(want), tuple(have)
            if want != have:
                raise ContractMismatch(name, want, have)
        if self.target_layer_ids is not None:
            bad = [k for k in self.target_layer_ids if not 0 <= k < contract.num_layers]
            if bad:
                raise ContractMismatch(
                    "target_layer_ids", list(self.target_layer_ids),
                    f"num_layers={contract.num_layers}",
                    note=f"layer ids {bad} are not decoder layers of a {contract.num_layers}-layer "
                         f"target (layer k = HF hidden_states[k+1], 0 <= k < num_layers)")
