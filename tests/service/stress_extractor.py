"""Stress reproducer (run by hand, not collected by pytest): many concurrent small streams
against one specwire-extractor until it dies or the rounds run out.

    python tests/service/stress_extractor.py [--rounds 200] [--threads 8] \
        [--server-arg=--max_batch_tokens=1]

Prints the server's exit status if it crashed (run with `ulimit -c unlimited` for a core file).
Found with it: the server crashing (SIGSEGV in ~StreamReactor -> Job dispose, or glibc's
"__pthread_tpp_change_priority: Assertion" abort) under concurrent load.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extractor_harness import (CHECKPOINT, ExtractorServer, hf_fixtures,  # noqa: E402
                               metric_value, wait_for)

from specwire_client import ExtractorClient, ExtractorError  # noqa: E402


def settled(server: ExtractorServer) -> bool:
    """The server has no open stream left, or has exited."""
    if server.proc.poll() is not None:
        return True
    try:
        return metric_value(server.metrics(), "specwire_extractor_active_streams") == 0
    except OSError:  # the metrics endpoint went away with the process
        return server.proc.poll() is not None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20, help="per thread per round")
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--model", type=Path, help="checkpoint dir (default: a tiny one made here)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="specwire-stress-"))
    model = args.model or hf_fixtures.make_checkpoint(CHECKPOINT, tmp)
    server = ExtractorServer(model, tmp, args=tuple(args.server_arg)).start()
    print(f"server pid {server.pid} on {server.address}, log {server.log_path}")
    t0 = time.monotonic()
    failure: list[str] = []
    try:
        for r in range(args.rounds):
            barrier = threading.Barrier(args.threads)

            def worker(t: int) -> None:
                try:
                    with ExtractorClient(server.address, timeout=60) as c:
                        c.wait_ready()
                        barrier.wait()
                        for i in range(args.requests):
                            if (t + i) % 4 == 0:
                                c.generate([[1 + t, 2]], 2, ignore_model_eos=True, layer_ids=[0])
                            else:
                                c.extract([[1 + t] * (1 + i % 5)], [i % 3], dtype="fp32")
                except ExtractorError as e:
                    failure.append(f"thread {t}: {e}")

            threads = [threading.Thread(target=worker, args=(t,)) for t in range(args.threads)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            if failure or server.crashed():
                break
    finally:
        # Every client has its answers; the crash check comes once the server has closed every
        # stream too (or has died).
        try:
            wait_for(lambda: settled(server), 30, "the server to close every stream")
        except AssertionError as e:
            print(e)
        crashed = server.crashed()
        n = (r + 1) * args.threads * args.requests
        print(f"{r + 1} rounds, ~{n} requests, {time.monotonic() - t0:.1f} s")
        if failure:
            print("client errors:\n  " + "\n  ".join(failure[:5]))
        print(crashed or "server alive")
        server.stop()
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
