"""vLLM's side of bench/extract_vs_vllm.py (run in .venv-vllm, vLLM's CPU build): the prefill of
batches of token-id prompts (max_tokens=1, so one forward over every prompt token), timed.

    python vllm_prefill.py MODEL_DIR DTYPE REPS BATCHxLEN[,BATCHxLEN...]

Prints one JSON line per shape: {"batch", "seq_len", "times_s"} (after one untimed warm-up).
"""
from __future__ import annotations

import json
import sys
import time

from vllm import LLM, SamplingParams


def main() -> None:
    model, dtype, reps, shapes = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    plan = [tuple(int(x) for x in s.split("x")) for s in shapes.split(",")]
    longest = max(b * n for b, n in plan)
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=max(n for _, n in plan) + 8,
              max_num_batched_tokens=longest, max_num_seqs=max(b for b, _ in plan),
              enable_prefix_caching=False, seed=0)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for batch, n in plan:
        # The same ids as specwire-bench-extract's ((t * 7919 + 13) % vocab), one prompt per row;
        # the row index shifts them so no two prompts share a prefix.
        vocab = llm.llm_engine.model_config.get_vocab_size()
        prompts = [{"prompt_token_ids": [((t + 101 * b) * 7919 + 13) % vocab for t in range(n)]}
                   for b in range(batch)]
        llm.generate(prompts, params, use_tqdm=False)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            times.append(time.perf_counter() - t0)
        print(json.dumps({"batch": batch, "seq_len": n, "times_s": times}), flush=True)


if __name__ == "__main__":
    main()
