"""A specwire-scorer process for the Python tiers (service, faults, security, watch): started on a
server-chosen port, restartable on that port, stopped by PID; plus the scorer binaries."""
from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import grpc
from extractor_harness import binary, free_port
from processes import kill_process, launch_server, stop_process

from specwire_client._generated.proto.specwire.v1 import scorer_pb2_grpc as spb_grpc

THREADS = "1"


def scorer_binary(name: str) -> Path:
    return binary(name, "scorer")


class ScorerServer:
    """One specwire-scorer process. The gRPC port is chosen by the server the first time and
    kept for restarts (a client that reconnects finds it again); metrics port picked free."""

    def __init__(self, extractors: str, log_dir: Path, cache_dir: Path, *,
                 results_dir: Path | None = None, args: tuple[str, ...] = ()) -> None:
        self.extractors = extractors
        self.log_dir = log_dir
        self.cache_dir = cache_dir
        self.results_dir = results_dir
        self.args = list(args)
        self.metrics_port = free_port()
        self.port = 0
        self.starts = 0
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "ScorerServer":
        self.starts += 1
        self.log_path = self.log_dir / f"scorer-{self.starts}.log"
        cmd = [str(scorer_binary("specwire-scorer")), f"--extractor={self.extractors}",
               f"--listen=127.0.0.1:{self.port}",
               f"--metrics_listen=127.0.0.1:{self.metrics_port}", "--dtype=float32",
               f"--threads={THREADS}", f"--cache_dir={self.cache_dir}", *self.args]
        if self.results_dir is not None:
            cmd.append(f"--results_dir={self.results_dir}")
        self.proc, self.port = launch_server(cmd, self.log_path, timeout)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None:
            kill_process(self.proc)

    def terminate(self) -> None:
        """SIGTERM without waiting (several servers drain at once)."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as r:
            return r.read().decode()

    def stub(self) -> spb_grpc.ScorerStub:
        return spb_grpc.ScorerStub(grpc.insecure_channel(self.address))
