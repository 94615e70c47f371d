"""What the service tests share: a specwire-extractor process handle, free ports, a metrics
parser, waits on observable state (a condition, a metric), a tiny tokenizer.json, random token
sequences, the offline CLI."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "parity"))
import hf_fixtures  # noqa: E402,F401  (re-exported for the tests)
from processes import free_port, kill_process, launch_server, stop_process  # noqa: E402,F401

__all__ = ["CHECKPOINT", "THREADS", "ExtractorServer", "binary", "build_dir", "cli_extract",
           "extractor_pool", "free_port", "hf_fixtures", "make_tokenizer_json", "metric_sum",
           "metric_value", "random_sequences", "wait_for", "wait_for_metric"]

CHECKPOINT = "qwen3_gqa2_tied"  # 3 layers, hidden 64, vocab 512, tied embeddings
# Intra-op threads of the servers and of the offline CLI: one each on the 2-core CI machines
# (results do not depend on it at these sizes; checked by hand with --threads 1 vs 2).
THREADS = "1"


def build_dir() -> Path:
    return Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))


def binary(name: str, service: str = "extractor") -> Path:
    """services/<service>/<name> of the build; the test fails saying how to build it when it is
    not there."""
    exe = build_dir() / "services" / service / name
    if not exe.exists():
        pytest.fail(f"{exe} not built (set SPECWIRE_BUILD_DIR; `cmake --build <dir> --target "
                    f"{name}`)", pytrace=False)
    return exe


class ExtractorServer:
    """One specwire-extractor process. The gRPC port is chosen by the server the first time
    (listen on port 0) and kept for restarts; the metrics port is picked free here."""

    def __init__(self, model: Path, log_dir: Path, *, dtype: str = "float32",
                 args: tuple[str, ...] = (), metrics: bool = True) -> None:
        self.model = model
        self.dtype = dtype
        self.args = list(args)
        self.metrics_port = free_port() if metrics else None
        self.port = 0
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.signalled = False  # a test stopped or killed it on purpose

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> "ExtractorServer":
        self.starts += 1
        self.signalled = False
        self.log_path = self.log_dir / f"extractor-{self.starts}.log"
        cmd = [str(binary("specwire-extractor")), f"--model={self.model}", f"--dtype={self.dtype}",
               f"--listen=127.0.0.1:{self.port}", f"--threads={THREADS}",
               "--metrics_listen="
               + (f"127.0.0.1:{self.metrics_port}" if self.metrics_port else ""),
               # Room for the lifecycle tests' endless generations; tests of the limit pass
               # their own value after it (the last flag wins).
               "--max_new_tokens_limit=100000",
               *self.args]
        self.proc, self.port = launch_server(cmd, self.log_path, timeout)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.signalled = True
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL by PID and reap."""
        self.signalled = True
        if self.proc is not None:
            kill_process(self.proc)

    def crashed(self) -> str | None:
        """A description if the process ended without being asked to."""
        if self.proc is None or self.signalled or self.proc.poll() is None:
            return None
        rc = self.proc.returncode
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        tail = "\n".join(self.log().splitlines()[-5:])
        return f"specwire-extractor on {self.address} (pid {self.proc.pid}) died: {how}\n{tail}"

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM by PID (graceful drain), SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        self.signalled = True
        return stop_process(self.proc, timeout)

    def metrics(self) -> str:
        assert self.metrics_port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as r:
            return r.read().decode()


def extractor_pool(tmp_path_factory, log_dir: str,
                   started: list[ExtractorServer]) -> Iterator[Callable[..., ExtractorServer]]:
    """A factory fixture's body: yields make(model, dtype=..., args=(...), metrics=...) -> a
    started specwire-extractor logging into a fresh `log_dir` temporary directory, kept in
    `started`; when the fixture ends, every one is told to drain (SIGTERM, all at once) and then
    stopped by PID."""
    def make(model: Path, *, dtype: str = "float32", args: tuple[str, ...] = (),
             metrics: bool = True) -> ExtractorServer:
        s = ExtractorServer(model, tmp_path_factory.mktemp(log_dir), dtype=dtype, args=args,
                            metrics=metrics)
        started.append(s)
        return s.start()

    yield make
    for s in started:  # all drain at once
        s.signal(signal.SIGTERM)
    for s in started:
        s.stop()


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        m = re.match(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return 0.0


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of `name` whose labels include `labels` (0 when there is none):
    e.g. all codes of one method of a counter."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, *,
             log: Callable[[], str] | None = None) -> T:
    """Polls `predicate` (every 0.05 s) until it returns a true value, and returns that value.
    `timeout` is a safety net for a condition that never comes, not a measurement: past it the
    test fails naming `what` (and showing the tail of `log()` if given)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = f"\n--- log ---\n{log()[-4000:]}" if log else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{tail}")
        time.sleep(0.05)


class _HasMetrics(Protocol):
    def metrics(self) -> str: ...


def wait_for_metric(server: _HasMetrics, name: str, want: float | Callable[[float], bool],
                    timeout: float = 30.0, **labels: str) -> float:
    """Waits until the sample `name{labels}` on the server's metrics endpoint equals `want` (or
    satisfies it, when `want` is a predicate) and returns the value; works for any process
    handle with a metrics() -> Prometheus text method (extractor, scorer)."""
    ok = want if callable(want) else (lambda v: v == want)
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    what = f"{name}{{{shown}}} to reach {'the condition' if callable(want) else want}"
    seen: list[float] = []

    def check() -> bool:
        seen[:] = [metric_value(server.metrics(), name, **labels)]
        return ok(seen[0])

    try:
        wait_for(check, timeout, what)
    except AssertionError as e:
        raise AssertionError(f"{e} (last value {seen[0] if seen else 'none'})") from None
    return seen[0]


def make_tokenizer_json(path: Path, vocab_size: int = 400) -> Path:
    """A small byte-level BPE tokenizer.json (ids below the tiny models' vocabulary of 512)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the quick brown fox jumps over the lazy dog",
              "speculative decoding drafts tokens that the target verifies",
              "hidden states of the target feed the drafter"] * 20
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))
    return path


def random_sequences(lengths: list[int], seed: int, vocab: int = 512) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def cli_extract(model: Path, sequences: list[list[int]], out: Path, *, dtype: str,
                out_dtype: str, layers: list[int], embedding: bool = True,
                final_norm: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    """specwire-extract extract (the in-process engine, all sequences as one padded batch):
    ({"seq.i.<state>": tensor}, {"contract": dict, "token_ids": list})."""
    from safetensors import safe_open

    tokens = out.with_suffix(".tokens.json")
    tokens.write_text(json.dumps(sequences))
    cmd = [str(binary("specwire-extract")), "extract", f"--model={model}", f"--dtype={dtype}",
           f"--tokens_file={tokens}", "--layers=" + ",".join(map(str, layers)),
           f"--out={out}", f"--out_dtype={out_dtype}", f"--threads={THREADS}"]
    cmd += ["--embedding"] if embedding else []
    cmd += ["--final_norm"] if final_norm else []
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    with safe_open(str(out), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    return tensors, {"contract": json.loads(meta["contract"]),
                     "token_ids": json.loads(meta["token_ids"])}
