#!/usr/bin/env python3
"""What the real loop costs next to the replay, and how many sessions an extractor sustains.

On the shipped pair (models/tiny-qwen3 target, models/tiny-qwen3-dflash drafter) and the hybrid
target (models/tiny-qwen3_5 with the same drafter), one specwire-extractor on 127.0.0.1 (fp32,
1 thread) and specwire-score in-process (1 thread), the held-out prompts, --max_new_tokens:
  replay        specwire-score as today: Generate + the features of every position per prompt,
                then the greedy replay
  live T=0      specwire-score --live=0: one extractor session per prompt, a verify + commit per
                step (its self-check off, so nothing else runs)
  live T=0.7    the same at temperature 0.7, top-p 0.95, top-k 20
Seconds per scored prompt (wall time of the whole job / prompts) and τ for each. Then sessions per
second one extractor sustains, --clients client threads each opening a session on a 32-token
prompt, running --steps verify + commit steps of 15 drafted tokens, and closing it; and the
verify + commit round trips per second inside those sessions.

Ends with live_vs_replay_cost=<live T=0 seconds per prompt / replay seconds per prompt, the
higher of the two targets>.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "service"))

from extractor_harness import ExtractorServer, build_dir  # noqa: E402

from specwire_client import ExtractorClient  # noqa: E402

MODELS = REPO / "models"
DRAFTER = MODELS / "tiny-qwen3-dflash"
PROMPTS = MODELS / "heldout_prompts.jsonl"


def score(server: ExtractorServer, target: str, out: Path, args, *extra: str) -> tuple[float, dict]:
    cmd = [str(build_dir() / "services" / "scorer" / "specwire-score"),
           f"--extractor={server.address}", f"--drafter={DRAFTER}", f"--dataset={PROMPTS}",
           f"--max_prompts={args.prompts}", f"--max_new_tokens={args.max_new_tokens}",
           "--dtype=float32", "--threads=1", "--cache_dir=none",
           f"--target_checkpoint={MODELS / target}", "--ddtree=", f"--json_out={out}",
           "--quiet", *extra]
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        sys.exit(f"specwire-score failed: {res.stderr[-2000:]}")
    return wall, json.loads(out.read_text())


def sessions_per_second(address: str, args, vocab: int) -> tuple[float, float]:
    done = [0, 0]
    lock = threading.Lock()
    stop = time.perf_counter() + args.session_seconds

    def client(i: int) -> None:
        g = random.Random(i)
        with ExtractorClient(address, timeout=120) as c:
            while time.perf_counter() < stop:
                prompt = [g.randrange(vocab) for _ in range(32)]
                with c.session(prompt, [1], dtype="fp32", max_new_tokens=16 * args.steps + 16,
                               max_draft_tokens=15) as s:
                    for _ in range(args.steps):
                        v = s.verify([g.randrange(vocab) for _ in range(15)])
                        s.commit(v.accepted)
                with lock:
                    done[0] += 1
                    done[1] += args.steps

    t = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    return done[0] / wall, done[1] / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="verify + commit steps per session")
    ap.add_argument("--session_seconds", type=float, default=10.0)
    args = ap.parse_args()

    rows = []
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for target in ("tiny-qwen3", "tiny-qwen3_5"):
            (Path(tmp) / target).mkdir()
            server = ExtractorServer(MODELS / target, Path(tmp) / target, dtype="float32",
                                     metrics=False).start()
            try:
                runs = {}
                for name, extra in (("replay", ()),
                                    ("live T=0", ("--live=0", "--live_self_check=0")),
                                    ("live T=0.7", ("--live=0.7:0.95:20",))):
                    wall, report = score(server, target, Path(tmp) / f"{target}-{name}.json", args,
                                         *extra)
                    n = report["summary"]["responses"]
                    runs[name] = (wall / n, report["summary"]["tau_mean_of_means"],
                                  report["summary"].get("live") or {})
                sps, vps = sessions_per_second(server.address, args, 2048)
            finally:
                server.stop()
            ratio = runs["live T=0"][0] / runs["replay"][0]
            worst = max(worst, ratio)
            rows.append((target, runs, sps, vps, ratio))

    print(f"{args.prompts} held-out prompts, max_new_tokens {args.max_new_tokens}, fp32, "
          "1 extractor thread + 1 scorer thread")
    print(f"{'target':<14}{'loop':<12}{'s / prompt':>11}{'tau':>8}{'verifies':>10}"
          f"{'drafter s':>11}{'target s':>10}")
    for target, runs, sps, vps, ratio in rows:
        for name, (per, tau, live) in runs.items():
            print(f"{target:<14}{name:<12}{per:>11.3f}{tau:>8.3f}"
                  f"{live.get('verify_calls', ''):>10}"
                  f"{live.get('drafter_seconds', float('nan')):>11.2f}"
                  f"{live.get('target_seconds', float('nan')):>10.2f}")
        print(f"{target:<14}live / replay {ratio:.2f}x per prompt; sessions {sps:.1f}/s "
              f"({args.clients} clients, {args.steps} steps of 15 drafts each), "
              f"verify + commit {vps:.1f}/s")
    print(f"live_vs_replay_cost={worst:.3f}")


if __name__ == "__main__":
    main()
