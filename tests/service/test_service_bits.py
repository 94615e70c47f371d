"""Tensors through the server and the Python client are bit-identical to the in-process engine
(specwire-extract), for the same checkpoint, compute dtype, wire dtype and sequences.

Both run their sequences as one right-padded batch, so the same request composition is compared.
The server does not promise bit-identity across batch compositions (see
test_batch_composition_changes_low_bits): libtorch's CPU kernels pick their blocking from the
padded shape.
"""
from __future__ import annotations

import pytest
import torch
from extractor_harness import cli_extract, random_sequences

from specwire_client import ExtractorClient

LAYERS = [0, 1, 2]
SEQUENCES = random_sequences([5, 17, 33, 9, 24], seed=1)

# (server compute dtype, wire dtype asked of the server, CLI --out_dtype, expected torch dtype)
CASES = [
    ("float32", "fp32", "float32", torch.float32),
    ("float32", "bf16", "bfloat16", torch.bfloat16),
    ("bfloat16", "bf16", "bfloat16", torch.bfloat16),
    ("bfloat16", "fp32", "float32", torch.float32),
]


@pytest.fixture(scope="module")
def servers(server_factory, checkpoint, fp32_server):
    return {"float32": fp32_server,
            "bfloat16": server_factory(checkpoint, dtype="bfloat16", metrics=False)}


def first_difference(name: str, got: torch.Tensor, ref: torch.Tensor) -> str:
    diff = got.float() != ref.float()
    d = (got.float() - ref.float()).abs().max().item()
    return f"{name}: {int(diff.sum())}/{ref.numel()} elements differ, max |diff| {d:.3e}"


@pytest.mark.parametrize("compute,wire,out_dtype,torch_dtype", CASES,
                         ids=[f"{c}-wire_{w}" for c, w, _, _ in CASES])
def test_client_matches_offline_engine_bit_for_bit(servers, checkpoint, tmp_path, compute, wire,
                                                   out_dtype, torch_dtype):
    ref, meta = cli_extract(checkpoint, SEQUENCES, tmp_path / "ref.safetensors", dtype=compute,
                            out_dtype=out_dtype, layers=LAYERS)
    with ExtractorClient(servers[compute].address, timeout=60) as c:
        # Small chunks: every state arrives in several pieces and is rebuilt by the client.
        res = c.extract_stream(SEQUENCES, LAYERS, embedding=True, final_norm=True, dtype=wire,
                               max_chunk_bytes=1000)
    assert res.contract.weights_digest == meta["contract"]["weights_digest"]
    assert res.contract.compute_dtype == meta["contract"]["compute_dtype"] == compute
    assert res.trailer.chunks > len(SEQUENCES) * (len(LAYERS) + 2)  # really chunked
    problems = []
    for i, states in enumerate(res.sequences):
        assert states.token_ids == SEQUENCES[i]
        assert list(states) == ["embedding"] + [f"layer.{k}" for k in LAYERS] + ["final_norm"]
        for name, got in states.items():
            want = ref[f"seq.{i}.{name}"]
            assert got.dtype == torch_dtype and got.shape == (len(SEQUENCES[i]), 64)
            if not torch.equal(got, want):
                problems.append(f"seq {i} " + first_difference(name, got, want))
    assert not problems, "\n".join(problems)


def test_generate_states_match_extract_of_the_trajectory(client):
    """Generate's states are those of prompt + completion, as Extract gives them."""
    prompt = random_sequences([6], seed=2)[0]
    [g] = client.generate([prompt], 7, ignore_model_eos=True, layer_ids=[2, 0], final_norm=True,
                          dtype="fp32")
    assert g.prompt_ids == prompt and len(g.completion_ids) == 7
    assert g.finish_reason == "max_new_tokens"
    [e] = client.extract([g.token_ids], [2, 0], final_norm=True, dtype="fp32")
    assert list(g.states) == ["layer.2", "layer.0", "final_norm"]
    for name in e:
        assert g.states[name].shape == (13, 64)
        assert torch.equal(g.states[name], e[name]), name


def test_batch_composition_changes_only_low_bits(servers):
    """A sequence alone vs padded in a batch with a longer one: equal up to GEMM rounding.

    The engine pads concurrent requests into one forward pass; matrix products of a different
    row count round differently in the last bits (measured here: fp32 ~2e-8 abs / 3e-7 rel once
    batch x padded length >= 12 rows; bf16 1 ulp once the padded length >= 16). Requests that
    must be bit-reproducible run with --max_batch_tokens 1 (no cross-request batching), which
    test_concurrent_clients_get_their_own_exact_data covers. This test pins the size of the effect.
    """
    a, longer = random_sequences([9, 16], seed=3)
    for compute, server in servers.items():
        with ExtractorClient(server.address, timeout=60) as c:
            alone = c.extract([a], LAYERS, final_norm=True, dtype="fp32")[0]
            batched = c.extract([a, longer], LAYERS, final_norm=True, dtype="fp32")[0]
        tol = 1e-6 if compute == "float32" else 1e-2
        for n in alone:
            rel = ((batched[n] - alone[n]).norm() / alone[n].norm()).item()
            assert rel <= tol, f"{compute} {n}: relative difference {rel:.3g} > {tol}"


def test_same_request_twice_is_deterministic(client):
    seqs = random_sequences([4, 11], seed=4)
    one = client.extract(seqs, [1], dtype="fp32")
    two = client.extract(seqs, [1], dtype="fp32")
    for x, y in zip(one, two):
        assert torch.equal(x["layer.1"], y["layer.1"])


def test_bound_threads_change_no_bit(server_factory, checkpoint, tmp_path):
    """--cpu_binding=cores pins the engine's intra-op threads; the states are bit-identical to
    an unbound server's with as many threads. A value it cannot bind stops the server at start,
    naming the flag."""
    import subprocess

    from extractor_harness import binary
    bound = server_factory(checkpoint, args=("--threads=2", "--cpu_binding=cores"),
                           metrics=False)
    unbound = server_factory(checkpoint, args=("--threads=2", "--cpu_binding=none"),
                             metrics=False)
    with ExtractorClient(bound.address, timeout=60) as b, \
            ExtractorClient(unbound.address, timeout=60) as u:
        got = b.extract(SEQUENCES, LAYERS, dtype="fp32", final_norm=True)
        ref = u.extract(SEQUENCES, LAYERS, dtype="fp32", final_norm=True)
    for g, r in zip(got, ref):
        assert g.keys() == r.keys()
        for name in r:
            assert torch.equal(g[name], r[name]), first_difference(name, g[name], r[name])
    out = subprocess.run([str(binary("specwire-extractor")), f"--model={checkpoint}",
                          "--listen=127.0.0.1:0", "--metrics_listen=", "--cpu_binding=0-100000"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--cpu_binding=0-100000" in out.stderr and "none | cores" in out.stderr, out.stderr
