"""The committed demo models (models/) the end-to-end tier runs, and the held-out prompts."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
TARGET = MODELS / "tiny-qwen3"
HYBRID = MODELS / "tiny-qwen3_5"
DRAFTER = MODELS / "tiny-qwen3-dflash"
PROMPTS = MODELS / "heldout_prompts.jsonl"
