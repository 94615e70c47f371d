"""End-to-end tier: the committed trained models (models/) through the real services."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# extractor_harness (service tier) and dflash_fixtures (parity tier) are shared with those tiers.
sys.path.insert(0, str(HERE.parent / "service"))
sys.path.insert(0, str(HERE.parent / "parity"))
