"""Parity of specwire-extract with transformers on the dense architectures (Llama, Qwen2, Qwen3).

transformers is the oracle: hidden states, greedy trajectories and checkpoint layouts are whatever
AutoModelForCausalLM does with the same tiny random checkpoint. Every CLI call carries a whole
batch, so the suite stays within a minute and a half on two cores.

Tap convention checked here (docs/ARCHITECTURE.md, "Contracts"): embedding = hidden_states[0]; layer k =
output of decoder layer k = hidden_states[k + 1]; final_norm = hidden_states[L]. transformers puts
the final-norm output, not layer L-1's raw output, at hidden_states[L], so the oracle of layer L-1
is read at the input of the final norm (see hf_fixtures.hf_taps).
"""
from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hf_fixtures import (DENSE_CONFIGS, greedy, hf_taps, load_hf_model, rel_err, run_extract,
                         write_tokens)

# dtype name -> (torch dtype, tolerance on ||ours - hf|| / ||hf|| per captured tensor)
DTYPES: dict[str, tuple[torch.dtype, float]] = {
    "float32": (torch.float32, 1e-5),
    "bfloat16": (torch.bfloat16, 1e-2),
}
SEQ_LENGTHS = (1, 7, 33, 130)  # one batch; 130 > the sliding window (8)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
MAX_NEW_TOKENS = 24
CONFIG_NAMES = list(DENSE_CONFIGS)

pytestmark = pytest.mark.usefixtures("extract_bin")  # a missing build fails with one clear line


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def parity_sequences(vocab_size: int) -> list[list[int]]:
    rng = random.Random(1234)
    seqs = [[rng.randrange(vocab_size) for _ in range(n)] for n in SEQ_LENGTHS]
    seqs[2][0], seqs[2][-1] = 0, vocab_size - 1  # both ends of the vocabulary
    return seqs


def generation_prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(99)
    return [[rng.randrange(vocab_size)], [rng.randrange(vocab_size) for _ in range(20)]]


def all_layers(num_layers: int) -> str:
    return ",".join(str(k) for k in range(num_layers))


def first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.fixture(scope="session")
def full_capture(checkpoint, extract_bin, tmp_path_factory) -> Callable:
    """full_capture(name, dtype_name, kernel) -> (checkpoint dir, tokens file, sequences, tensors)
    of ONE extract call capturing every layer, the embedding and the final norm of the whole batch
    (--kernels `kernels`: auto, the dense families' fast set, or reference)."""
    root = tmp_path_factory.mktemp("capture")
    done: dict[tuple[str, str, str], tuple] = {}

    def get(name: str, dtype_name: str,
            kernels: str = "auto") -> tuple[Path, Path, list[list[int]], dict]:
        if (name, dtype_name, kernels) not in done:
            path = checkpoint(name)
            cfg = read_config(path)
            seqs = parity_sequences(cfg["vocab_size"])
            tokens = write_tokens(root / f"{name}.json", seqs)
            out = root / f"{name}-{dtype_name}-{kernels}.safetensors"
            run_extract(["extract", "--model", str(path), "--dtype", dtype_name,
                         "--tokens_file", str(tokens), "--layers",
                         all_layers(cfg["num_hidden_layers"]), "--embedding", "--final_norm",
                         "--kernels", kernels, "--out", str(out)])
            done[(name, dtype_name, kernels)] = (path, tokens, seqs, load_file(out))
        return done[(name, dtype_name, kernels)]

    return get


# ---------------------------------------------------------------------------------------------
# Hidden states


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_hidden_states_match_transformers(name, dtype_name, kernels, full_capture, hf_model,
                                          worst_errors):
    dtype, tol = DTYPES[dtype_name]
    _, _, seqs, got = full_capture(name, dtype_name, kernels)
    ref = hf_taps(hf_model(name, dtype), seqs)

    expected = {f"seq.{i}.{tap}" for i, taps in enumerate(ref) for tap in taps}
    assert set(got) == expected, (
        f"{name} {dtype_name}: tensor names differ; missing {sorted(expected - set(got))}, "
        f"extra {sorted(set(got) - expected)}")

    failures: list[str] = []
    worst = (0.0, "")
    for i, taps in enumerate(ref):
        for tap, want in taps.items():
            where = f"seq {i} (len {len(seqs[i])}) tap {tap}"
            ours = got[f"seq.{i}.{tap}"]
            assert ours.dtype == torch.float32, f"{name} {dtype_name} {where}: dtype {ours.dtype}"
            assert ours.shape == want.shape, (
                f"{name} {dtype_name} {where}: shape {list(ours.shape)} != {list(want.shape)}")
            err = rel_err(ours, want)
            if not err <= tol:  # also catches NaN
                failures.append(f"{name} {dtype_name} {where}: rel err {err:.3e} > {tol:.0e}")
            if not err <= worst[0]:
                worst = (err, where)
    worst_errors[(name, f"{dtype_name} {kernels}")] = (worst[0], tol, worst[1])
    assert not failures, f"{len(failures)} tensor(s) off:\n" + "\n".join(failures)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", ["qwen3_gqa2_tied", "qwen2_sliding", "llama_rope3_bias"])
def test_capture_subset_is_exact(name, dtype_name, full_capture, tmp_path):
    """Asking for layer 1 alone returns exactly seq.i.layer.1, bit-identical to the full capture."""
    path, tokens, seqs, full = full_capture(name, dtype_name)
    out = tmp_path / "layer1.safetensors"
    run_extract(["extract", "--model", str(path), "--dtype", dtype_name, "--tokens_file",
                 str(tokens), "--layers", "1", "--out", str(out)])
    got = load_file(out)
    assert set(got) == {f"seq.{i}.layer.1" for i in range(len(seqs))}
    for key, t in got.items():
        assert torch.equal(t, full[key]), f"{name} {dtype_name} {key}: differs from full capture"


def test_out_dtype_bfloat16_is_rounded_float32(full_capture, tmp_path):
    """--out_dtype bfloat16 writes the fp32 states rounded to bf16, nothing else."""
    path, tokens, seqs, full = full_capture("qwen3_mqa_untied", "float32")
    out = tmp_path / "bf16.safetensors"
    run_extract(["extract", "--model", str(path), "--tokens_file", str(tokens), "--layers", "2",
                 "--final_norm", "--out_dtype", "bfloat16", "--out", str(out)])
    got = load_file(out)
    assert set(got) == {f"seq.{i}.{t}" for i in range(len(seqs)) for t in ("layer.2", "final_norm")}
    for key, t in got.items():
        assert t.dtype == torch.bfloat16, key
        assert torch.equal(t, full[key].to(torch.bfloat16)), key


# ---------------------------------------------------------------------------------------------
# Greedy generation (fp32)


def cli_generate(path: Path, prompts: list[list[int]], *extra: str) -> list[dict]:
    tokens = ";".join(",".join(map(str, p)) for p in prompts)
    res = run_extract(["generate", "--model", str(path), "--tokens", tokens,
                       "--max_new_tokens", str(MAX_NEW_TOKENS), *extra])
    out = json.loads(res.stdout)
    return out if isinstance(out, list) else [out]


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_greedy_matches_generate(name, checkpoint, hf_model):
    path = checkpoint(name, "gen")
    model = hf_model(name, torch.float32, "gen")
    prompts = generation_prompts(model.config.vocab_size)
    ours = cli_generate(path, prompts, "--ignore_model_eos")
    assert len(ours) == len(prompts)
    for prompt, got in zip(prompts, ours):
        want = greedy(model, prompt, MAX_NEW_TOKENS, eos=None)
        assert len(set(want)) >= 4, f"{name}: degenerate oracle trajectory {want}"
        at = first_divergence(got["tokens"], want)
        assert got["tokens"] == want, (
            f"{name} prompt len {len(prompt)}: diverges at step {at}\n"
            f"  ours {got['tokens']}\n  hf   {want}")
        assert got["finish_reason"] == "max_new_tokens"


def test_greedy_stop_token_matches_generate(checkpoint, hf_model, tmp_path):
    """Stop at the token HF emits at step 5: both stop at its first occurrence and keep it; the
    same holds when it is config.json's eos_token_id instead of --stop."""
    name = "qwen2_bias_mha"
    path = checkpoint(name, "gen")
    model = hf_model(name, torch.float32, "gen")
    prompt = generation_prompts(model.config.vocab_size)[1]
    free = greedy(model, prompt, MAX_NEW_TOKENS, eos=None)
    stop = free[5]
    expected = free[:free.index(stop) + 1]

    assert greedy(model, prompt, MAX_NEW_TOKENS, eos=[stop]) == expected
    [got] = cli_generate(path, [prompt], "--ignore_model_eos", "--stop", str(stop))
    assert got == {"tokens": expected, "finish_reason": "stop_token"}, f"stop token {stop}"

    # The same token as the checkpoint's own eos: the CLI reads config.json, HF its
    # generation_config.json; write it into both and run both with their defaults.
    eos_path = tmp_path / f"{name}-eos"
    shutil.copytree(path, eos_path)
    for fname in ("config.json", "generation_config.json"):
        cfg = json.loads((eos_path / fname).read_text())
        cfg["eos_token_id"] = stop
        (eos_path / fname).write_text(json.dumps(cfg))
    eos_model = load_hf_model(eos_path, torch.float32)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        hf = eos_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=MAX_NEW_TOKENS, pad_token_id=0)
    assert hf[0, len(prompt):].tolist() == expected
    [got] = cli_generate(eos_path, [prompt])
    assert got == {"tokens": expected, "finish_reason": "stop_token"}, f"config eos {stop}"
    [got] = cli_generate(eos_path, [prompt], "--ignore_model_eos")
    assert got == {"tokens": free, "finish_reason": "max_new_tokens"}


# ---------------------------------------------------------------------------------------------
# Extraction contract


def info(path: Path, dtype_name: str = "float32") -> dict:
    return json.loads(run_extract(["info", "--model", str(path), "--dtype", dtype_name]).stdout)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_info_contract(name, checkpoint):
    path = checkpoint(name)
    cfg = read_config(path)
    with safe_open(path / "model.safetensors", "pt") as f:
        saved = set(f.keys())
    # Llama's config has no layer_types (every layer is full attention); ask transformers.
    layer_types = getattr(transformers.AutoConfig.from_pretrained(path), "layer_types", None)
    layer_types = layer_types or ["full_attention"] * cfg["num_hidden_layers"]
    by_dtype = {d: info(path, d) for d in DTYPES}
    for dtype_name, c in by_dtype.items():
        assert c["architecture"] == ARCHITECTURES[cfg["model_type"]] == cfg["architectures"][0]
        assert c["model_type"] == cfg["model_type"]
        assert c["source_layout"] == "text"
        assert c["num_layers"] == cfg["num_hidden_layers"]
        assert c["hidden_size"] == cfg["hidden_size"]
        assert c["vocab_size"] == cfg["vocab_size"]
        assert c["layer_types"] == layer_types, c["layer_types"]
        assert c["compute_dtype"] == dtype_name
        assert c["weights_digest"], "empty weights_digest"
        # transformers 5 does not save lm_head.weight when tie_word_embeddings is set; should a
        # checkpoint carry one anyway, it is counted as skipped (test_present_tied_lm_head...).
        tied_head_saved = cfg["tie_word_embeddings"] and "lm_head.weight" in saved
        assert c["tensors_skipped"] == int(tied_head_saved), c["skipped"]
        assert c["tensors_loaded"] == len(saved) - int(tied_head_saved)
    assert by_dtype["float32"]["weights_digest"] == by_dtype["bfloat16"]["weights_digest"], (
        "weights_digest must describe the checkpoint, not the compute dtype")


def test_weights_digest_changes_with_weights(checkpoint):
    a = info(checkpoint("qwen3_gqa2_tied", seed=0))["weights_digest"]
    b = info(checkpoint("qwen3_gqa2_tied", seed=1))["weights_digest"]
    assert a != b


def test_present_tied_lm_head_is_skipped(checkpoint, tmp_path):
    """A tied checkpoint that does carry lm_head.weight: loaded as the embedding, reported skipped,
    and the digest of the loaded weights does not change."""
    src = checkpoint("qwen3_gqa2_tied")
    weights = load_file(src / "model.safetensors")
    assert "lm_head.weight" not in weights  # what transformers 5 saves for a tied config
    dst = tmp_path / "with_head"
    shutil.copytree(src, dst)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    plain, with_head = info(src), info(dst)
    assert with_head["tensors_skipped"] == 1
    assert with_head["tensors_loaded"] == plain["tensors_loaded"]
    assert [s["prefix"] for s in with_head["skipped"]] == ["lm_head.weight"]
    assert with_head["weights_digest"] == plain["weights_digest"]


# ---------------------------------------------------------------------------------------------
# Bad input: exit code 2 for INVALID_ARGUMENT (1 for other failures), a message naming the
# problem, no signal and no output file.

BAD_BASE = "qwen3_gqa2_tied"  # 3 layers, vocab 512, hidden 64, intermediate 128


def edit_config(d: Path, **changes) -> None:
    cfg = read_config(d)
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def edit_weights(d: Path, fn: Callable[[dict], None]) -> None:
    weights = load_file(d / "model.safetensors")
    fn(weights)
    save_file(weights, d / "model.safetensors", metadata={"format": "pt"})


def truncate(d: Path) -> None:
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:len(data) // 2])


# id -> (checkpoint edit or None, extract args beyond --model/--out, exit code, message parts)
BAD_INPUTS: dict[str, tuple] = {
    "token_id_eq_vocab": (None, ["--tokens", "1,512", "--layers", "0"], 2,
                          ["INVALID_ARGUMENT", "token_ids[1] = 512", "outside the vocabulary"]),
    "token_id_negative": (None, ["--tokens", "1,-1", "--layers", "0"], 2,
                          ["token_ids[1] = -1", "outside the vocabulary"]),
    "layer_eq_num_layers": (None, ["--tokens", "1,2", "--layers", "0,3"], 2,
                            ["INVALID_ARGUMENT", "layer_ids: 3 is outside [0, 3)",
                             "final_norm"]),
    "layer_negative": (None, ["--tokens", "1,2", "--layers", "-1"], 2,
                       ["layer_ids: -1 is outside [0, 3)"]),
    "empty_sequence_in_file": (None, ["--tokens_file", "{tokens}", "--layers", "0"], 2,
                               ["INVALID_ARGUMENT", "sequences[1]: empty"]),
    "unknown_model_type": (lambda d: edit_config(d, model_type="qwen9"),
                           ["--tokens", "1,2", "--layers", "0"], 2,
                           ["config.json", "model_type", "qwen9", "not supported"]),
    "missing_tensor": (lambda d: edit_weights(
                           d, lambda w: w.pop("model.layers.1.self_attn.k_proj.weight")),
                       ["--tokens", "1,2", "--layers", "0"], 2,
                       ["missing", "model.layers.1.self_attn.k_proj.weight"]),
    "wrong_shape": (lambda d: edit_weights(d, lambda w: w.update(
                        {"model.layers.1.mlp.up_proj.weight": torch.zeros(127, 64)})),
                    ["--tokens", "1,2", "--layers", "0"], 2,
                    ["model.layers.1.mlp.up_proj.weight", "[127, 64]", "[128, 64]"]),
    "truncated_file": (truncate, ["--tokens", "1,2", "--layers", "0"], 1,
                       ["DATA_LOSS", "model.safetensors", "past the end"]),
    "unexpected_tensor": (lambda d: edit_weights(d, lambda w: w.update(
                              {"model.layers.0.mlp.extra_proj.weight": torch.zeros(4, 4)})),
                          ["--tokens", "1,2", "--layers", "0"], 2,
                          ["unexpected tensor", "model.layers.0.mlp.extra_proj.weight"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_rejected(case, checkpoint, tmp_path):
    edit, args, code, parts = BAD_INPUTS[case]
    path = checkpoint(BAD_BASE)
    if edit is not None:
        path = Path(shutil.copytree(path, tmp_path / "ckpt"))
        edit(path)
    tokens = write_tokens(tmp_path / "tokens.json", [[1, 2, 3], []])
    out = tmp_path / "out.safetensors"
    args = [a.replace("{tokens}", str(tokens)) for a in args]
    res = run_extract(["extract", "--model", str(path), "--out", str(out), *args], check=False)
    assert res.returncode == code, (
        f"{case}: exit {res.returncode} (negative = signal), want {code}\n{res.stderr}")
    for part in parts:
        assert part in res.stderr, f"{case}: {part!r} not in stderr: {res.stderr!r}"
    assert not out.exists(), f"{case}: output file written despite the error"


def test_empty_sequence_in_tokens_flag_is_rejected(checkpoint, tmp_path):
    out = tmp_path / "out.safetensors"
    res = run_extract(["extract", "--model", str(checkpoint(BAD_BASE)), "--tokens", "1,2;;3",
                       "--layers", "0", "--out", str(out)], check=False)
    assert res.returncode == 2 and "empty" in res.stderr
