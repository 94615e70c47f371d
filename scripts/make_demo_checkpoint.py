#!/usr/bin/env python3
"""Writes a small random Qwen3 checkpoint (Hugging Face format) for the demo, once."""
import sys
from pathlib import Path

import torch
import transformers


def main(out: Path) -> None:
    if (out / "config.json").exists():
        return
    config = transformers.AutoConfig.for_model(
        "qwen3", vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        eos_token_id=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
