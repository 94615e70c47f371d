"""Server processes the test tiers start themselves: launched with their output in a log and
waited on until they say which port they serve, stopped by PID (SIGTERM, then SIGKILL), always
reaped. Standard library only, so the deploy scripts import it too."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

SERVING = r"serving .* on port (\d+)"


def free_port() -> int:
    """A loopback port free now (for a server told to listen on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_server(cmd: list[str], log_path: Path, timeout: float,
                  ready: str = SERVING) -> tuple[subprocess.Popen, int]:
    """Starts a server with its output in log_path and waits for a line matching `ready` (by
    default specwire's "serving ... on port N"); returns the process and the port, `ready`'s
    group 1 (0 when it has none). If it exits or times out first, it is killed (by PID) and
    reaped, and RuntimeError carries the log."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(ready, log_path.read_text(errors="replace"))
        if m:
            return proc, int(m.group(1)) if m.groups() else 0
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    kill_process(proc)
    raise RuntimeError(f"{' '.join(cmd)} did not start:\n{log_path.read_text(errors='replace')}")


def kill_process(proc: subprocess.Popen) -> None:
    """SIGKILL by PID (as a crash would end it), and reap."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGTERM by PID (a graceful drain), SIGKILL if it has not exited within `timeout` seconds;
    reaped. Returns its exit status."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_process(proc)
    return proc.returncode
