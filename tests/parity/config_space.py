"""A seeded generator of config.json files over what a config can say, for every family specwire
runs (llama, qwen2, qwen3, qwen3_5 text and VLM-packaged).

Each draw varies head counts (one kv head, one linear key head), head_dim against hidden / heads,
every rope type in both spellings (legacy `rope_scaling` + top-level keys, and `rope_parameters`
with everything inside), keys at the top level or nested, partial rotary, biases, windows and
use_sliding_window, layer_types patterns, tied and untied embeddings, conv kernel sizes and eps.
The config is what a user's config.json would hold: the checkpoint is written by transformers from
it, then config.json is replaced by the raw draw, so both sides read the same file.
"""
from __future__ import annotations

import random
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_5_text", "qwen3_5_vlm")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _rope(rng: random.Random, cfg: dict[str, Any], hybrid: bool) -> None:
    """Rope keys in one of the spellings transformers reads."""
    rope_type = rng.choice(ROPE_TYPES)
    theta = rng.choice([10_000.0, 500_000.0, 1_000_000.0])
    params: dict[str, Any] = {}
    if rope_type in ("linear", "llama3", "yarn"):
        params["factor"] = rng.choice([2.0, 4.0, 8.0])
    if rope_type == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=rng.choice([2.0, 4.0]))
    if rope_type == "yarn":
        if rng.random() < 0.3:
            params["beta_fast"] = rng.choice([8.0, 16.0])
        if rng.random() < 0.3:
            params["attention_factor"] = rng.choice([0.9, 1.2])
        if rng.random() < 0.2:
            params["truncate"] = False
    omax = rng.choice([16, 32, 64])
    omax_top_level = rope_type in ("llama3", "yarn") and rng.random() < 0.3
    if rope_type in ("llama3", "yarn") and not omax_top_level:
        params["original_max_position_embeddings"] = omax
    if omax_top_level:
        cfg["original_max_position_embeddings"] = omax
    partial = None
    if hybrid:
        partial = rng.choice([0.25, 0.5, 1.0])
    elif rng.random() < 0.15 and rope_type == "default":
        partial = 0.5  # Llama / Qwen2 / Qwen3's default rope never reads it
    legacy = rng.random() < 0.5
    if legacy:
        if rope_type != "default" or rng.random() < 0.5:
            key = "type" if rope_type == "linear" and rng.random() < 0.5 else "rope_type"
            cfg["rope_scaling"] = {key: rope_type, **params}
        cfg["rope_theta"] = theta
        if partial is not None:
            cfg["partial_rotary_factor"] = partial
    else:
        cfg["rope_parameters"] = {"rope_type": rope_type, "rope_theta": theta, **params}
        if partial is not None:
            if rng.random() < 0.5:
                cfg["rope_parameters"]["partial_rotary_factor"] = partial
            else:
                cfg["partial_rotary_factor"] = partial
        if hybrid and rng.random() < 0.5:
            cfg["rope_parameters"]["mrope_section"] = [1, 1, 0]
            cfg["rope_parameters"]["mrope_interleaved"] = True


def _attention_geometry(rng: random.Random, cfg: dict[str, Any], family: str) -> None:
    hidden = rng.choice([32, 48, 64])
    heads = rng.choice([d for d in _divisors(hidden) if 2 <= d <= 8])
    cfg.update(hidden_size=hidden, num_attention_heads=heads,
               num_key_value_heads=rng.choice(_divisors(heads)))
    if family in ("qwen3", "qwen3_5_text", "qwen3_5_vlm") or rng.random() < 0.5:
        cfg["head_dim"] = rng.choice([8, 12, 16, 24])  # often != hidden / heads


def draw_config(seed: int) -> tuple[str, dict[str, Any]]:
    """(family, config.json as a dict) for one seed."""
    rng = random.Random(seed)
    family = rng.choice(FAMILIES)
    hybrid = family.startswith("qwen3_5")
    cfg: dict[str, Any] = {
        "model_type": "qwen3_5_text" if hybrid else family,
        "vocab_size": rng.choice([64, 128, 256]),
        "intermediate_size": rng.choice([32, 64, 96]),
        "num_hidden_layers": rng.randint(1, 4),
        "max_position_embeddings": rng.choice([128, 256, 4096]),
        "rms_norm_eps": rng.choice([1e-6, 1e-5]),
        "tie_word_embeddings": rng.random() < 0.5,
        "initializer_range": 0.1,
    }
    _attention_geometry(rng, cfg, family)
    _rope(rng, cfg, hybrid)
    layers = cfg["num_hidden_layers"]
    if family == "llama":
        cfg["attention_bias"] = rng.random() < 0.5
        cfg["mlp_bias"] = rng.random() < 0.5
    if family == "qwen3":
        cfg["attention_bias"] = rng.random() < 0.3
    if family in ("qwen2", "qwen3") and rng.random() < 0.5:
        cfg["use_sliding_window"] = True
        cfg["sliding_window"] = rng.choice([4, 8, 16])
        if rng.random() < 0.5:
            cfg["layer_types"] = [rng.choice(["full_attention", "sliding_attention"])
                                  for _ in range(layers)]
        else:
            cfg["max_window_layers"] = rng.randint(0, layers)
    if hybrid:
        nk = rng.choice([1, 2])
        cfg.update(linear_num_key_heads=nk, linear_num_value_heads=nk * rng.choice([1, 2, 4]),
                   linear_key_head_dim=rng.choice([8, 16]),
                   linear_value_head_dim=rng.choice([8, 16]),
                   linear_conv_kernel_dim=rng.choice([2, 3, 4, 5]),
                   attention_bias=rng.random() < 0.3)
        if rng.random() < 0.5:
            cfg["layer_types"] = [rng.choice(["linear_attention", "full_attention"])
                                  for _ in range(layers)]
        else:
            cfg["full_attention_interval"] = rng.choice([1, 2, 4])
    return family, cfg


# Edits that take a config outside what transformers or specwire run, each a case the sweep must
# see refused (by specwire, and by transformers too where it refuses): (name, families, edit).
MUTATIONS = (
    ("kv_heads_do_not_divide", FAMILIES,
     lambda c: c.update(num_key_value_heads=c["num_attention_heads"] + 1)),
    ("rope_dynamic", FAMILIES, lambda c: (c.pop("rope_parameters", None),
                                          c.update(rope_scaling={"rope_type": "dynamic",
                                                                 "factor": 2.0}))),
    ("linear_rope_without_factor", FAMILIES,
     lambda c: (c.pop("rope_parameters", None), c.update(rope_scaling={"rope_type": "linear"}))),
    ("gelu", FAMILIES, lambda c: c.update(hidden_act="gelu")),
    ("scaled_rope_partial", ("llama", "qwen2", "qwen3"),
     lambda c: (c.pop("rope_parameters", None),
                c.update(rope_scaling={"rope_type": "linear", "factor": 2.0},
                         partial_rotary_factor=0.5))),
    ("bidirectional", FAMILIES, lambda c: c.update(is_causal=False)),
    ("un_normed_last_state", FAMILIES, lambda c: c.update(tie_last_hidden_states=False)),
    ("sliding_without_window", ("qwen2", "qwen3"),
     lambda c: c.update(use_sliding_window=False,
                        layer_types=["sliding_attention"] * c["num_hidden_layers"])),
    ("layer_types_too_short", FAMILIES,
     lambda c: c.update(layer_types=["full_attention"] * (c["num_hidden_layers"] + 1))),
)


def draw_mutated_config(seed: int, probability: float = 0.25) -> tuple[str, dict[str, Any], str]:
    """draw_config, and with `probability` one of MUTATIONS applied: (family, config, mutation
    name or "")."""
    family, cfg = draw_config(seed)
    rng = random.Random(seed ^ 0x5EED)
    if rng.random() >= probability:
        return family, cfg, ""
    name, families, edit = rng.choice([m for m in MUTATIONS if family in m[1]])
    edit(cfg)
    return family, cfg, name


def sequence_lengths(rng: random.Random, cfg: dict[str, Any]) -> list[int]:
    """Lengths around the delta-rule chunk (64) and the window, plus a short one."""
    out = [1, rng.randint(2, 12), rng.choice([63, 64, 65])]
    window = cfg.get("sliding_window")
    if window:
        out.append(window + rng.choice([-1, 0, 1]) + 1)
    return out
