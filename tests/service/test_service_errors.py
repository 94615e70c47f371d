"""Invalid requests get the right gRPC status code and a message naming the field, through the
Python client (ExtractorError) and, where the client would refuse to send it, the raw stub."""
from __future__ import annotations

import grpc
import pytest
import torch
from extractor_harness import random_sequences

from specwire_client import ExtractorClient, ExtractorError, extractor_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def tokens(*seqs: list[int]) -> list:
    return [pb.SequenceInput(tokens=pb.TokenIds(ids=s)) for s in seqs]


def raw_stream_error(call) -> grpc.RpcError:
    """Consumes a raw streaming call and returns the error it ended with."""
    try:
        for _ in call:
            pass
    except grpc.RpcError as e:
        return e
    raise AssertionError("the call succeeded")


def expect_error(fn, code: grpc.StatusCode, *substrings: str) -> ExtractorError:
    with pytest.raises(ExtractorError) as info:
        fn()
    err = info.value
    assert err.code == code, f"{err.code} != {code}: {err.details}"
    for s in substrings:
        assert s in err.details, f"{s!r} not in {err.details!r}"
    return err


@pytest.fixture(scope="module")
def limits_server(server_factory, checkpoint):
    return server_factory(checkpoint, metrics=False, args=(
        "--max_sequences_per_request=4", "--max_tokens_per_sequence=16",
        "--max_tokens_per_request=40", "--max_new_tokens_limit=8"))


@pytest.fixture(scope="module")
def limited(limits_server):
    with ExtractorClient(limits_server.address, timeout=30) as c:
        yield c


# (id, call on the client, code, substrings of the message)
EXTRACT_CASES = [
    ("token_id_at_vocab", lambda c: c.extract([[1, 512, 3]], [0]), INVALID,
     ["sequences[0].tokens.ids[1] = 512", "outside the vocabulary [0, 512)"]),
    ("token_id_negative", lambda c: c.extract([[4], [1, -1]], [0]), INVALID,
     ["sequences[1].tokens.ids[1] = -1", "outside the vocabulary"]),
    ("layer_id_too_large", lambda c: c.extract([[1, 2]], [0, 3]), INVALID,
     ["layers.layer_ids[1] = 3", "outside [0, 3)", "hidden_states[k+1]"]),
    ("layer_id_negative", lambda c: c.extract([[1, 2]], [-1]), INVALID,
     ["layers.layer_ids[0] = -1"]),
    ("no_sequences", lambda c: c.extract([], [0]), INVALID, ["sequences: no sequence given"]),
    ("empty_sequence", lambda c: c.extract([[1, 2], []], [0]), INVALID, ["sequences[1]: empty"]),
    ("nothing_requested", lambda c: c.extract([[1, 2]], []), INVALID,
     ["layers: nothing requested"]),
    ("text_without_tokenizer", lambda c: c.extract([[1], "hello"], [0]),
     grpc.StatusCode.FAILED_PRECONDITION, ["sequences[1].text", "no tokenizer"]),
    ("generate_max_new_tokens_0", lambda c: c.generate([[1, 2]], 0), INVALID,
     ["max_new_tokens: must be at least 1"]),
    ("generate_max_new_tokens_above_limit", lambda c: c.generate([[1, 2]], 200000), INVALID,
     ["max_new_tokens: 200000 exceeds the limit of 100000"]),
    ("generate_stop_token_outside_vocab", lambda c: c.generate([[1]], 2, stop_token_ids=[600]),
     INVALID, ["stop_token_ids[0] = 600"]),
    ("generate_token_id_at_vocab", lambda c: c.generate([[1], [9, 700]], 2), INVALID,
     ["prompts[1].tokens.ids[1] = 700"]),
    ("generate_empty_prompt", lambda c: c.generate([[]], 2), INVALID, ["prompts[0]: empty"]),
    ("generate_text_without_tokenizer", lambda c: c.generate(["hi"], 2),
     grpc.StatusCode.FAILED_PRECONDITION, ["prompts[0].text"]),
    ("tokenize_without_tokenizer", lambda c: c.tokenize(["hi"]),
     grpc.StatusCode.FAILED_PRECONDITION, ["no tokenizer"]),
    ("get_tensors_unknown", lambda c: c.get_tensors(["model.nope.weight"]),
     grpc.StatusCode.NOT_FOUND, ["names[0]", "model.nope.weight"]),
    ("get_tensors_none", lambda c: c.get_tensors([]), INVALID, ["names: no tensor named"]),
]


@pytest.mark.parametrize("call,code,substrings", [c[1:] for c in EXTRACT_CASES],
                         ids=[c[0] for c in EXTRACT_CASES])
def test_invalid_request(client, call, code, substrings):
    err = expect_error(lambda: call(client), code, *substrings)
    assert err.method  # the error names the RPC


@pytest.mark.parametrize("value", [7, 3, -2])
def test_unknown_dtype_enum(client, value):
    """Enum values outside BF16 / F32 (F16 = 3 is for GetTensors only) are refused, whatever
    number the wire carries."""
    req = pb.ExtractRequest(sequences=tokens([1, 2]), layers=pb.LayerSelection(layer_ids=[0]),
                            dtype=value)
    e = raw_stream_error(client.stub.Extract(req, timeout=10))
    assert e.code() == INVALID and f"dtype: {value} is not a hidden-state dtype" in e.details()
    greq = pb.GenerateRequest(prompts=tokens([1]), max_new_tokens=1, dtype=value)
    e = raw_stream_error(client.stub.Generate(greq, timeout=10))
    assert e.code() == INVALID and "dtype:" in e.details()


def test_sequence_input_with_neither_tokens_nor_text(client):
    req = pb.ExtractRequest(sequences=[pb.SequenceInput()],
                            layers=pb.LayerSelection(layer_ids=[0]))
    e = raw_stream_error(client.stub.Extract(req, timeout=10))
    assert e.code() == INVALID and "sequences[0]: neither tokens nor text" in e.details()


def test_client_side_argument_checks(client):
    with pytest.raises(ValueError, match="dtype"):
        client.extract([[1]], [0], dtype="fp16")
    with pytest.raises(TypeError):
        client.extract("not a list of sequences", [0])
    with pytest.raises(TypeError):
        client.extract([[1, 2]], ["0"])


LIMIT_CASES = [
    ("too_many_sequences", lambda c: c.extract([[1]] * 5, [0]),
     ["sequences: 5 sequences exceed the limit of 4", "--max_sequences_per_request"]),
    ("sequence_too_long", lambda c: c.extract([[1] * 17], [0]),
     ["sequences[0]: 17 tokens exceed the limit of 16", "--max_tokens_per_sequence"]),
    ("too_many_tokens", lambda c: c.extract([[1] * 15] * 3, [0]),
     ["sequences: 45 tokens in all exceed the limit of 40", "--max_tokens_per_request"]),
    ("too_many_prompts", lambda c: c.generate([[1]] * 5, 2),
     ["prompts: 5 sequences exceed the limit of 4"]),
    ("max_new_tokens_above_limit", lambda c: c.generate([[1]], 9),
     ["max_new_tokens: 9 exceeds the limit of 8", "--max_new_tokens"]),
]


@pytest.mark.parametrize("call,substrings", [c[1:] for c in LIMIT_CASES],
                         ids=[c[0] for c in LIMIT_CASES])
def test_limits(limited, call, substrings):
    expect_error(lambda: call(limited), INVALID, *substrings)


def test_requests_at_the_limits_pass(limited):
    seqs = random_sequences([16, 16, 8], seed=5)  # 40 tokens, 3 sequences
    out = limited.extract(seqs, [0])
    assert [o["layer.0"].shape[0] for o in out] == [16, 16, 8]
    [g] = limited.generate([[1, 2]], 8, ignore_model_eos=True)
    assert len(g.completion_ids) == 8


def test_server_still_serves_after_errors(client):
    out = client.extract([[1, 2, 3]], [0], dtype="fp32")
    assert out[0]["layer.0"].shape == (3, 64) and torch.isfinite(out[0]["layer.0"]).all()
