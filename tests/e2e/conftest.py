"""End-to-end tier: the committed trained models (models/) through the real services."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# extractor_harness (service tier) and dflash_fixtures (parity tier) are shared with those tiers.
sys.path.insert(0, str(HERE.parent / "service"))
sys.path.insert(0, str(HERE.parent / "parity"))
from extractor_harness import ExtractorServer  # noqa: E402
from shipped_models import TARGET  # noqa: E402


@pytest.fixture(scope="module")
def extractor(tmp_path_factory):
    """A specwire-extractor on the committed target (models/tiny-qwen3) in float32, without a
    metrics port: one per test module, stopped (by PID) when the module ends."""
    server = ExtractorServer(TARGET, tmp_path_factory.mktemp("extractor"), dtype="float32",
                             metrics=False).start()
    yield server
    server.stop()
