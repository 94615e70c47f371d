"""Batch invariance: a sequence's hidden states do not depend on what else shares its batch.

Both batch-invariant layouts of specwire-extract: packed (the default: the sequences of a
request packed without padding, every layer's matrix products over all of their rows, attention
and recurrences per sequence; forwards of up to 2,048 tokens) and per_sequence (each sequence
its own forward). Each sequence's taps must be bit-identical to an extraction of that sequence
alone, in fp32 and bf16, for dense and hybrid targets. Batch compositions are random (seeded):
different partners, lengths around the delta-rule chunk (64), the sliding window and the row
quantum of the matrix products, duplicates, a sequence at different positions of its batch,
many one-token sequences, and requests longer than one packed forward.
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
LENGTHS = (1, 2, 3, 5, 7, 8, 9, 63, 64, 65, 130, 517, 1100)
BATCHES = 8


@pytest.fixture(scope="module")
def targets(checkpoint, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("invariance")
    return {
        "dense_sliding": checkpoint("qwen2_sliding"),
        "dense_llama3": checkpoint("llama_rope3_bias"),
        "dense_mqa": checkpoint("qwen3_mqa_untied"),
        "hybrid": hy.save_text(hy.random_causal_lm("interval4", seed=5), root / "hybrid"),
        "hybrid_one_key_head_vlm": hy.save_vlm(hy.random_causal_lm("one_key_head", seed=6),
                                               root / "hybrid_vlm"),
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


def compositions(rng: random.Random, pool: list[list[int]]) -> list[list[int]]:
    """Batches of pool indices: random partners (2 to 6), then many one-token sequences with a
    long one among them, then more tokens than one packed forward holds."""
    batches = [[rng.randrange(len(pool)) for _ in range(rng.randint(2, 6))] for _ in range(BATCHES)]
    short = [i for i, seq in enumerate(pool) if len(seq) <= 3]
    many = [rng.choice(short) for _ in range(rng.randint(9, 17))]
    many.insert(rng.randrange(len(many)), len(pool) - 2)
    batches.append(many)
    longest = [len(pool) - 1, len(pool) - 2, len(pool) - 1, rng.randrange(len(pool))]
    rng.shuffle(longest)
    batches.append(longest)
    return batches


# Every target packed (the default); per_sequence (invariant by construction) on one dense and
# one hybrid target.
CASES = [(t, "packed") for t in ("dense_sliding", "dense_llama3", "dense_mqa", "hybrid",
                                 "hybrid_one_key_head_vlm")]
CASES += [("dense_sliding", "per_sequence"), ("hybrid", "per_sequence")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("target", "layout"), CASES)
def test_sequence_states_do_not_depend_on_the_batch(target, dtype, layout, targets,
                                                    tmp_path) -> None:
    model = targets[target]
    cfg = json.loads((model / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    num_layers, vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
    rng = random.Random(SEED)
    pool = [[rng.randrange(vocab) for _ in range(n)] for n in LENGTHS]
    flags = ("--batch_layout", layout)
    alone = {}
    for i, seq in enumerate(pool):
        alone[i] = by_sequence(
            extract(model, [seq], dtype, num_layers, tmp_path / f"a{i}.st", flags), 0)
    batches = compositions(rng, pool)
    print(f"\n{target} {dtype} {layout}: seed {SEED}, {len(pool)} sequences, "
          f"{len(batches)} batches")
    for b, members in enumerate(batches):
        got = extract(model, [pool[m] for m in members], dtype, num_layers,
                      tmp_path / f"b{b}.st", flags)
        for position, m in enumerate(members):
            ours = by_sequence(got, position)
            assert ours.keys() == alone[m].keys()
            for tap, want in alone[m].items():
                assert ours[tap].dtype == want.dtype
                assert torch.equal(ours[tap], want), (
                    f"{target} {dtype} {layout}: sequence {m} (length {len(pool[m])}) at "
                    f"position {position} of batch {members}: tap {tap} differs from the "
                    f"sequence alone (max abs "
                    f"{(ours[tap].float() - want.float()).abs().max().item():.3e})")


def test_packed_and_per_sequence_agree_to_rounding(targets, tmp_path) -> None:
    """The two invariant layouts run the same math (the packed products run on a few padding
    rows more): their states agree to fp32 rounding."""
    from hf_fixtures import rel_err

    model = targets["hybrid"]
    cfg = json.loads((model / "config.json").read_text())
    rng = random.Random(SEED + 2)
    seqs = [[rng.randrange(cfg["vocab_size"]) for _ in range(n)] for n in (5, 130, 1, 66)]
    layers = cfg["num_hidden_layers"]
    packed = extract(model, seqs, "float32", layers, tmp_path / "packed.st")
    per = extract(model, seqs, "float32", layers, tmp_path / "per.st",
                  ("--batch_layout", "per_sequence"))
    assert packed.keys() == per.keys()
    for key, want in per.items():
        assert packed[key].shape == want.shape, key
        assert rel_err(packed[key], want) <= 1e-5, key


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
