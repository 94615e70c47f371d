"""The faults tier: real extractor and scorer processes on 127.0.0.1, killed (SIGKILL) and
restarted on the same port in the middle of work; the clients must reconnect or resume and end
with exactly the numbers of an uninterrupted run.

Servers are stopped by PID at the end of the module that started them. Binaries come from
$SPECWIRE_BUILD_DIR (default <repo>/build).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults_harness import ExtractorServer, ScorerServer, extractor_pool  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """2 cores: the test process keeps one, the servers the other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def extractor_factory(tmp_path_factory) -> Iterator[Callable[..., ExtractorServer]]:
    """extractor_factory(model, args=...) -> a started specwire-extractor; every one is stopped
    (by PID) when the module ends."""
    yield from extractor_pool(tmp_path_factory, "extractor", [])


@pytest.fixture(scope="module")
def scorer_factory(tmp_path_factory,
                   extractor_factory) -> Iterator[Callable[..., ScorerServer]]:
    """scorer_factory(extractors, results_dir=..., args=...) -> a started specwire-scorer; all
    are stopped (by PID) before the module's extractors."""
    started: list[ScorerServer] = []

    def make(extractors: str, **kw) -> ScorerServer:
        kw.setdefault("cache_dir", tmp_path_factory.mktemp("scorer-cache"))
        s = ScorerServer(extractors, tmp_path_factory.mktemp("scorer"), **kw)
        started.append(s)
        return s.start()

    yield make
    for s in started:
        s.terminate()
    for s in started:
        s.stop()
