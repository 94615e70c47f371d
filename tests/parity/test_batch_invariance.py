"""Batch invariance: a sequence's hidden states do not depend on what else shares its batch.

specwire-extract runs every sequence of a request through its own unpadded forward (the default
--batch_layout per_sequence), so each sequence's taps must be bit-identical to an extraction of
that sequence alone, in fp32 and bf16, for dense and hybrid targets. Batch compositions are
random (seeded): different partners, lengths around the delta-rule chunk (64) and the sliding
window, duplicates, and a sequence at different positions of its batch.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import hybrid_fixtures as hy
from hf_fixtures import run_extract, write_tokens

pytestmark = pytest.mark.usefixtures("extract_bin")

SEED = 20261201
LENGTHS = (1, 2, 7, 8, 9, 63, 64, 65, 130)
BATCHES = 6


@pytest.fixture(scope="module")
def targets(checkpoint, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("invariance")
    return {
        "dense_sliding": checkpoint("qwen2_sliding"),
        "dense_llama3": checkpoint("llama_rope3_bias"),
        "hybrid": hy.save_text(hy.random_causal_lm("interval4", seed=5), root / "hybrid"),
    }


def extract(model: Path, seqs: list[list[int]], dtype: str, num_layers: int, out: Path,
            extra: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    tokens = write_tokens(out.with_suffix(".json"), seqs)
    run_extract(["extract", "--model", str(model), "--dtype", dtype, "--tokens_file",
                 str(tokens), "--layers", ",".join(map(str, range(num_layers))), "--embedding",
                 "--final_norm", "--out_dtype", dtype, "--out", str(out), *extra])
    return load_file(out)


def by_sequence(tensors: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    prefix = f"seq.{index}."
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("target", ["dense_sliding", "dense_llama3", "hybrid"])
def test_sequence_states_do_not_depend_on_the_batch(target, dtype, targets, tmp_path) -> None:
    model = targets[target]
    cfg = json.loads((model / "config.json").read_text())
    num_layers, vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
    rng = random.Random(SEED)
    pool = [[rng.randrange(vocab) for _ in range(n)] for n in LENGTHS]
    alone = {}
    for i, seq in enumerate(pool):
        alone[i] = by_sequence(extract(model, [seq], dtype, num_layers, tmp_path / f"a{i}.st"), 0)
    print(f"\n{target} {dtype}: seed {SEED}, {len(pool)} sequences, {BATCHES} batches")
    for b in range(BATCHES):
        members = [rng.randrange(len(pool)) for _ in range(rng.randint(2, 6))]
        got = extract(model, [pool[m] for m in members], dtype, num_layers,
                      tmp_path / f"b{b}.st")
        for position, m in enumerate(members):
            ours = by_sequence(got, position)
            assert ours.keys() == alone[m].keys()
            for tap, want in alone[m].items():
                assert ours[tap].dtype == want.dtype
                assert torch.equal(ours[tap], want), (
                    f"{target} {dtype}: sequence {m} (length {len(pool[m])}) at position "
                    f"{position} of batch {members}: tap {tap} differs from the sequence alone "
                    f"(max abs {(ours[tap].float() - want.float()).abs().max().item():.3e})")


def test_padded_layout_groups_by_length_and_stays_within_rounding(targets, tmp_path) -> None:
    """--batch_layout padded (throughput mode): sequences are grouped by length, every sequence
    comes back in its place, within fp32 rounding of the sequence alone."""
    from hf_fixtures import rel_err

    model = targets["dense_sliding"]
    cfg = json.loads((model / "config.json").read_text())
    rng = random.Random(SEED + 1)
    lengths = [130, 1, 64, 2, 65, 9, 130, 3]
    seqs = [[rng.randrange(cfg["vocab_size"]) for _ in range(n)] for n in lengths]
    layers = cfg["num_hidden_layers"]
    padded = extract(model, seqs, "float32", layers, tmp_path / "padded.st",
                     ("--batch_layout", "padded"))
    for i, seq in enumerate(seqs):
        alone = by_sequence(extract(model, [seq], "float32", layers, tmp_path / f"a{i}.st"), 0)
        ours = by_sequence(padded, i)
        assert ours.keys() == alone.keys()
        for tap, want in alone.items():
            assert ours[tap].shape == want.shape, (i, tap)
            assert rel_err(ours[tap], want) <= 1e-5, (i, tap)
