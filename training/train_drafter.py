"""Trains a DFlash drafter against a target served by specwire-extractor.

This is the pattern a drafter training pipeline follows with specwire: the target never runs in
the training process; everything the drafter needs from it comes through the Python client.

  1. Contract and frozen tensors: ExtractorClient.model_info() (layers, hidden size, vocabulary)
     and get_tensors() for the target's embedding and lm_head, which the drafter shares, frozen.
  2. Data: prompts cut from the corpus train split (training/corpus.py), sent as text; the
     target's own greedy completions come from the extractor's Generate RPC. Drafters accept
     best on what the target itself writes, so they are trained on it (self-distillation).
  3. Features: FeatureDataset streams the hidden states of prompt + completion at the drafter's
     target_layer_ids (prefetched, reconnecting on failure).
  4. The DFlash objective: per sequence random anchors a inside the completion; block =
     [x_a, MASK x (B-1)] embedded with the target's embedding at positions a..a+B-1; context =
     target features of positions < a (strictly: the feature of the anchor's own position is not
     known when the drafter runs); position k of the block predicts x_{a+k}, cross-entropy
     weighted by w_k = exp(-(k-1)/gamma); logits through the target's frozen lm_head.
  5. The drafter is saved in z-lab's dflash format (DFlashDraftModel, config.json with
     dflash_config {mask_token_id, target_layer_ids}), the format specwire-score reads.

Layer ids follow dflash: target_layer_ids k means HF hidden_states[k + 1]. For k = L - 1 (the
last decoder layer) that is HF's final-norm output, so that id is fed from the extractor's
final_norm tap, not from layer.{L-1} (the pre-norm residual).

Either give --extractor HOST:PORT (a running extractor on the target) or --target CHECKPOINT_DIR
to start one on a free loopback port (stopped at the end):

    .venv/bin/python training/train_drafter.py --target models/tiny-qwen3 \
        --out models/tiny-qwen3-dflash
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# Threads that sleep at barriers: busy-waiting OpenMP threads lose badly on a shared machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from dflash.model import DFlashDraftModel  # noqa: E402

from specwire_client import ContractExpectation, ExtractorClient, FeatureDataset  # noqa: E402

import corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# --- the extractor ------------------------------------------------------------------------------

@contextmanager
def extractor(args):
    """The address of the extractor to use: --extractor, or one started on --target."""
    if args.extractor:
        yield args.extractor
        return
    build = Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))
    exe = args.extractor_bin or build / "services" / "extractor" / "specwire-extractor"
    log_path = args.out.parent / f".{args.out.name}-extractor.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), f"--model={args.target}", "--dtype=float32", "--listen=127.0.0.1:0",
           "--metrics_listen=", f"--threads={args.threads}", "--max_new_tokens_limit=4096"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            m = re.search(r"serving .* on port (\d+)", log_path.read_text(errors="replace"))
            if m:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(cmd)} did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        yield f"127.0.0.1:{m.group(1)}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log_path.unlink(missing_ok=True)


def feature_taps(layer_ids: list[int], num_layers: int) -> tuple[list[int], bool, list[str]]:
    """(extractor layer ids, whether the final-norm tap is needed, the state name of each id in
    drafter order), with dflash's convention: id L-1 reads HF hidden_states[L], the final norm."""
    names = ["final_norm" if k == num_layers - 1 else f"layer.{k}" for k in layer_ids]
    return [k for k in layer_ids if k != num_layers - 1], num_layers - 1 in layer_ids, names


# --- data ---------------------------------------------------------------------------------------

def corpus_prompts(n: int, min_lines: int, max_lines: int, max_chars: int, seed: int,
                   heldout: bool = False) -> list[str]:
    """n prompts: runs of whole lines from random corpus files, starting at a non-blank line."""
    rng = random.Random(seed)
    files = corpus.split(heldout=heldout)
    out: list[str] = []
    while len(out) < n:
        lines = corpus.read(rng.choice(files)).splitlines(keepends=True)
        if len(lines) < max_lines + 1:
            continue
        start = rng.randrange(len(lines) - max_lines)
        if not lines[start].strip():
            continue
        text = "".join(lines[start:start + rng.randint(min_lines, max_lines)])[:max_chars]
        if text.strip():
            out.append(text)
    return out


def self_generated(address: str, prompts: list[str], max_new_tokens: int,
                   batch: int) -> list[dict]:
    """The target's greedy completions of the prompts (Generate RPC, prompts tokenized by the
    server): [{"input_ids": prompt + completion, "prompt_len": P}]."""
    out = []
    with ExtractorClient(address, timeout=600) as client:
        for i in range(0, len(prompts), batch):
            for r in client.generate(prompts[i:i + batch], max_new_tokens):
                out.append({"input_ids": r.token_ids,
                            "prompt_len": len(r.prompt_ids)})
    return out


def load_features(address: str, items: list[dict], layer_ids: list[int], final_norm: bool,
                  names: list[str], expect: ContractExpectation) -> list[dict]:
    """Per item {"input_ids": [T], "prompt_len": P, "features": [T, n*H] fp32}, streamed from the
    extractor by FeatureDataset (contract checked on every stream). The features are small for
    a tiny target and are kept in memory for all epochs; a large target would stream them every
    epoch (or store them) the same way."""
    ds = FeatureDataset(address, items, layer_ids=layer_ids, final_norm=final_norm, dtype="fp32",
                        sequences_per_request=8, expect=expect, timeout=600)
    out = []
    for item in ds:
        states = item["hidden_states"]
        out.append({"input_ids": item["input_ids"], "prompt_len": item["prompt_len"],
                    "features": torch.cat([states[n] for n in names], dim=-1).float()})
    return out


# --- the DFlash objective -----------------------------------------------------------------------

def make_batch(seqs: list[dict], anchors_per_seq: int, block: int, mask_id: int,
               g: torch.Generator) -> dict:
    """Blocks of random anchors for a batch of sequences, padded to the longest one.

    Anchors are drawn inside the completion ([P, T-2]: a block needs a label) without
    replacement. The attention mask [b, 1, Q, T + Q]: block j sees context rows < a_j and its
    own B slots (bidirectional, as dflash's full-attention layers at inference), never the other
    blocks; padded context rows sit at positions >= T, so no anchor sees them."""
    T = max(len(s["input_ids"]) for s in seqs)
    n = anchors_per_seq
    Q = n * block
    feats = torch.zeros(len(seqs), T, seqs[0]["features"].shape[1])
    ids = torch.full((len(seqs), Q), mask_id, dtype=torch.long)
    labels = torch.full((len(seqs), Q), -100, dtype=torch.long)
    positions = torch.zeros(len(seqs), T + Q, dtype=torch.long)
    mask = torch.zeros(len(seqs), 1, Q, T + Q, dtype=torch.bool)
    q_block = torch.arange(Q) // block
    same_block = q_block[:, None] == q_block[None, :]
    for b, s in enumerate(seqs):
        x = s["input_ids"]
        t, p = len(x), s["prompt_len"]
        feats[b, :t] = s["features"]
        choices = torch.arange(p, t - 1)
        pick = choices[torch.randperm(len(choices), generator=g)[:n]]
        pick = torch.cat([pick, pick[torch.randint(len(pick), (n - len(pick),), generator=g)]])
        for j, a in enumerate(pick.tolist()):
            sl = slice(j * block, (j + 1) * block)
            ids[b, j * block] = x[a]
            k = min(block, t - a)
            labels[b, j * block + 1:j * block + k] = x[a + 1:a + k]
            positions[b, T + j * block:T + (j + 1) * block] = torch.arange(a, a + block)
            mask[b, 0, sl, :a] = True
        positions[b, :T] = torch.arange(T)
        mask[b, 0, :, T:] = same_block
    return {"features": feats, "ids": ids, "labels": labels, "positions": positions,
            "mask": mask}


def block_weights(block: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k >= 1; slot 0 (the anchor itself) is not predicted."""
    k = torch.arange(block, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def forward_blocks(drafter: DFlashDraftModel, batch: dict, embed: torch.Tensor,
                   head: torch.Tensor) -> torch.Tensor:
    """Logits [b, Q, V] of every block slot (dflash's forward with the training mask)."""
    noise = F.embedding(batch["ids"], embed)
    hidden = drafter(position_ids=batch["positions"], attention_mask=batch["mask"],
                     noise_embedding=noise, target_hidden=batch["features"])
    return F.linear(hidden, head)


def dflash_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                block: int) -> torch.Tensor:
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         ignore_index=-100, reduction="none").view(labels.shape)
    w = weights.repeat(labels.shape[1] // block)[None, :] * (labels != -100)
    return (ce * w).sum() / w.sum()


@torch.no_grad()
def teacher_forced_acceptance(drafter, data: list[dict], args, embed, head) -> dict:
    """Per-slot accuracy and the mean accepted length (+1 bonus) of blocks at random anchors,
    with the data's own continuation as ground truth: a quick proxy of τ during training."""
    drafter.eval()
    g = torch.Generator().manual_seed(1234)
    block = args.block_size
    hits = torch.zeros(block - 1)
    total = torch.zeros(block - 1)
    lengths = []
    for i in range(0, len(data), args.batch):
        batch = make_batch(data[i:i + args.batch], args.anchors_per_seq, block, args.mask_id, g)
        pred = forward_blocks(drafter, batch, embed, head).argmax(-1)
        labels = batch["labels"].view(len(pred), -1, block)[:, :, 1:]
        pred = pred.view(len(pred), -1, block)[:, :, 1:]
        valid = labels != -100
        correct = (pred == labels) & valid
        hits += correct.sum((0, 1)).float()
        total += valid.sum((0, 1)).float()
        accepted = (correct | ~valid).cumprod(-1) & valid
        lengths += (accepted.sum(-1) + 1).flatten().tolist()
    drafter.train()
    return {"per_slot_accuracy": [round(x, 3) for x in (hits / total.clamp(min=1)).tolist()],
            "tau_teacher_forced": round(sum(lengths) / len(lengths), 3)}


# --- main ---------------------------------------------------------------------------------------

def drafter_config(args, contract) -> transformers.Qwen3Config:
    cfg = transformers.Qwen3Config(
        vocab_size=contract.vocab_size, hidden_size=contract.hidden_size,
        intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, rms_norm_eps=1e-6, max_position_embeddings=4096,
        rope_theta=1_000_000.0, layer_types=["full_attention"] * args.layers,
        tie_word_embeddings=False, block_size=args.block_size,
        num_target_layers=contract.num_layers,
        dflash_config={"mask_token_id": args.mask_id, "target_layer_ids": args.target_layer_ids})
    cfg.architectures = ["DFlashDraftModel"]
    return cfg


def save_drafter(drafter: DFlashDraftModel, out: Path, log: dict) -> None:
    """save_pretrained in bfloat16, config.json in z-lab's published layout (rope_theta and
    rope_scaling at the top level)."""
    out.mkdir(parents=True, exist_ok=True)
    drafter.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    drafter.float()
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    params = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = params.get("rope_theta", 1_000_000.0)
    cfg["rope_scaling"] = None
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--extractor", help="address of a running specwire-extractor on the target")
    src.add_argument("--target", type=Path, help="target checkpoint: start an extractor on it")
    ap.add_argument("--extractor-bin", type=Path,
                    help="specwire-extractor binary (default $SPECWIRE_BUILD_DIR or build/)")
    ap.add_argument("--out", type=Path, required=True, help="drafter output directory")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2, help="drafter decoder layers")
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--target-layer-ids", default="1,3",
                    help="comma-separated decoder layers of the target (dflash convention)")
    ap.add_argument("--mask-token", default="<|MASK|>", help="the mask token's text")
    ap.add_argument("--prompts", type=int, default=768, help="training prompts")
    ap.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts for the proxy")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="completion length")
    ap.add_argument("--anchors-per-seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--gamma", type=float, default=None,
                    help="loss decay (default 7 for B=16, 4 for B=8, as in the DFlash paper)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()
    args.target_layer_ids = [int(x) for x in args.target_layer_ids.split(",")]
    gamma = args.gamma or (7.0 if args.block_size >= 16 else 4.0)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()

    with extractor(args) as address:
        with ExtractorClient(address, timeout=120) as client:
            client.wait_ready(60)
            contract = client.model_info()
            mask = client.tokenize(args.mask_token)[0]
            if len(mask) != 1:
                sys.exit(f"--mask-token {args.mask_token!r} is not a single token: {mask}")
            args.mask_id = mask[0]
            tensors = client.get_tensors(["model.embed_tokens.weight", "lm_head.weight"])
        embed = tensors["model.embed_tokens.weight"].float()
        head = tensors["lm_head.weight"].float()
        bad = [k for k in args.target_layer_ids if not 0 <= k < contract.num_layers]
        if bad:
            sys.exit(f"--target-layer-ids {bad}: the target has {contract.num_layers} layers")
        expect = ContractExpectation(num_layers=contract.num_layers,
                                     hidden_size=contract.hidden_size,
                                     vocab_size=contract.vocab_size,
                                     weights_digest=contract.weights_digest)
        layer_ids, final_norm, names = feature_taps(args.target_layer_ids, contract.num_layers)
        print(f"target {contract.architecture}: {contract.num_layers} layers, hidden "
              f"{contract.hidden_size}, vocab {contract.vocab_size}; mask id {args.mask_id}; "
              f"features {names}", flush=True)

        t0 = time.time()
        train_prompts = corpus_prompts(args.prompts, 3, 8, 400, args.seed)
        eval_prompts = corpus_prompts(args.eval_prompts, 3, 8, 400, args.seed + 1, heldout=True)
        train_items = self_generated(address, train_prompts, args.max_new_tokens, 16)
        eval_items = self_generated(address, eval_prompts, args.max_new_tokens, 16)
        t_gen = time.time() - t0
        t0 = time.time()
        train = load_features(address, train_items, layer_ids, final_norm, names, expect)
        held = load_features(address, eval_items, layer_ids, final_norm, names, expect)
        t_feat = time.time() - t0
    # An anchor needs a label after it: completions shorter than 2 tokens give no block.
    train = [s for s in train if len(s["input_ids"]) - s["prompt_len"] >= 2]
    held = [s for s in held if len(s["input_ids"]) - s["prompt_len"] >= 2]
    tokens = sum(len(s["input_ids"]) for s in train)
    print(f"{len(train)} sequences ({tokens} tokens): generated in {t_gen:.0f} s, features in "
          f"{t_feat:.0f} s", flush=True)

    drafter = DFlashDraftModel(drafter_config(args, contract)).float().train()
    params = sum(p.numel() for p in drafter.parameters())
    weights = block_weights(args.block_size, gamma)
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.01)
    g = torch.Generator().manual_seed(args.seed)
    curve = []
    t0 = time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        rows = torch.randint(len(train), (args.batch,), generator=g).tolist()
        batch = make_batch([train[r] for r in rows], args.anchors_per_seq, args.block_size,
                           args.mask_id, g)
        loss = dflash_loss(forward_blocks(drafter, batch, embed, head), batch["labels"],
                           weights, args.block_size)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            curve.append({"step": step, "loss": round(loss.item(), 4),
                          "wall_s": round(time.time() - t0, 1)})
            print(json.dumps(curve[-1]), flush=True)
    t_train = time.time() - t0
    proxy = teacher_forced_acceptance(drafter, held, args, embed, head)
    print(f"held-out proxy: {json.dumps(proxy)}", flush=True)
    log = {"parameters": params, "gamma": gamma,
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "target_contract": {"architecture": contract.architecture,
                               "num_layers": contract.num_layers,
                               "hidden_size": contract.hidden_size,
                               "vocab_size": contract.vocab_size,
                               "weights_digest": contract.weights_digest},
           "feature_states": names, "train_sequences": len(train), "train_tokens": tokens,
           "generate_s": round(t_gen, 1), "features_s": round(t_feat, 1),
           "train_s": round(t_train, 1), "wall_s": round(time.time() - t_start, 1),
           "final_loss": curve[-1]["loss"], "loss_curve": curve, "heldout_proxy": proxy,
           "corpus": corpus.manifest()}
    save_drafter(drafter, args.out, log)


if __name__ == "__main__":
    main()
