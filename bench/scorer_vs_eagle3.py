#!/usr/bin/env python3
"""EAGLE-3 drafting throughput: specwire's chain replay vs the reference package's own forward,
same CPU, same threads.

The committed pair (models/tiny-qwen3 and its EAGLE-3 drafter models/tiny-qwen3-eagle3, or
--target / --drafter) on the held-out prompts: specwire-replay replay runs the target
in-process (greedy trajectories, auxiliary states) and replays the chains; the reference side
replays the same trajectories with speculators 0.9.0's Eagle3DraftModel (from
.venv/trainer-oracles, in a subprocess: its pins clash with the project's) on the same
auxiliary states, computed here with transformers. Both sides must give the same step lengths
(checked), so both draft exactly the same chains.

What is timed (medians over alternating rounds):
  ours       specwire-replay's in-process time of the replay alone (timing.replay_seconds):
             context rows (fc, layer K/V), every draft step, lm_head, argmax and the acceptance
             bookkeeping; target generation and feature extraction are outside the timer.
  reference  the time spent inside the reference model's forward calls only (no bookkeeping).
             speculators has no cached drafting loop: its forward is the training-time
             multi-step one, so every draft step runs it again over the context (the loop an
             offline user of the package would write); the gap is mostly that recomputation.

Last line: scorer_vs_reference_ratio=<median of ours / reference chains per second> (eagle3).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[1]
ORACLES = REPO / ".venv" / "trainer-oracles"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=REPO / "models" / "tiny-qwen3")
    ap.add_argument("--drafter", type=Path, default=REPO / "models" / "tiny-qwen3-eagle3")
    ap.add_argument("--prompts", type=Path, default=REPO / "models" / "heldout_prompts.jsonl")
    ap.add_argument("--max_prompts", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/specwire-bench-eagle3"))
    args = ap.parse_args()
    build = Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))
    replay = build / "services" / "scorer" / "specwire-replay"
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)

    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    texts = [json.loads(l)["prompt"] for l in args.prompts.read_text().splitlines() if l.strip()]
    prompts = [tok.encode(t, add_special_tokens=False).ids for t in texts[:args.max_prompts]]
    (args.work / "prompts.json").write_text(json.dumps(prompts))

    def ours() -> dict:
        r = subprocess.run([str(replay), "replay", f"--drafter={args.drafter}",
                            f"--target_checkpoint={args.target}",
                            f"--tokens_file={args.work / 'prompts.json'}",
                            f"--max_new_tokens={args.max_new_tokens}", "--ignore_model_eos",
                            f"--threads={args.threads}", "--reps=3"],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            sys.exit(r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    first = ours()
    block = first["block"]
    ids = first["target_layer_ids"]
    trajs = [p + resp["completion"] for p, resp in zip(prompts, first["responses"])]

    # The auxiliary states as the extractor serves them: layer outputs before the final norm.
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    layers = hf.model.layers
    captured: dict = {}
    hooks = [layers[k].register_forward_hook(
        lambda mod, a, o, k=k: captured.__setitem__(k, o[0] if isinstance(o, tuple) else o))
        for k in ids]
    data = {}
    with torch.no_grad():
        for i, t in enumerate(trajs):
            hf(torch.tensor([t]))
            data[f"traj.{i}"] = torch.tensor(t, dtype=torch.int64)
            data[f"aux.{i}"] = torch.cat([captured[k][0] for k in ids], -1).contiguous()
            data[f"prompt_len.{i}"] = torch.tensor(len(prompts[i]), dtype=torch.int64)
    for h in hooks:
        h.remove()
    save_file(data, str(args.work / "data.safetensors"))
    spec = args.work / "time.json"
    spec.write_text(json.dumps({"drafter": str(args.drafter),
                                "data": str(args.work / "data.safetensors"),
                                "max_new_tokens": args.max_new_tokens, "block": block}))

    def reference() -> dict:
        env = dict(os.environ, PYTHONPATH=str(ORACLES), TORCHDYNAMO_DISABLE="1",
                   SPECWIRE_BENCH_THREADS=str(args.threads))
        r = subprocess.run([sys.executable, str(REPO / "tests" / "parity" / "eagle3_reference.py"),
                            "time", str(spec)], capture_output=True, text=True, timeout=3600,
                           env=env)
        if r.returncode != 0:
            sys.exit(r.stderr[-3000:])
        return json.loads(r.stdout.strip().splitlines()[-1])

    ours_s, ref_s = [], []
    chains = sum(len(r["step_lengths"]) for r in first["responses"])
    for rnd in range(args.rounds):
        o = first if rnd == 0 else ours()
        ref = reference()
        got = [r["step_lengths"] for r in o["responses"]]
        if got != ref["step_lengths"]:
            sys.exit(f"step lengths differ: ours {got} reference {ref['step_lengths']}")
        ours_s.append(o["timing"]["replay_seconds"])
        ref_s.append(ref["drafting_seconds"])
    o, r = statistics.median(ours_s), statistics.median(ref_s)
    tau = sum(sum(s) for s in got) / chains
    print(f"\n{len(prompts)} prompts, {args.max_new_tokens} new tokens, {chains} chains of "
          f"{block - 1} drafts (tau {tau:.3f}), {args.threads} thread(s), {args.rounds} rounds")
    print(f"{'side':<12} {'seconds':>9} {'chains/s':>10}")
    print(f"{'ours':<12} {o:>9.4f} {chains / o:>10.1f}")
    print(f"{'reference':<12} {r:>9.4f} {chains / r:>10.1f}")
    print(f"scorer_vs_reference_ratio={r / o:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
