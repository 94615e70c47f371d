"""The benchmarks' synthetic models: random CausalLM checkpoints of a benchmark's size, written by
transformers once into the benchmark's cache and reused."""
from __future__ import annotations

from pathlib import Path

import torch
import transformers


def random_checkpoint(cache_dir: Path, name: str, model_type: str, config: dict) -> Path:
    """cache_dir/name: a CausalLM of `model_type` with `config` and seed-0 random weights
    (float32), written by transformers once and reused by every later run."""
    path = cache_dir / name
    if (path / "config.json").exists():
        return path
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    return path
