"""The specwire side of scripts/vllm_audit.sh (run in .venv):

    vllm_audit_steps.py trajectories ADDR OUT   greedy completions of 16 held-out prompts
    vllm_audit_steps.py impact ADDR OUT DIR     the shipped drafter on vLLM's features vs ours
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from specwire_client import ExtractorClient
from specwire_client.audit import acceptance_impact, read_vllm

REPO = Path(__file__).resolve().parents[2]


def trajectories(addr: str, out: Path) -> None:
    lines = (REPO / "models" / "heldout_prompts.jsonl").read_text().splitlines()[:16]
    prompts = [json.loads(line)["prompt"] for line in lines]
    with ExtractorClient(addr, timeout=300) as c:
        res = c.generate(prompts, 48, ignore_model_eos=True)
    (out / "sequences.json").write_text(json.dumps([r.token_ids for r in res]))
    (out / "prompt_lens.json").write_text(json.dumps([len(r.prompt_ids) for r in res]))


def impact(addr: str, out: Path, d: Path) -> None:
    seqs = json.loads((out / "sequences.json").read_text())
    lens = json.loads((out / "prompt_lens.json").read_text())
    # A dataset's rows may be in another order (speculators' prepare-data shuffles): each file is
    # matched to its trajectory by its token ids, and every trajectory must have one.
    by_ids = {tuple(s.token_ids): s for s in read_vllm(d)}
    if sorted(by_ids) != sorted(tuple(s) for s in seqs):
        raise SystemExit(f"{d}: the files hold other token ids than the trajectories")
    samples = [by_ids[tuple(s)] for s in seqs]
    # What vLLM's DFlash path feeds a drafter with target_layer_ids [1, 3]: its ids [2, 4].
    foreign = [torch.cat([s.tensors[2].data, s.tensors[4].data], -1).float() for s in samples]
    r = acceptance_impact(addr, REPO / "models" / "tiny-qwen3-dflash", REPO / "models" / "tiny-qwen3",
                          list(zip(seqs, lens)), foreign,
                          replay=REPO / "build" / "services" / "scorer" / "specwire-replay")
    print(f"tau canonical {r.tau_canonical:.3f} {r.tau_canonical_ci}, vLLM {r.tau_foreign:.3f} "
          f"{r.tau_foreign_ci}: {r.verdict()}")


if __name__ == "__main__":
    cmd, addr, out, *rest = sys.argv[1:]
    if cmd == "trajectories":
        trajectories(addr, Path(out))
    else:
        impact(addr, Path(out), Path(rest[0]))
