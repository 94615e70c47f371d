"""The Python client's own logic, without a server: crc32c, targets, chunk checks, contract
expectations, and FeatureDataset's retry bookkeeping against a scripted fake client."""
from __future__ import annotations

import os
import threading

import grpc
import pytest
import torch

import specwire_client
from specwire_client import (Contract, ContractExpectation, ContractMismatch, CorruptStream,
                             FeatureDataset, IncompleteStream, RetryPolicy, channel_target,
                             extractor_pb2 as pb)
from specwire_client._assembly import StateAssembler
from specwire_client.client import SequenceStates, StreamResult
from specwire_client.crc32c import _crc32c_numpy, crc32c

CONTRACT = Contract(architecture="Qwen3ForCausalLM", model_type="qwen3", source_layout="text",
                    source_architecture="Qwen3ForCausalLM", weight_prefix="model.",
                    tensors_loaded=35, tensors_skipped=0, skipped=(), num_layers=3,
                    hidden_size=4, vocab_size=512, layer_types=("full_attention",) * 3,
                    compute_dtype="float32", devices=("cpu",) * 3, kernel_variant="sdpa",
                    weights_digest="xxh3-128:00", tokenizer_digest="", specwire_version="0.1.0")


# --- crc32c --------------------------------------------------------------------------------------

def test_crc32c_known_values():
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert _crc32c_numpy(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros


@pytest.mark.parametrize("n", [0, 1, 3, 4, 255, 256, 257, 1023, 4096, 65537, 1 << 20])
def test_crc32c_numpy_matches(n):
    data = os.urandom(n)
    assert _crc32c_numpy(data) == crc32c(data)
    assert _crc32c_numpy(memoryview(data)) == crc32c(memoryview(data))


# --- targets -------------------------------------------------------------------------------------

def test_channel_targets():
    assert channel_target("127.0.0.1:5") == ("127.0.0.1:5", False)
    assert channel_target("dns:///extractor:50051") == ("dns:///extractor:50051", True)
    assert channel_target(["127.0.0.1:5", "127.0.0.2:6"]) == ("ipv4:127.0.0.1:5,127.0.0.2:6",
                                                              True)
    assert channel_target("127.0.0.1:5,127.0.0.1:6") == ("ipv4:127.0.0.1:5,127.0.0.1:6", True)
    assert channel_target(["[::1]:7"]) == ("ipv6:[::1]:7", True)
    assert channel_target(["localhost:9"])[0].startswith(("ipv4:127.0.0.1:9", "ipv6:[::1]:9"))
    with pytest.raises(ValueError):
        channel_target(["127.0.0.1:1", "[::1]:2"])
    with pytest.raises(ValueError):
        channel_target(["no-port"])


def test_client_channel_options():
    c = specwire_client.ExtractorClient(["127.0.0.1:1", "127.0.0.1:2"],
                                        options={"grpc.max_receive_message_length": 123})
    assert c.options["grpc.lb_policy_name"] == "round_robin"
    assert c.options["grpc.max_receive_message_length"] == 123
    c.close()
    c = specwire_client.ExtractorClient("127.0.0.1:1")
    assert "grpc.lb_policy_name" not in c.options
    with pytest.raises(specwire_client.ExtractorError) as info:
        c.model_info(timeout=0.5)
    assert info.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    c.close()


# --- chunk checks --------------------------------------------------------------------------------

def _chunk(seq=0, layer=1, start=0, rows=2, length=4, hidden=4, hf=None, dtype=pb.WIRE_DTYPE_F32,
           data=None, crc=None, tap=pb.TAP_LAYER_OUTPUT):
    values = torch.arange(start * hidden, (start + rows) * hidden, dtype=torch.float32)
    data = values.numpy().tobytes() if data is None else data
    return pb.HiddenStateChunk(
        sequence_index=seq, state=pb.StateId(tap=tap, layer_id=layer),
        hf_hidden_states_index=layer + 1 if hf is None else hf, token_start=start,
        token_count=rows, sequence_length=length, hidden_size=hidden, dtype=dtype, data=data,
        crc32c=crc32c(data) if crc is None else crc)


def _assembler(wanted=("layer.1",)):
    a = StateAssembler(CONTRACT, 1, list(wanted), pb.WIRE_DTYPE_F32, None, "Extract")
    a.set_length(0, 4)
    return a


def test_assembler_rebuilds_rows_in_order():
    a = _assembler()
    a.add(_chunk(start=0, rows=1))
    a.add(_chunk(start=1, rows=3))
    assert a.missing() == []
    t = a.tensors(0)["layer.1"]
    assert t.dtype == torch.float32 and torch.equal(t, torch.arange(16.0).reshape(4, 4))


@pytest.mark.parametrize("bad,message", [
    (dict(crc=1), "crc32c"),
    (dict(hf=1), "hf_hidden_states_index 1, the convention says 2"),
    (dict(hidden=8, data=bytes(64)), "hidden_size 8"),
    (dict(dtype=pb.WIRE_DTYPE_BF16), "dtype"),
    (dict(start=1), "expected row 0"),
    (dict(length=5), "sequence_length 5"),
    (dict(rows=5), "outside [0, 4)"),
    (dict(data=bytes(7)), "7 data bytes"),
    (dict(layer=0), "not requested"),
    (dict(seq=3), "outside the 1 requested"),
    (dict(tap=7), "unknown tap"),
])
def test_assembler_refuses_broken_chunks(bad, message):
    with pytest.raises(CorruptStream, match=message.replace("[", r"\[").replace(")", r"\)")):
        _assembler().add(_chunk(**bad))


def test_assembler_reports_missing_rows_and_final_norm_index():
    a = _assembler(wanted=("layer.1", "final_norm"))
    a.add(_chunk(start=0, rows=2))
    a.add(_chunk(layer=0, tap=pb.TAP_FINAL_NORM, hf=3, rows=4))
    assert a.missing() == ["sequence 0 layer.1: 2 of 4 rows"]
    with pytest.raises(CorruptStream, match="says 3"):
        _assembler(wanted=("final_norm",)).add(_chunk(layer=0, tap=pb.TAP_FINAL_NORM, hf=2))


def test_contract_expectation_messages():
    ContractExpectation(num_layers=3, hidden_size=4, target_layer_ids=[0, 2]).check(CONTRACT)
    with pytest.raises(ContractMismatch) as info:
        ContractExpectation(num_layers=64).check(CONTRACT)
    assert (info.value.field, info.value.expected, info.value.actual) == ("num_layers", 64, 3)
    assert "num_layers: expected 64, extractor has 3" in str(info.value)
    with pytest.raises(ContractMismatch, match=r"target_layer_ids.*\[3\] are not decoder layers"):
        ContractExpectation(target_layer_ids=[1, 3]).check(CONTRACT)
    with pytest.raises(ContractMismatch, match="weights_digest"):
        ContractExpectation(weights_digest="xxh3-128:ff").check(CONTRACT)
    pinned = ContractExpectation.from_contract(CONTRACT)
    pinned.check(CONTRACT)
    assert pinned.weights_digest == CONTRACT.weights_digest and pinned.num_layers == 3


# --- FeatureDataset against a scripted client -----------------------------------------------

class FlakyClient:
    """extract_stream fails as scripted (per call number), else returns deterministic states."""

    def __init__(self, log: list, failures: dict[int, Exception]) -> None:
        self.log = log
        self.failures = failures

    def extract_stream(self, sequences, layer_ids, **kw):
        n = len(self.log)
        self.log.append([list(s) for s in sequences])
        if n in self.failures:
            raise self.failures[n]
        out = [SequenceStates({"layer.0": torch.tensor(s, dtype=torch.float32)[:, None]},
                              list(s)) for s in sequences]
        return StreamResult(CONTRACT, out, None)

    def close(self):
        pass


def test_dataset_retries_a_failed_batch_from_its_start():
    data = [[i, i + 1] for i in range(10)]
    log: list = []
    failures = {1: IncompleteStream(grpc.StatusCode.UNAVAILABLE, "cut"),
                2: specwire_client.ExtractorError(grpc.StatusCode.UNAVAILABLE, "down"),
                4: IncompleteStream(None, "no trailer")}
    ds = FeatureDataset(None, data, [0], sequences_per_request=3, prefetch_depth=1,
                        retry=RetryPolicy(backoff_initial=0.001),
                        client_factory=lambda: FlakyClient(log, failures))
    items = list(ds)
    assert [it["input_ids"].tolist() for it in items] == data
    for it, d in zip(items, data):
        want = torch.tensor(d, dtype=torch.float32)
        assert torch.equal(it["hidden_states"]["layer.0"][:, 0], want)
    assert ds.retries == 3
    assert log[1] == log[2] == log[3] == data[3:6]  # the same batch, resent whole


def test_dataset_gives_up_after_max_retries_and_keeps_other_errors():
    down = specwire_client.ExtractorError(grpc.StatusCode.UNAVAILABLE, "down")
    log: list = []
    ds = FeatureDataset(None, [[1]] * 4, [0], sequences_per_request=2,
                        retry=RetryPolicy(max_retries=2, backoff_initial=0.001),
                        client_factory=lambda: FlakyClient(log, {1: down, 2: down, 3: down}))
    got = []
    with pytest.raises(specwire_client.ExtractorError, match="down"):
        for item in ds:
            got.append(item)
    assert len(got) == 2 and len(log) == 4
    log.clear()
    invalid = specwire_client.ExtractorError(grpc.StatusCode.INVALID_ARGUMENT, "bad")
    ds = FeatureDataset(None, [[1]] * 4, [0], sequences_per_request=2,
                        client_factory=lambda: FlakyClient(log, {0: invalid}))
    with pytest.raises(specwire_client.ExtractorError, match="bad"):
        list(ds)
    assert len(log) == 1  # not retried


def test_dataset_passes_dict_fields_and_stops_early_cleanly():
    data = [{"input_ids": [i, 7], "label": i} for i in range(20)]
    ds = FeatureDataset(None, data, [0], sequences_per_request=2, prefetch_depth=1,
                        client_factory=lambda: FlakyClient([], {}))
    before = threading.active_count()
    it = iter(ds)
    first = next(it)
    assert first["label"] == 0 and first["input_ids"].tolist() == [0, 7]
    it.close()  # the consumer stops: the prefetch thread ends
    assert threading.active_count() == before


def test_dataset_shards_by_worker(monkeypatch):
    from specwire_client import dataset as dataset_mod

    data = [[i] for i in range(7)]
    seen = []
    for worker in range(3):
        monkeypatch.setattr(dataset_mod, "get_worker_info",
                            lambda w=worker: type("W", (), {"id": w, "num_workers": 3})())
        ds = FeatureDataset(None, data, [0], sequences_per_request=2,
                            client_factory=lambda: FlakyClient([], {}))
        seen.append([it["input_ids"].item() for it in ds])
    assert seen == [[0, 3, 6], [1, 4], [2, 5]]


def _worker(monkeypatch, w: int, n: int) -> None:
    from specwire_client import dataset as dataset_mod
    monkeypatch.setattr(dataset_mod, "get_worker_info",
                        lambda: type("W", (), {"id": w, "num_workers": n})())


@pytest.mark.parametrize("n,world,workers,shuffle,start", [
    (23, 2, 2, False, 0), (23, 2, 2, True, 0), (23, 3, 1, True, 5), (7, 4, 3, True, 0),
    (50, 2, 3, True, 18), (1, 2, 2, False, 0), (10, 1, 1, True, 10)])
def test_dataset_shards_ranks_times_workers_exactly_once(monkeypatch, n, world, workers,
                                                         shuffle, start):
    data = [[i] for i in range(n)]
    full = FeatureDataset(None, data, [0], rank=0, world_size=1, shuffle=shuffle, seed=3,
                          epoch=2, client_factory=lambda: FlakyClient([], {}))
    order = full.epoch_order()
    seen: list[int] = []
    for rank in range(world):
        per_rank = 0
        for w in range(workers):
            _worker(monkeypatch, w, workers)
            ds = FeatureDataset(None, data, [0], rank=rank, world_size=world, shuffle=shuffle,
                                seed=3, epoch=2, start=start, sequences_per_request=2,
                                client_factory=lambda: FlakyClient([], {}))
            got = [it["sample_index"] for it in ds]
            assert all(data[i] == [it] for i, it in zip(got, got))
            seen += got
            per_rank += len(got)
        assert per_rank == len(ds)
    assert sorted(seen) == sorted(order[start:])  # the rest of the epoch, each once
    assert len(seen) == n - min(start, n)


def test_dataset_shuffle_is_seeded_per_epoch_and_the_same_on_every_rank():
    data = [[i] for i in range(40)]
    mk = lambda rank, **kw: FeatureDataset(None, data, [0], rank=rank, world_size=2,  # noqa: E731
                                           shuffle=True, client_factory=lambda: FlakyClient([], {}),
                                           **kw)
    a, b = mk(0, seed=1), mk(1, seed=1)
    assert a.epoch_order() == b.epoch_order() and a.epoch_order() != list(range(40))
    first = a.epoch_order()
    a.set_epoch(1)
    assert a.epoch_order() != first and sorted(a.epoch_order()) == list(range(40))
    assert mk(0, seed=2).epoch_order() != first
    # Resumption: the rest of the same order.
    a.set_epoch(1, start=12)
    assert a.epoch_order() == mk(0, seed=1, epoch=1).epoch_order()[12:]
    with pytest.raises(TypeError, match="indexable"):
        FeatureDataset(None, iter(data), [0], shuffle=True, rank=0, world_size=1,
                       client_factory=lambda: FlakyClient([], {}))
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        mk(2)
    with pytest.raises(ValueError, match="both rank and world_size"):
        FeatureDataset(None, data, [0], rank=0, client_factory=lambda: FlakyClient([], {}))


def test_dataset_takes_rank_and_world_from_torch_distributed(monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    ds = FeatureDataset(None, [[i] for i in range(10)], [0],
                        client_factory=lambda: FlakyClient([], {}))
    assert (ds.rank, ds.world_size) == (1, 3)
    assert [it["sample_index"] for it in ds] == [1, 4, 7]


def test_pad_collate_pads_ids_states_and_masks():
    from specwire_client import pad_collate
    items = [{"input_ids": torch.tensor([5, 6, 7]), "sample_index": 4, "tag": "a",
              "hidden_states": {"layer.0": torch.ones(3, 2)}},
             {"input_ids": torch.tensor([8]), "sample_index": 9, "tag": "b",
              "loss_mask": [0], "hidden_states": {"layer.0": torch.full((1, 2), 2.0)}}]
    out = pad_collate(items, pad_token_id=-1)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, -1, -1]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["loss_mask"].tolist() == [[1, 1, 1], [0, 0, 0]]
    assert out["hidden_states"]["layer.0"].shape == (2, 3, 2)
    assert out["hidden_states"]["layer.0"][1].tolist() == [[2, 2], [0, 0], [0, 0]]
    assert out["sample_index"].tolist() == [4, 9] and out["tag"] == ["a", "b"]
    with pytest.raises(ValueError, match="loss_mask"):
        pad_collate([dict(items[1], loss_mask=[1, 1])])
    # Through a DataLoader with workers: the collate runs in the workers.
    data = [[i] * (1 + i % 3) for i in range(9)]
    ds = FeatureDataset(None, data, [0], rank=0, world_size=1,
                        client_factory=lambda: FlakyClient([], {}))
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=0, collate_fn=pad_collate)
    batches = list(loader)
    assert sorted(i for b in batches for i in b["sample_index"].tolist()) == list(range(9))


def test_retry_policy_values():
    p = RetryPolicy(max_retries=3, backoff_initial=0.5, backoff_multiplier=2, backoff_max=1.5,
                    codes=[grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
    assert [p.delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 1.5, 1.5]
    assert p.retryable(specwire_client.ExtractorError(grpc.StatusCode.RESOURCE_EXHAUSTED, "full"))
    assert not p.retryable(specwire_client.ExtractorError(grpc.StatusCode.INVALID_ARGUMENT, "x"))
    assert p.retryable(IncompleteStream(None, "cut"))
    assert not p.retryable(IncompleteStream(grpc.StatusCode.INVALID_ARGUMENT, "refused"))
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)
    with pytest.raises(TypeError, match="RetryPolicy"):
        FeatureDataset(None, [[1]], [0], retry=3, client_factory=lambda: FlakyClient([], {}))


# --- whole streams through ExtractorClient, from a scripted stub --------------------------------

class _Call:
    def __init__(self, messages):
        self.messages = messages
        self.cancelled = False

    def __iter__(self):
        return iter(self.messages)

    def cancel(self):
        self.cancelled = True


def _stream_messages(seq=(5, 6, 7), crc=None, trailer=True, request_id="r1"):
    contract = pb.ExtractionContract(architecture="Qwen3ForCausalLM", num_layers=3, hidden_size=4,
                                     vocab_size=512)
    chunk = _chunk(length=len(seq), rows=len(seq), crc=crc)
    msgs = [pb.ExtractResponse(contract=contract),
            pb.ExtractResponse(sequence=pb.SequenceInfo(sequence_index=0, token_ids=list(seq))),
            pb.ExtractResponse(chunk=chunk)]
    if trailer:
        msgs.append(pb.ExtractResponse(trailer=pb.StreamTrailer(
            request_id=request_id, sequences=1, tokens=len(seq), chunks=1,
            bytes=len(chunk.data))))
    return msgs


def _client_with(messages):
    c = specwire_client.ExtractorClient("127.0.0.1:1")
    call = _Call(messages)
    c.stub = type("Stub", (), {"Extract": lambda self, req, timeout=None: call})()
    return c, call


def test_client_rebuilds_a_scripted_stream():
    c, _ = _client_with(_stream_messages())
    [states] = c.extract([[5, 6, 7]], [1], dtype="fp32", request_id="r1")
    assert states.token_ids == [5, 6, 7]
    assert torch.equal(states["layer.1"], torch.arange(12.0).reshape(3, 4))
    c.close()


@pytest.mark.parametrize("messages,error,match", [
    (_stream_messages(trailer=False), IncompleteStream, "without a trailer"),
    (_stream_messages(crc=123), CorruptStream, "crc32c"),
    (_stream_messages(request_id="other"), CorruptStream, "request_id"),
    (_stream_messages()[1:], CorruptStream, "not the contract"),
    (_stream_messages() + _stream_messages()[2:3], CorruptStream, "after the trailer"),
    (_stream_messages(seq=(5, 6, 8)), CorruptStream, "other token ids"),
    ([], IncompleteStream, "no contract"),
])
def test_client_refuses_broken_streams(messages, error, match):
    c, call = _client_with(messages)
    with pytest.raises(error, match=match):
        c.extract([[5, 6, 7]], [1], dtype="fp32", request_id="r1")
    assert call.cancelled or not messages
    c.close()


def test_dataset_takes_the_old_retry_arguments_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="RetryPolicy"):
        ds = FeatureDataset(None, [[1]], [0], max_retries=7, backoff_initial=0.01,
                            retry_codes=[grpc.StatusCode.UNAVAILABLE],
                            client_factory=lambda: FlakyClient([], {}))
    assert ds.retry == RetryPolicy(max_retries=7, backoff_initial=0.01)
    with pytest.raises(TypeError, match="not both"):
        FeatureDataset(None, [[1]], [0], retry=RetryPolicy(max_retries=1), max_retries=2,
                       client_factory=lambda: FlakyClient([], {}))
    with pytest.raises(TypeError, match="unexpected"):
        FeatureDataset(None, [[1]], [0], max_retry=2, client_factory=lambda: FlakyClient([], {}))
