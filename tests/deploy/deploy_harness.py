"""What the deployment tests share: repository paths, binaries, a server process started on a
free port (its "serving ... on port N" line read back) and stopped by PID."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def build_dir() -> Path:
    return Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))


def binary(relpath: str) -> Path:
    exe = build_dir() / relpath
    if not exe.exists():
        pytest.fail(f"{exe} not built (set SPECWIRE_BUILD_DIR; `cmake --build <dir>`)",
                    pytrace=False)
    return exe


EXTRACTOR = "services/extractor/specwire-extractor"
SCORER = "services/scorer/specwire-scorer"
SCORE = "services/scorer/specwire-score"
CLI = "clients/cli/specwire-cli"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A server process; `ready` is a regex on its log whose group 1, if any, is the port."""

    def __init__(self, cmd: list[str], log_path: Path, ready: str) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self.ready = ready
        self.port = 0
        self.metrics_port: int | None = None
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "Process":
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(self.ready, self.log())
            if m:
                self.port = int(m.group(1)) if m.groups() else 0
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{' '.join(self.cmd)} did not start:\n{self.log()}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


SERVING = r"serving .* on port (\d+)"


def extractor(model: Path, log_dir: Path, metrics_port: int, *extra: str) -> Process:
    p = Process([str(binary(EXTRACTOR)), f"--model={model}", "--dtype=float32",
                 "--listen=127.0.0.1:0", f"--metrics_listen=127.0.0.1:{metrics_port}",
                 "--threads=1", *extra], log_dir / f"extractor-{metrics_port}.log", SERVING)
    p.metrics_port = metrics_port
    return p


def scorer(extractors: str, log_dir: Path, metrics_port: int, cache_dir: Path) -> Process:
    p = Process([str(binary(SCORER)), f"--extractor={extractors}", "--listen=127.0.0.1:0",
                 f"--metrics_listen=127.0.0.1:{metrics_port}", "--dtype=float32",
                 "--threads=1", f"--cache_dir={cache_dir}"],
                log_dir / f"scorer-{metrics_port}.log", SERVING)
    p.metrics_port = metrics_port
    return p


def http_get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()
