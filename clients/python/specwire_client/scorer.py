"""ScorerClient: push mode of the scorer's continuous evaluation (specwire.v1.CheckpointScorer).

A training loop that can reach a specwire-scorer started with --eval_sets submits a drafter
checkpoint every N steps and gets its acceptance on every eval set back:

    from specwire_client import ScorerClient
    with ScorerClient("scorer:50061") as scorer:
        if step % 1000 == 0:
            result = scorer.submit_checkpoint(run="r1", step=step,
                                              state_dict=drafter.state_dict(), config=config)
            print(result.tau)            # {"chat": 3.41, "code": 4.02}

The checkpoint (a directory with config.json + *.safetensors, or a state dict + its config) is
streamed in chunks with each file's size and xxh3-128 digest, which the scorer checks before
scoring; the scorer records the results in its database keyed (run, step, dataset) exactly as a
checkpoint found in its watch directory, and answers a (run, step) it already scored from there.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Union

import grpc
import xxhash

from ._generated.proto.specwire.v1 import scorer_pb2 as spb
from ._generated.proto.specwire.v1 import scorer_pb2_grpc as spb_grpc
from ._tools import file_digest
from .errors import ExtractorError

CHUNK_BYTES = 1 << 20

ConfigLike = Union[Mapping[str, Any], str, bytes, os.PathLike, None]


class ScorerError(ExtractorError):
    """A failed scorer call (gRPC code and the scorer's message, which names the field or file)."""


@dataclasses.dataclass
class DatasetScore:
    """The outcome of one eval set."""

    dataset: str
    status: str  # "ok" | "failed"
    error: str
    tau: float  # mean of means (dflash's τ)
    tau_pooled: float
    ddtree_tau: dict[int, float]
    per_position_acceptance: list[float]
    from_database: bool  # scored before this call (the (run, step) was recorded already)
    # The 95% bootstrap interval of τ over the eval set's prompts (None: not computed).
    tau_ci: tuple[float, float] | None
    summary: Any  # the AcceptanceSummary message


@dataclasses.dataclass
class CheckpointScores:
    run: str
    step: int
    checkpoint_digest: str
    scores: dict[str, DatasetScore]

    @property
    def tau(self) -> dict[str, float]:
        """{dataset: τ} of the eval sets scored ok."""
        return {k: v.tau for k, v in self.scores.items() if v.status == "ok"}


def _config_bytes(config: ConfigLike) -> bytes:
    if config is None:
        raise ValueError("submit_checkpoint: a state_dict needs its config (dict, JSON or path)")
    if isinstance(config, Mapping):
        return json.dumps(dict(config), indent=2).encode()
    if isinstance(config, bytes):
        return config
    if isinstance(config, str) and config.lstrip().startswith("{"):
        return config.encode()
    return Path(config).read_bytes()


class ScorerClient:
    """Push mode of a specwire-scorer (`address` host:port, or a grpc.Channel)."""

    def __init__(self, address: Union[str, grpc.Channel], *, timeout: float | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 metadata: tuple[tuple[str, str], ...] = ()) -> None:
        if isinstance(address, grpc.Channel):
            self._channel, self._own = address, False
        else:
            options = [("grpc.max_send_message_length", 64 << 20)]
            self._channel = (grpc.secure_channel(address, credentials, options)
                             if credentials is not None
                             else grpc.insecure_channel(address, options))
            self._own = True
        self._stub = spb_grpc.CheckpointScorerStub(self._channel)
        self._timeout = timeout
        self._metadata = metadata

    def close(self) -> None:
        if self._own:
            self._channel.close()

    def __enter__(self) -> "ScorerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit_checkpoint(self, *, run: str, step: int, path: Union[str, os.PathLike, None] = None,
                          state_dict: Mapping[str, Any] | None = None, config: ConfigLike = None,
                          timeout: float | None = None) -> CheckpointScores:
        """Uploads a drafter checkpoint as (run, step) and returns its scores on the scorer's eval
        sets. Give `path` (a directory with config.json and *.safetensors) or `state_dict` with
        `config` (a dict, JSON text, or a config.json path). Raises ScorerError."""
        if (path is None) == (state_dict is None):
            raise ValueError("submit_checkpoint: give exactly one of path and state_dict")
        files: dict[str, Union[Path, bytes]] = {}
        if path is not None:
            d = Path(path)
            if not (d / "config.json").is_file():
                raise FileNotFoundError(f"{d / 'config.json'}: no such file")
            files["config.json"] = d / "config.json"
            for f in sorted(d.glob("*.safetensors")):
                files[f.name] = f
            if len(files) < 2:
                raise FileNotFoundError(f"{d}: no *.safetensors file")
        else:
            from safetensors.torch import save

            tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
            files["config.json"] = _config_bytes(config)
            files["model.safetensors"] = save(tensors)

        header = spb.DrafterUploadHeader(run=run, step=step)
        for name, src in files.items():
            if isinstance(src, bytes):
                size = len(src)
                digest = "xxh3-128:" + xxhash.xxh3_128_hexdigest(src)
            else:
                size = src.stat().st_size
                digest = file_digest(src, CHUNK_BYTES)
            header.files.add(name=name, size=size, digest=digest)

        def messages() -> Iterator[spb.DrafterUpload]:
            yield spb.DrafterUpload(header=header)
            for name, src in files.items():
                if isinstance(src, bytes):
                    for off in range(0, len(src), CHUNK_BYTES):
                        yield spb.DrafterUpload(chunk=spb.FileChunk(
                            name=name, offset=off, data=src[off:off + CHUNK_BYTES]))
                else:
                    with open(src, "rb") as f:
                        off = 0
                        while block := f.read(CHUNK_BYTES):
                            yield spb.DrafterUpload(chunk=spb.FileChunk(name=name, offset=off,
                                                                        data=block))
                            off += len(block)

        try:
            reply = self._stub.SubmitDrafter(messages(), timeout=timeout or self._timeout,
                                             metadata=self._metadata or None)
        except grpc.RpcError as e:
            raise ScorerError.from_rpc_error(e, "SubmitDrafter") from None
        scores = {}
        for s in reply.scores:
            scores[s.dataset] = DatasetScore(
                dataset=s.dataset, status=s.status, error=s.error,
                tau=s.summary.tau_mean_of_means, tau_pooled=s.summary.tau_pooled,
                ddtree_tau={int(k): v for k, v in s.summary.ddtree_tau.items()},
                per_position_acceptance=list(s.summary.per_position_acceptance),
                from_database=s.from_database,
                tau_ci=((s.summary.tau_mean_of_means_ci.lo, s.summary.tau_mean_of_means_ci.hi)
                        if s.summary.HasField("tau_mean_of_means_ci") else None),
                summary=s.summary)
        return CheckpointScores(run=reply.run, step=reply.step,
                                checkpoint_digest=reply.checkpoint_digest, scores=scores)
