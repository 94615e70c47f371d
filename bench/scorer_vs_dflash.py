#!/usr/bin/env python3
"""Drafting throughput: specwire's acceptance replay vs dflash 0.1.0's Python loop, same CPU.

Both sides draft the same blocks: the same drafter (random weights; speed does not depend on
their values) on the same target's greedy trajectories, with the same torch and thread count.
dflash_generate runs first to produce the trajectories; specwire-replay then replays exactly
those (--trajectories_file), and the block counts are checked to be equal (the replay is
step-for-step the dflash loop, see tests/parity/test_dflash_parity.py).

What is timed (medians over alternating rounds):
  ours          specwire-replay's in-process time of the replay alone (timing.replay_seconds):
                context appends (fc, hidden_norm, context K/V), every draft forward, lm_head,
                argmax and the acceptance bookkeeping. Target generation and feature extraction
                are outside the timer (they are the extractor's job). Default settings: the
                responses replayed in lockstep (one forward for all their blocks, --batch 16),
                lm_head rows computed until each block's first mismatch.
  ours-seq      the same, one response at a time (--batch 1).
  ours-plain    one response at a time and all B-1 rows of logits per block (--batch 1
                --full_logits): the same arithmetic as dflash's loop, so this column measures
                only the implementation (C++ / libtorch ops vs Python / nn.Module).
  dflash-draft  inside dflash_generate, only the drafting operations: the block embedding
                (_raw_input_embeddings), DFlashDraftModel.forward (context fc + layers), the
                draft-cache crop and compute_logits (the argmax is left out).
  dflash-loop   dflash_generate's whole time minus the target's forward calls (prefill and
                verify): drafting plus the loop's own bookkeeping.
The headline compares against dflash-draft, the stricter baseline (it gives dflash credit for
none of its loop overhead while our time includes all of ours).

--family dflash2: the same with a DFlash2DraftModel (random grouped dynamic convolutions and a
random candidate selector; dflash_generate walks its selector): dflash-draft then also counts
candidate_selector.select, and the replay accepts along the selector's path.

Last line: scorer_vs_dflash_ratio (or scorer_vs_dflash2_ratio)=<median over configs of ours /
dflash-draft blocks per second>.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

# libgomp threads spin at barriers by default; on a shared 2-core machine a spinning team starves
# the other thread and timings swing by several x. Both sides run with the same passive policy
# (set before torch loads libgomp; specwire-replay inherits it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "parity"))

import dflash.model as dflash_model  # noqa: E402
from dflash.model import DFlash2DraftModel, DFlashDraftModel, dflash_generate  # noqa: E402

dflash_model._cuda_time = time.perf_counter  # its timers need CUDA; only return_stats uses them
_ORIGINAL = (dflash_model._make_cache, dflash_model._crop_to, dflash_model._raw_input_embeddings)

# name -> (target config, drafter layer types, sliding window, prompts, prompt length, new tokens)
SIZES = {
    # the parity tier's size: per-operation overhead dominates
    "tiny": (dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16),
             ["sliding_attention", "full_attention"], 12, 4, 16, 96),
    # a 5-layer drafter shaped like z-lab's Qwen3.6 one (4 sliding + 1 full), hidden 256,
    # vocabulary 8192: matrix products start to count
    "small": (dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64),
              ["sliding_attention"] * 4 + ["full_attention"], 64, 4, 32, 96),
}


def build(size: str, cache: Path, family: str = "dflash") -> tuple[Path, Path]:
    tcfg, layer_types, window, *_ = SIZES[size]
    root = cache / size / family
    target_dir, drafter_dir = root / "target", root / "drafter"
    if (drafter_dir / "config.json").exists():
        return target_dir, drafter_dir
    config = transformers.AutoConfig.for_model("qwen3", **tcfg, max_position_embeddings=4096,
                                               tie_word_embeddings=False, rope_theta=1e6,
                                               initializer_range=0.2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(
        target_dir, safe_serialization=True)
    L = tcfg["num_hidden_layers"]
    dcfg = transformers.Qwen3Config(
        vocab_size=tcfg["vocab_size"], hidden_size=tcfg["hidden_size"],
        intermediate_size=tcfg["intermediate_size"], num_hidden_layers=len(layer_types),
        num_attention_heads=tcfg["num_attention_heads"],
        num_key_value_heads=tcfg["num_key_value_heads"], head_dim=tcfg["head_dim"],
        max_position_embeddings=4096, rope_theta=1e6, layer_types=layer_types,
        use_sliding_window=True, sliding_window=window, block_size=16, num_target_layers=L,
        dflash_config={"mask_token_id": tcfg["vocab_size"] - 1,
                       "target_layer_ids": [0, 1, L - 2]})
    dcfg.architectures = ["DFlashDraftModel"]
    torch.manual_seed(1)
    if family == "dflash":
        DFlashDraftModel(dcfg).save_pretrained(drafter_dir, safe_serialization=True)
        return target_dir, drafter_dir
    dcfg.architectures = ["DFlash2DraftModel"]
    dcfg.dflash_config = dict(dcfg.dflash_config, conv_kernel_size=2, conv_group_size=16,
                              selector_rank=64, selector_top_k=16)
    model = DFlash2DraftModel(dcfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("base_kernel"):
                p.normal_(std=0.05)
                p[:, 0] += 1.0
            elif name.endswith("kernel_projection.weight") or "candidate_selector" in name:
                p.normal_(std=0.02)
    model.save_pretrained(drafter_dir, safe_serialization=True)
    return target_dir, drafter_dir


class DflashTimer:
    """Wraps the drafting operations and the target's forward inside dflash_generate."""

    def __init__(self, drafter, target):
        self.draft = 0.0
        self.target = 0.0
        self.draft_caches: set[int] = set()

        def timed(fn, field):
            def wrapper(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    setattr(self, field, getattr(self, field) + time.perf_counter() - t0)
            return wrapper

        drafter.forward = timed(drafter.forward, "draft")
        drafter.compute_logits = timed(drafter.compute_logits, "draft")
        if hasattr(drafter, "candidate_selector"):  # DFlash2's walk
            drafter.candidate_selector.select = timed(drafter.candidate_selector.select, "draft")
        target.forward = timed(target.forward, "target")
        make_cache, crop, embed = _ORIGINAL

        def make_cache_recorded(config):
            cache = make_cache(config)
            if config is drafter.config:
                self.draft_caches.add(id(cache))
            return cache

        def crop_timed(cache, length):
            if id(cache) not in self.draft_caches:
                return crop(cache, length)
            return timed(crop, "draft")(cache, length)

        dflash_model._make_cache = make_cache_recorded
        dflash_model._crop_to = crop_timed
        dflash_model._raw_input_embeddings = timed(embed, "draft")


def run_dflash(drafter, target, timer: DflashTimer, prompts, max_new: int):
    """One pass over the prompts: (steps, draft s, loop-minus-target s, trajectories)."""
    timer.draft = timer.target = 0.0
    steps, total, trajectories = 0, 0.0, []
    for prompt in prompts:
        t0 = time.perf_counter()
        res = dflash_generate(drafter, target, torch.tensor([prompt]), max_new, None,
                              return_stats=True)
        total += time.perf_counter() - t0
        steps += len(res.acceptance_lengths)
        trajectories.append({"prompt": prompt, "completion": res.output_ids[0, len(prompt):].tolist()})
    return steps, timer.draft, total - timer.target, trajectories


VARIANTS = {"ours": [], "ours-seq": ["--batch", "1"],
            "ours-plain": ["--batch", "1", "--full_logits"]}


def run_ours(exe: Path, target_dir: Path, drafter_dir: Path, traj_file: Path, max_new: int,
             threads: int, repeat: int, extra: list[str]) -> tuple[int, float]:
    cmd = [str(exe), "--drafter", str(drafter_dir), "--target_checkpoint", str(target_dir),
           "--trajectories_file", str(traj_file), "--max_new_tokens", str(max_new),
           "--ddtree", "none", "--threads", str(threads), "--reps", str(repeat)] + extra
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr}")
    timing = json.loads(res.stdout.strip().splitlines()[-1])["timing"]
    return timing["dflash_blocks"], timing["replay_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", type=Path,
                    default=Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build")))
    ap.add_argument("--cache-dir", type=Path, default=REPO / "build" / "bench-scorer")
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="replays per specwire-replay call")
    ap.add_argument("--family", choices=["dflash", "dflash2"], default="dflash")
    args = ap.parse_args()
    exe = args.build_dir / "services" / "scorer" / "specwire-replay"
    if not exe.exists():
        raise SystemExit(f"{exe} not built: cmake --build {args.build_dir} --target specwire-replay")
    transformers.utils.logging.set_verbosity_error()

    rows, ratios = [], []
    for size in args.sizes.split(","):
        target_dir, drafter_dir = build(size, args.cache_dir, args.family)
        *_, n_prompts, prompt_len, max_new = SIZES[size]
        rng = random.Random(0)
        vocab = SIZES[size][0]["vocab_size"]
        prompts = [[rng.randrange(vocab - 1) for _ in range(prompt_len)] for _ in range(n_prompts)]
        target = transformers.AutoModelForCausalLM.from_pretrained(
            target_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
        model_class = DFlash2DraftModel if args.family == "dflash2" else DFlashDraftModel
        drafter = model_class.from_pretrained(drafter_dir, dtype=torch.float32).eval()
        timer = DflashTimer(drafter, target)
        for threads in map(int, args.threads.split(",")):
            torch.set_num_threads(threads)
            steps, _, _, trajectories = run_dflash(drafter, target, timer, prompts, max_new)  # warm-up
            traj_file = args.cache_dir / size / args.family / "trajectories.json"
            traj_file.write_text(json.dumps(trajectories))
            d_draft, d_loop = [], []
            o_time: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                s, draft_s, loop_s, _ = run_dflash(drafter, target, timer, prompts, max_new)
                assert s == steps
                d_draft.append(draft_s)
                d_loop.append(loop_s)
                for variant, extra in VARIANTS.items():
                    blocks, seconds = run_ours(exe, target_dir, drafter_dir, traj_file, max_new,
                                               threads, args.repeat, extra)
                    if blocks != steps:
                        raise SystemExit(f"{size} {variant}: specwire replayed {blocks} blocks, "
                                         f"dflash drafted {steps}")
                    o_time[variant].append(seconds)
            ours = {v: steps / statistics.median(t) for v, t in o_time.items()}
            draft = steps / statistics.median(d_draft)
            loop = steps / statistics.median(d_loop)
            rows.append((size, threads, steps, ours, draft, loop))
            ratios.append(ours["ours"] / draft)

    print("blocks per second (higher is better)")
    print(f"{'size':<6} {'threads':>7} {'blocks':>6} {'ours':>8} {'ours-seq':>9} {'ours-plain':>10} "
          f"{'dflash-draft':>12} {'dflash-loop':>11} {'ours/draft':>10} {'plain/draft':>11}")
    for size, threads, steps, ours, draft, loop in rows:
        print(f"{size:<6} {threads:>7} {steps:>6} {ours['ours']:>8.1f} {ours['ours-seq']:>9.1f} "
              f"{ours['ours-plain']:>10.1f} {draft:>12.1f} {loop:>11.1f} "
              f"{ours['ours'] / draft:>10.2f} {ours['ours-plain'] / draft:>11.2f}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{os.cpu_count()} CPUs, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; medians of "
          f"{args.rounds} rounds; blocks = drafting steps (identical on both sides); "
          f"specwire-replay --batch 16 (all {'/'.join(str(SIZES[s][3]) for s in SIZES)} responses "
          f"in lockstep)")
    name = "scorer_vs_dflash_ratio" if args.family == "dflash" else "scorer_vs_dflash2_ratio"
    print(f"{name}={statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
