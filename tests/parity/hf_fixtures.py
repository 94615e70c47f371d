"""Tiny random Hugging Face checkpoints and reference hidden states, made with transformers.

These are the oracles of the parity tier: transformers defines what hidden states are, so every
fixture is built and evaluated by transformers itself (AutoModelForCausalLM, sdpa attention).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch
import transformers

REPO = Path(__file__).resolve().parents[2]


def built_binary(relpath: str) -> Path:
    """A binary of the build ($SPECWIRE_BUILD_DIR, default build/): "services/extractor/
    specwire-extract". FileNotFoundError names it when it is not built."""
    exe = Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build")) / relpath
    if not exe.exists():
        raise FileNotFoundError(f"{exe} not built (set SPECWIRE_BUILD_DIR)")
    return exe


def extract_binary() -> Path:
    return built_binary("services/extractor/specwire-extract")


# Small but structurally complete configs: GQA, tied / untied heads, biases, rope variants.
TINY_BASE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
)

DENSE_CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen3: q/k norm, explicit head_dim != hidden / heads, GQA 4:2, tied embeddings.
    "qwen3_gqa2_tied": dict(model_type="qwen3", head_dim=32, tie_word_embeddings=True,
                            rope_theta=1_000_000.0),
    # Qwen3, GQA 4:1 (multi-query), untied.
    "qwen3_mqa_untied": dict(model_type="qwen3", num_key_value_heads=1, head_dim=16,
                             tie_word_embeddings=False, num_hidden_layers=4),
    # Qwen2: q/k/v biases, no q/k norm, MHA.
    "qwen2_bias_mha": dict(model_type="qwen2", num_key_value_heads=4, tie_word_embeddings=False,
                           rope_theta=10_000.0),
    # Qwen2 with a sliding window on the top layers (window shorter than the test prompts).
    "qwen2_sliding": dict(model_type="qwen2", use_sliding_window=True, sliding_window=8,
                          max_window_layers=1, tie_word_embeddings=True),
    # Llama 3.1-style rope scaling, attention and MLP biases, GQA 4:2.
    "llama_rope3_bias": dict(model_type="llama", tie_word_embeddings=False, attention_bias=True,
                             mlp_bias=True, rope_theta=500_000.0,
                             rope_scaling=dict(rope_type="llama3", factor=8.0,
                                               low_freq_factor=1.0, high_freq_factor=4.0,
                                               original_max_position_embeddings=64)),
    # Llama, tied, default rope, explicit head_dim.
    "llama_tied": dict(model_type="llama", tie_word_embeddings=True, head_dim=8),
    # Qwen3 with YaRN rope (the attention factor scales cos and sin; one RoPE for targets and
    # drafters, common/models/rope.cc).
    "qwen3_yarn": dict(model_type="qwen3", head_dim=16, max_position_embeddings=256,
                       rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=16.0,
                                         original_max_position_embeddings=32)),
}

# The overrides of a tiny Qwen3.5 hybrid (make_checkpoint("qwen3_5_hybrid", ..., overrides=...)):
# 3 Gated DeltaNet layers + 1 gated full-attention layer, the GPU kit's hybrid reference target.
QWEN3_5_TINY = dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=128,
                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    layer_types=["linear_attention"] * 3 + ["full_attention"],
                    tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10_000.0,
                                         partial_rotary_factor=0.25))


def make_checkpoint(name: str, out_dir: Path, seed: int = 0, overrides: dict | None = None) -> Path:
    """Saves a randomly initialised model (fp32 safetensors) to out_dir/name and returns the dir."""
    cfg = dict(TINY_BASE)
    cfg.update(DENSE_CONFIGS[name] if name in DENSE_CONFIGS else {})
    cfg.update(overrides or {})
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init leaves norms at 1 and biases at 0; perturb them so their handling is tested.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    path = out_dir / name
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_hf_model(path: Path, dtype: torch.dtype) -> transformers.PreTrainedModel:
    """The oracle model: AutoModelForCausalLM with sdpa attention, in eval mode."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                              attn_implementation="sdpa")
    return model.eval()


def hf_hidden_states(path: Path, sequences: list[list[int]], dtype: torch.dtype) -> list[tuple]:
    """transformers' output_hidden_states for each sequence (run one by one, no padding)."""
    model = load_hf_model(path, dtype)
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], dtype=torch.long)
            res = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            out.append(tuple(h[0].float() for h in res.hidden_states))
    return out


def hf_taps(model: transformers.PreTrainedModel,
            sequences: list[list[int]]) -> list[dict[str, torch.Tensor]]:
    """Reference values of every tap, named as specwire-extract names them (without "seq.i.").

    embedding = hidden_states[0]; layer.k = hidden_states[k + 1] for k < L - 1; final_norm =
    hidden_states[L]. transformers replaces the last decoder layer's raw output with the final-norm
    output in hidden_states, so layer.{L-1} is taken from the input of model.model.norm (a forward
    pre-hook); we also check that norm(that input) is hidden_states[L], which pins the convention.
    """
    num_layers = model.config.num_hidden_layers
    norm_inputs: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_pre_hook(
        lambda _mod, args: norm_inputs.append(args[0].detach()))
    out = []
    try:
        with torch.no_grad():
            for seq in sequences:
                norm_inputs.clear()
                ids = torch.tensor([seq], dtype=torch.long)
                hs = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
                assert len(hs) == num_layers + 1 and len(norm_inputs) == 1
                last_raw = norm_inputs[0]
                if not torch.equal(model.model.norm(last_raw), hs[num_layers]):
                    raise AssertionError(
                        "transformers' hidden_states[L] is not norm(layer L-1 output)")
                taps = {"embedding": hs[0][0].float()}
                for k in range(num_layers - 1):
                    taps[f"layer.{k}"] = hs[k + 1][0].float()
                taps[f"layer.{num_layers - 1}"] = last_raw[0].float()
                taps["final_norm"] = hs[num_layers][0].float()
                out.append(taps)
    finally:
        hook.remove()
    return out


def greedy(model: transformers.PreTrainedModel, prompt: list[int], max_new_tokens: int,
           eos: list[int] | None) -> list[int]:
    """model.generate(do_sample=False) continuation of prompt. eos=None means no stop token at
    all (generation_config.json's eos_token_id is ignored too); HF keeps the stop token."""
    # generate() fills fields left at their default (eos_token_id=None) from the model's own
    # generation_config, so "no eos" has to be set there, for the duration of the call.
    saved_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        gen_config = copy.deepcopy(model.generation_config)
        gen_config.update(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0)
        ids = torch.tensor([prompt], dtype=torch.long)
        with torch.no_grad():
            gen = model.generate(ids, generation_config=gen_config,
                                 attention_mask=torch.ones_like(ids))
    finally:
        model.generation_config.eos_token_id = saved_eos
    return gen[0, len(prompt):].tolist()


def hf_greedy(path: Path, prompt: list[int], max_new_tokens: int, eos: list[int] | None) -> list[int]:
    return greedy(load_hf_model(path, torch.float32), prompt, max_new_tokens, eos)


def run_extract(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(extract_binary())] + args
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    return res


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def write_tokens(path: Path, sequences: list[list[int]]) -> Path:
    path.write_text(json.dumps(sequences))
    return path
