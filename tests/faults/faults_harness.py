"""What the faults tests share: a restartable specwire-scorer process, wait_for, and the
extractor harness of the service tier."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "service"))
from extractor_harness import (ExtractorServer, build_dir, extractor_pool,  # noqa: E402,F401
                               free_port, metric_value, random_sequences)

from scorer_harness import THREADS, ScorerServer, scorer_binary  # noqa: E402,F401


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
