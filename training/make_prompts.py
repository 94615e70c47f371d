"""Writes the held-out prompt set: runs of 3-8 whole lines (at most 400 characters) from files of
the corpus' held-out split, which neither the target nor the drafter saw in training.

    .venv/bin/python training/make_prompts.py --out models/heldout_prompts.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import corpus
from train_drafter import corpus_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    prompts = corpus_prompts(args.n, 3, 8, 400, args.seed, heldout=True)
    assert all(corpus.is_heldout(f) for f in corpus.split(heldout=True))
    with open(args.out, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}, ensure_ascii=False) + "\n")
    print(f"{len(prompts)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
