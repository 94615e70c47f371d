"""specwire-client: the Python client of the specwire extractor.

    ExtractorClient   the Extractor API; every stream checked (contract, crc32c, convention,
                      trailer) and rebuilt into torch tensors
    FeatureDataset    a torch IterableDataset streaming training features, with prefetch,
                      sharding over torch.distributed ranks x DataLoader workers (every sample
                      once per epoch, seeded shuffle, resumable) and reconnect-with-backoff
                      (RetryPolicy); pad_collate batches its variable-length items
    Contract, ContractExpectation
                      the extraction contract and the checks a consumer makes against it
    ExtractorError    every error (ContractMismatch, IncompleteStream, CorruptStream below it)
    ChatTemplate      a model's chat template rendered as transformers does; prepare() gives
                      token ids, the assistant loss mask and the TemplateRecord
    export_features   features written as SpecForge's or speculators' offline datasets (DFlash
                      or EAGLE-3 layout), the extraction contract beside them
    audit (module)    are features made elsewhere the canonical ones? audit_features, the readers
                      of SpecForge / vLLM / speculators / transformers captures, acceptance_impact
    LiveSession       a live verification session (ExtractorClient.session): verify drafts on the
                      target by the lossless rule, commit what was accepted
    ScorerClient      push mode of the scorer: submit_checkpoint(run, step, path | state_dict)
                      uploads a drafter checkpoint and returns its scores (CheckpointScores)
    served (module)   a serving engine's acceptance read in its own formats (vLLM's counters and
                      per-request metrics, SGLang's meta_info); drive_openai drives an engine
    reconcile (module)
                      served vs canonical acceptance with intervals and a diagnosis of the gap
                      (specwire-reconcile)
    benchmarks (module)
                      gsm8k, math500, humaneval, mbpp, mt-bench, SPEED-Bench read, rendered with
                      the target's chat template and tabulated (specwire-benchmarks)

State names: "layer.k" is the output of decoder layer k = transformers' hidden_states[k + 1];
"embedding" = hidden_states[0]; "final_norm" = hidden_states[num_layers].
"""
from ._stubs import pb as extractor_pb2
from ._stubs import pb_grpc as extractor_pb2_grpc
from ._request import wire_dtype
from .client import (ExtractorClient, GenerateResult, SequenceStates, StreamResult,
                     channel_target)
from .chat import ChatTemplate, PreparedChat, TemplateRecord, write_prepared_dataset
from .contract import Contract, ContractExpectation, SkippedTensors
from .crc32c import crc32c
from .dataset import FeatureDataset, RetryPolicy, pad_collate
from .export import export_features
from .errors import ContractMismatch, CorruptStream, ExtractorError, IncompleteStream
from .scorer import CheckpointScores, DatasetScore, ScorerClient, ScorerError
from .security import ChannelSecurity
from .session import Committed, LiveSession, Verified

__version__ = "0.1.0"

__all__ = [
    "ChatTemplate", "PreparedChat", "TemplateRecord", "write_prepared_dataset",
    "CheckpointScores", "DatasetScore", "ScorerClient", "ScorerError", "ChannelSecurity",
    "Contract", "ContractExpectation", "ContractMismatch", "CorruptStream", "ExtractorClient",
    "Committed", "ExtractorError", "FeatureDataset", "GenerateResult", "IncompleteStream",
    "LiveSession", "RetryPolicy", "Verified",
    "SequenceStates", "SkippedTensors", "StreamResult", "channel_target", "crc32c",
    "export_features", "extractor_pb2", "extractor_pb2_grpc", "pad_collate", "wire_dtype",
]
