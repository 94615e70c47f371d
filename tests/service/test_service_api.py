"""The API around the hidden states: contract checks, health and reflection for stock grpcio
clients, metrics, tokenizer calls, GetTensors, and the client's load-balanced targets."""
from __future__ import annotations

import dataclasses

import time

import grpc
import pytest
import torch
from extractor_harness import hf_fixtures, metric_value, random_sequences, wait_for_metric
from grpc_health.v1 import health_pb2, health_pb2_grpc
from safetensors.torch import load_file

import specwire_client
from specwire_client import (ContractExpectation, ContractMismatch, ExtractorClient,
                             ExtractorError)


def test_model_info_is_the_full_contract(client, checkpoint):
    c = client.model_info()
    assert dataclasses.asdict(c).keys() == {f.name for f in
                                            specwire_client.extractor_pb2.ExtractionContract
                                            .DESCRIPTOR.fields}
    assert (c.architecture, c.model_type, c.source_layout) == ("Qwen3ForCausalLM", "qwen3", "text")
    assert (c.num_layers, c.hidden_size, c.vocab_size) == (3, 64, 512)
    assert c.layer_types == ("full_attention",) * 3 and c.devices == ("cpu",) * 3
    assert c.compute_dtype == "float32" and c.weights_digest.startswith("xxh3-128:")
    assert c.tokenizer_digest == "" and c.specwire_version
    assert c.tensors_loaded > 0 and c.tensors_skipped == 0
    assert c.hf_hidden_states_index("layer.0") == 1 and c.hf_hidden_states_index("final_norm") == 3


def test_contract_mismatch_before_any_chunk(client, monkeypatch):
    """A drafter trained for a 64-layer target must not consume a 3-layer extractor's states:
    ContractMismatch names the field, and no chunk is read."""
    added = []
    real_add = specwire_client._assembly.StateAssembler.add
    monkeypatch.setattr(specwire_client._assembly.StateAssembler, "add",
                        lambda self, chunk: added.append(chunk) or real_add(self, chunk))
    expect = ContractExpectation(num_layers=64, hidden_size=5120,
                                 target_layer_ids=[1, 16, 31, 46, 61])
    with pytest.raises(ContractMismatch) as info:
        client.extract([[1, 2, 3]] * 4, [0, 1, 2], dtype="fp32", expect=expect)
    e = info.value
    assert (e.field, e.expected, e.actual) == ("num_layers", 64, 3)
    assert "num_layers" in str(e) and "64" in str(e) and "3" in str(e)
    assert e.code == grpc.StatusCode.FAILED_PRECONDITION and isinstance(e, ExtractorError)
    assert added == []
    with pytest.raises(ContractMismatch, match="target_layer_ids"):
        client.generate([[1]], 2, layer_ids=[0],
                        expect=ContractExpectation(num_layers=3, target_layer_ids=[1, 3]))
    with pytest.raises(ContractMismatch, match="architecture"):
        client.check_contract(ContractExpectation(architecture="Qwen3_5ForCausalLM"))
    # The matching expectation passes, and chunks are then read.
    good = ContractExpectation.from_contract(client.model_info(), target_layer_ids=[0, 2])
    assert client.extract([[1, 2, 3]], [0, 2], expect=good)[0]["layer.2"].shape == (3, 64)
    assert added


def test_health_for_a_stock_grpc_client(fp32_server):
    with grpc.insecure_channel(fp32_server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "specwire.v1.Extractor"):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as info:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_for_a_stock_grpc_client(fp32_server):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)

    with grpc.insecure_channel(fp32_server.address) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = db.get_services()
        assert "specwire.v1.Extractor" in services
        assert "grpc.health.v1.Health" in services
        svc = DescriptorPool(db).FindServiceByName("specwire.v1.Extractor")
        assert {m.name for m in svc.methods} == {"GetModelInfo", "Extract", "Generate", "Tokenize",
                                                 "Detokenize", "GetTensors", "Session"}
        chunk = DescriptorPool(db).FindMessageTypeByName("specwire.v1.HiddenStateChunk")
        assert "hf_hidden_states_index" in chunk.fields_by_name


def test_metrics_endpoint(fp32_server, client):
    client.extract([[1, 2, 3, 4]], [0], dtype="bf16")
    with pytest.raises(ExtractorError):
        client.extract([[1, 999]], [0])
    # A call is counted when the server finishes it, which may come after the client has its
    # status: wait for the refused one before reading the rest.
    wait_for_metric(fp32_server, "specwire_extractor_requests_total", lambda v: v >= 1,
                    method="Extract", code="INVALID_ARGUMENT")
    text = fp32_server.metrics()
    for name in ("specwire_extractor_requests_total", "specwire_extractor_tokens_total",
                 "specwire_extractor_streamed_bytes_total",
                 "specwire_extractor_request_duration_seconds_bucket",
                 "specwire_extractor_batch_requests_bucket",
                 "specwire_extractor_batch_tokens_bucket",
                 "specwire_extractor_queue_wait_seconds_bucket",
                 "specwire_extractor_queue_depth", "specwire_extractor_active_streams"):
        assert f"\n{name}" in text, name
    assert "# TYPE specwire_extractor_requests_total counter" in text
    assert metric_value(text, "specwire_extractor_requests_total", method="Extract",
                        code="OK") >= 1
    assert metric_value(text, "specwire_extractor_requests_total", method="Extract",
                        code="INVALID_ARGUMENT") >= 1
    assert metric_value(text, "specwire_extractor_tokens_total", method="Extract") >= 4
    assert metric_value(text, "specwire_extractor_streamed_bytes_total") >= 4 * 64 * 2


def test_get_tensors_match_the_checkpoint(client, checkpoint):
    stored = load_file(str(checkpoint / "model.safetensors"))
    names = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
             "model.layers.1.self_attn.q_proj.weight"]
    got = client.get_tensors(names, max_chunk_bytes=3000)  # many chunks per tensor
    assert list(got) == names
    for n in names:
        src = "model.embed_tokens.weight" if n == "lm_head.weight" else n  # tied
        assert got[n].dtype == stored[src].dtype and torch.equal(got[n], stored[src]), n


def test_get_tensors_digest_is_checked(client, monkeypatch):
    """A tensor whose bytes do not match the digest the server sent is refused."""
    pytest.importorskip("xxhash")
    from specwire_client import client as client_mod

    monkeypatch.setattr(client_mod._xxhash, "xxh3_128",
                        lambda data: type("H", (), {"hexdigest": lambda self: "0" * 32})())
    with pytest.raises(specwire_client.CorruptStream, match="digest"):
        client.get_tensors(["model.norm.weight"])


def test_generate_stops_and_reports_why(client, checkpoint):
    prompt = random_sequences([5], seed=6)[0]
    [free] = client.generate([prompt], 6, ignore_model_eos=True)
    assert free.finish_reason == "max_new_tokens" and len(free.completion_ids) == 6
    assert free.states == {}
    ref = hf_fixtures.hf_greedy(checkpoint, prompt, 6, eos=None)
    assert free.completion_ids == ref
    stop = free.completion_ids[2]
    [stopped] = client.generate([prompt], 6, stop_token_ids=[stop], ignore_model_eos=True)
    first = free.completion_ids.index(stop)
    assert stopped.completion_ids == free.completion_ids[:first + 1]
    assert stopped.finish_reason == "stop_token"


def test_text_inputs_with_a_tokenizer(server_factory, checkpoint_with_tokenizer):
    from tokenizers import Tokenizer

    server = server_factory(checkpoint_with_tokenizer, metrics=False)
    hf = Tokenizer.from_file(str(checkpoint_with_tokenizer / "tokenizer.json"))
    texts = ["the quick brown fox", "hidden states feed the drafter"]
    with ExtractorClient(server.address, timeout=30) as c:
        ids = c.tokenize(texts)
        assert ids == [hf.encode(t).ids for t in texts]
        assert c.tokenize("the lazy dog") == [hf.encode("the lazy dog").ids]
        assert c.detokenize(ids) == texts
        assert c.model_info().tokenizer_digest.startswith("xxh3-128:")
        by_text = c.extract(texts, [1], dtype="fp32")
        by_ids = c.extract(ids, [1], dtype="fp32")
        for t, i, want in zip(by_text, by_ids, ids):
            assert t.token_ids == want and torch.equal(t["layer.1"], i["layer.1"])
        [g] = c.generate([texts[0]], 3, ignore_model_eos=True)
        assert g.prompt_ids == ids[0]


def test_client_balances_over_a_list_of_addresses(server_factory, checkpoint, fp32_server):
    """A list of addresses is one round-robin channel: requests reach both servers."""
    other = server_factory(checkpoint)
    before = [metric_value(s.metrics(), "specwire_extractor_requests_total",
                           method="GetModelInfo", code="OK") for s in (fp32_server, other)]
    calls = 0
    with ExtractorClient([fp32_server.address, other.address], timeout=30) as c:
        assert c.target.startswith("ipv4:")
        c.wait_ready()
        # round_robin uses a subchannel once it is connected: a few calls may go to one server
        # before the other is up; then they alternate.
        served = [0, 0]
        give_up = time.monotonic() + 20  # a loaded machine may connect the second one late
        while min(served) < 3 and time.monotonic() < give_up:
            time.sleep(0.02)
            c.model_info()
            calls += 1
            served = [metric_value(s.metrics(), "specwire_extractor_requests_total",
                                   method="GetModelInfo", code="OK") - b
                      for s, b in zip((fp32_server, other), before)]
        out = c.extract([[1, 2]], [0], dtype="fp32")
        assert out[0]["layer.0"].shape == (2, 64)
    assert sum(served) == calls and min(served) >= 3, served
    with ExtractorClient(f"dns:///localhost:{other.port}", timeout=30) as c:
        assert c.model_info().num_layers == 3


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_generate_features_equal_an_extract_of_the_same_tokens(server_factory, checkpoint,
                                                               compute):
    """Generation goes through the extraction forward: the states of prompt + completion that
    Generate returns are bit-identical to an Extract of those tokens, alone or batched with other
    sequences (the default --batch_layout packed)."""
    server = server_factory(checkpoint, dtype=compute)
    prompts = random_sequences([3, 17, 40], seed=21)
    with ExtractorClient(server.address, timeout=120) as c:
        generated = c.generate(prompts, 12, ignore_model_eos=True, layer_ids=[0, 2],
                               final_norm=True, embedding=True, dtype="fp32")
        partners = random_sequences([5, 66, 1], seed=22)
        for g in generated:
            [alone] = c.extract([g.token_ids], [0, 2], final_norm=True, embedding=True,
                                dtype="fp32")
            batched = c.extract(partners[:2] + [g.token_ids] + partners[2:], [0, 2],
                                final_norm=True, embedding=True, dtype="fp32")[2]
            assert g.states.keys() == alone.keys() == batched.keys()
            for name, want in g.states.items():
                assert torch.equal(alone[name], want), f"{compute}: Extract {name} != Generate"
                assert torch.equal(batched[name], want), f"{compute}: batched {name} != Generate"
