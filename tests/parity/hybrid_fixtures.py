"""Tiny random Qwen3.5 hybrid checkpoints (Gated DeltaNet + gated attention) made by transformers.

Two packagings of the same text weights:
  text  Qwen3_5ForCausalLM.save_pretrained: model.layers.*, model_type qwen3_5_text
  vlm   Qwen3_5ForConditionalGeneration.save_pretrained (tiny vision tower): model.language_model.*,
        model.visual.*, plus fake mtp.* tensors (real Qwen3.5 checkpoints ship an MTP head)
transformers' AutoModelForCausalLM loads both as Qwen3_5ForCausalLM; so must we.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_file, save_file

# The reference must be transformers' torch fallbacks (torch_chunk_gated_delta_rule, torch causal
# conv, torch gated RMSNorm): with flash-linear-attention or causal-conv1d installed, transformers
# dispatches to their kernels, which round differently.
KERNEL_PACKAGES_INSTALLED = {
    name: importlib.util.find_spec(name) is not None for name in ("fla", "causal_conv1d")
}

HYBRID_BASE: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # GVA: each key head serves 2 value heads
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    # Larger than the default 0.02, so every mixer moves the residual stream visibly.
    initializer_range=0.1,
    rope_parameters=dict(rope_type="default", rope_theta=10_000.0, partial_rotary_factor=0.25,
                         mrope_section=[2, 1, 1], mrope_interleaved=True),
)

HYBRID_CONFIGS: dict[str, dict[str, Any]] = {
    # The real schedule: full attention every 4th layer (3 and 7), untied head.
    "interval4": dict(num_hidden_layers=8, full_attention_interval=4, tie_word_embeddings=False),
    # An explicit schedule that starts and ends with full attention; tied head, other theta.
    "custom_types": dict(num_hidden_layers=5, tie_word_embeddings=True,
                         layer_types=["full_attention", "linear_attention", "linear_attention",
                                      "full_attention", "linear_attention"],
                         rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0,
                                              partial_rotary_factor=0.25)),
    # One linear-attention key head shared by four value heads, and one kv head (an outside check
    # found the single key head stopping with libtorch's aliasing error).
    "one_key_head": dict(num_hidden_layers=4, full_attention_interval=2, tie_word_embeddings=False,
                         linear_num_key_heads=1, num_key_value_heads=1),
}

TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                   num_position_embeddings=16)

# Stand-ins for a Qwen3.5 MTP head; transformers ignores ^mtp.* on load and so must we.
FAKE_MTP = {
    "mtp.fc.weight": (64, 128),
    "mtp.norm.weight": (64,),
    "mtp.pre_fc_norm_embedding.weight": (64,),
    "mtp.layers.0.mlp.gate_proj.weight": (128, 64),
}


def text_config(name: str) -> transformers.Qwen3_5TextConfig:
    cfg = dict(HYBRID_BASE)
    cfg.update(HYBRID_CONFIGS[name])
    return transformers.Qwen3_5TextConfig(**cfg)


def random_causal_lm(name: str, seed: int) -> transformers.Qwen3_5ForCausalLM:
    """A random Qwen3_5ForCausalLM whose norms, A_log and dt_bias are far from their inits."""
    torch.manual_seed(seed)
    model = transformers.Qwen3_5ForCausalLM(text_config(name)).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("A_log"):
                # exp(A) in [0.05, 3): a mix of long- and short-memory heads, so the state carried
                # between 64-token chunks matters.
                p.copy_(torch.empty_like(p).uniform_(0.05, 3.0).log())
            elif pname.endswith("dt_bias"):
                p.copy_(torch.randn_like(p) * 0.5 - 1.0)
            elif "norm" in pname:
                # (1 + w) norms init at 0 and the gated norm at 1: perturb both.
                p.add_(torch.randn_like(p) * 0.2)
    return model


def save_text(model: transformers.Qwen3_5ForCausalLM, path: Path,
              use_interval: bool = False) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    if use_interval:
        # transformers saves the expanded layer_types; drop it so the schedule comes from
        # full_attention_interval, as in configs that only state the interval.
        cfg = json.loads((path / "config.json").read_text())
        interval = 4
        assert cfg["layer_types"] == [
            "linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(cfg["num_hidden_layers"])]
        del cfg["layer_types"]
        cfg["full_attention_interval"] = interval
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


def save_vlm(model: transformers.Qwen3_5ForCausalLM, path: Path, seed: int = 0) -> Path:
    """Packages `model`'s weights as Qwen3_5ForConditionalGeneration (+ vision tower + fake MTP)."""
    torch.manual_seed(seed)
    text = model.config
    vision = transformers.Qwen3_5VisionConfig(out_hidden_size=text.hidden_size, **TINY_VISION)
    cfg = transformers.Qwen3_5Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                     tie_word_embeddings=text.tie_word_embeddings)
    vlm = transformers.Qwen3_5ForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        vlm.model.language_model.load_state_dict(model.model.state_dict())
        vlm.lm_head.weight.copy_(model.lm_head.weight)
    vlm.save_pretrained(path, safe_serialization=True)

    st = path / "model.safetensors"
    assert st.exists() and not (path / "model.safetensors.index.json").exists()
    tensors = load_file(st)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, shape in FAKE_MTP.items():
        tensors[name] = torch.randn(shape, generator=gen)
    save_file(tensors, st, metadata={"format": "pt"})
    return path


def tensor_names(path: Path) -> list[str]:
    return list(load_file(path / "model.safetensors").keys())


def hf_reference(path: Path, dtype: torch.dtype) -> transformers.PreTrainedModel:
    """transformers' AutoModelForCausalLM, checked to have loaded every weight (a VLM package
    loaded without the prefix mapping would silently random-initialise the language model)."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa", output_loading_info=True)
    assert type(model).__name__ == "Qwen3_5ForCausalLM", type(model)
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]
    return model.eval()


def hf_greedy(model: transformers.PreTrainedModel, prompt: list[int],
              max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        gen = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=None, pad_token_id=0,
                             attention_mask=torch.ones_like(ids))
    return gen[0, len(prompt):].tolist()
