"""What a container's log says when its service cannot start: the configurations that
deploy/docker-compose.yml can get wrong (a model mount that is missing or names another target, a
port that another process holds, an address that is not this host's). Each service exits non-zero
within seconds with one line naming the flag, the value and the cause; none hangs and none
crashes. tests/deploy/compose_stack.py checks the same through the running compose stack."""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from deploy_harness import EXTRACTOR, REPO, SCORER, binary


def start(exe: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary(exe)), *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def last_line(r: subprocess.CompletedProcess) -> str:
    return r.stderr.strip().splitlines()[-1]


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


SERVICES = {
    "extractor": (EXTRACTOR, ["--model", str(REPO / "models" / "tiny-qwen3"), "--dtype=float32",
                              "--threads=1"]),
    "scorer": (SCORER, ["--extractor=127.0.0.1:1", "--threads=1"]),
}


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize("flag", ["listen", "metrics_listen"])
def test_a_port_already_taken_is_named(service, flag, taken_port, tmp_path):
    exe, args = SERVICES[service]
    other = "metrics_listen" if flag == "listen" else "listen"
    ports = {flag: f"127.0.0.1:{taken_port}", other: "127.0.0.1:0" if other == "listen" else ""}
    extra = [f"--cache_dir={tmp_path}"] if service == "scorer" else []
    r = start(exe, *args, *extra, *(f"--{k}={v}" for k, v in ports.items()))
    assert r.returncode not in (0, -6, -11), r.stderr[-2000:]
    assert last_line(r).endswith(
        f"--{flag}=127.0.0.1:{taken_port}: "
        + ("cannot listen" if flag == "listen" else "cannot serve metrics")
        + ": the port is already in use by another process"), r.stderr[-2000:]


def test_an_address_of_another_host_is_named():
    exe, args = SERVICES["extractor"]
    # TEST-NET-1 (RFC 5737): never an address of this host.
    r = start(exe, *args, "--listen=192.0.2.1:50051", "--metrics_listen=")
    assert r.returncode not in (0, -6, -11)
    assert last_line(r) == ("specwire-extractor: --listen=192.0.2.1:50051: cannot listen: "
                            "Cannot assign requested address"), r.stderr[-2000:]


@pytest.mark.parametrize("model", ["missing-mount", "wrong-target"])
def test_a_missing_or_wrong_model_is_named(model, tmp_path):
    # An empty folder where the mount should be, or the mount with another target's name.
    root = tmp_path / "models" if model == "missing-mount" else REPO / "models"
    root.mkdir(exist_ok=True)
    target = "tiny-qwen3" if model == "missing-mount" else "no-such-target"
    r = start(EXTRACTOR, f"--model={root / target}", "--listen=127.0.0.1:0", "--metrics_listen=")
    assert r.returncode not in (0, -6, -11)
    assert last_line(r) == (f"specwire-extractor: NOT_FOUND: {root / target}/config.json: "
                            "cannot open: No such file or directory"), r.stderr[-2000:]
    assert not Path(root / target).exists()
