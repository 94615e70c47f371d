"""Service tier: real specwire-extractor processes on 127.0.0.1, driven by real clients (the
Python specwire_client, stock grpcio health / reflection clients, plain HTTP for metrics).

Servers are started by fixtures on free ports (--listen 127.0.0.1:0, the port read back from the
server's first line; the metrics port picked free), from tiny checkpoints the session makes with
tests/parity/hf_fixtures.py, and stopped by PID at the end. The binaries come from
$SPECWIRE_BUILD_DIR (default <repo>/build).
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extractor_harness import (CHECKPOINT, ExtractorServer, extractor_pool,  # noqa: E402
                               hf_fixtures, make_tokenizer_json)

try:
    import specwire_client  # noqa: E402
except ImportError as e:  # pragma: no cover
    raise ImportError(f"{e}: install the client with `pip install -e clients/python` "
                      "(scripts/setup.sh does)") from e

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """2 cores: the test process keeps one, the server under test the other (restored after, so
    other tiers in the same session keep their setting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint every server loads (fp32 safetensors, no tokenizer.json)."""
    return hf_fixtures.make_checkpoint(CHECKPOINT, tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="session")
def checkpoint_with_tokenizer(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt-tok") / CHECKPOINT
    shutil.copytree(checkpoint, out)
    make_tokenizer_json(out / "tokenizer.json")
    return out


# Every server started in this session (for the crash check after each test).
_STARTED: list[ExtractorServer] = []


@pytest.fixture(autouse=True)
def _no_server_crashed() -> Iterator[None]:
    """Fails the test during which a server process died without being told to."""
    yield
    crashed = [c for c in (s.crashed() for s in _STARTED) if c]
    for s in _STARTED:
        if s.crashed():
            s.signalled = True  # reported once
    if crashed:
        pytest.fail("\n".join(crashed), pytrace=False)


@pytest.fixture(scope="session")
def server_factory(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ExtractorServer]]:
    """server_factory(model, dtype=..., args=(...)) -> a started server, stopped (by PID) when
    the session ends; tests that kill their server stop it themselves."""
    yield from extractor_pool(tmp_path_factory, "server", _STARTED)


@pytest.fixture(scope="session")
def fp32_server(server_factory, checkpoint) -> ExtractorServer:
    """The general-purpose server: float32 compute, default limits."""
    return server_factory(checkpoint, dtype="float32")


@pytest.fixture(scope="session")
def client(fp32_server) -> Iterator["specwire_client.ExtractorClient"]:
    from specwire_client import ExtractorClient

    c = ExtractorClient(fp32_server.address, timeout=60)
    yield c
    c.close()
