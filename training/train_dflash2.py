"""Trains a DFlash2 drafter against a target served by specwire-extractor, starting from a DFlash
drafter of the same target, and saves it in z-lab's DFlash2DraftModel format.

The pipeline is train_drafter.py's (prompts from the corpus, the target's greedy completions,
features streamed by FeatureDataset, the target's frozen embedding and lm_head). The model is
dflash 0.1.0's DFlash2DraftModel: the DFlash backbone (initialised from --init) with a grouped
dynamic causal convolution around every attention and MLP sublayer (initialised to the identity,
so training starts from the DFlash drafter) and a candidate selector. The objective adds to
DFlash's weighted cross-entropy the selector's: at each block position, cross-entropy over the
scores of the unary top-k candidates, with the true previous token as predecessor (as speculators
trains it), where the true token is among them.

Each block is its own sequence here (context rows before its anchor, then its B slots): the
convolutions look back inside a block only, as at inference.

    .venv/bin/python training/train_dflash2.py --target models/tiny-qwen3 \\
        --init models/tiny-qwen3-dflash --out models/tiny-qwen3-dflash2
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from dflash.model import DFlash2DraftModel, DFlashDraftModel  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from train_drafter import (add_finetune_args, block_weights, finetune_data, fit,  # noqa: E402
                           make_batch)



def per_block(batch: dict, block: int) -> dict:
    """make_batch's packed rows [b, n·B] as one row per block: its context rows (those before
    its anchor visible) and its own B slots, bidirectional."""
    b, T, _ = batch["features"].shape
    n = batch["ids"].shape[1] // block
    rows = b * n
    feats = batch["features"].repeat_interleave(n, 0)
    ids = batch["ids"].view(rows, block)
    labels = batch["labels"].view(rows, block)
    positions = torch.cat([batch["positions"][:, :T].repeat_interleave(n, 0),
                           batch["positions"][:, T:].reshape(rows, block)], 1)
    ctx = batch["mask"][:, 0, :, :T].reshape(b, n, block, T).reshape(rows, block, T)
    mask = torch.cat([ctx, torch.ones(rows, block, block, dtype=torch.bool)], -1)[:, None]
    return {"features": feats, "ids": ids, "labels": labels, "positions": positions,
            "mask": mask}


def losses(model: DFlash2DraftModel, batch: dict, embed, head, weights, top_k: int):
    noise = F.embedding(batch["ids"], embed)
    hidden = model(position_ids=batch["positions"], attention_mask=batch["mask"],
                   noise_embedding=noise, target_hidden=batch["features"])  # [rows, B, H] normed
    logits = model.compute_logits(hidden, lambda h: F.linear(h, head))
    labels = batch["labels"]
    valid = labels != -100
    w = weights[None, :] * valid
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         ignore_index=-100, reduction="none").view(labels.shape)
    unary_loss = (ce * w).sum() / w.sum()
    # The selector: predecessor = the true previous token (the anchor for slot 1).
    sel = model.candidate_selector
    u, cand = torch.topk(logits[:, 1:].detach(), top_k, dim=-1)
    pred = torch.cat([batch["ids"][:, :1], labels[:, 1:-1].clamp(min=0)], 1)
    context = sel.predecessor_codebook(pred) * sel.hidden_projection(hidden[:, 1:])
    scores = logits[:, 1:].gather(-1, cand) + (context[:, :, None, :] *
                                               sel.successor_codebook(cand)).sum(-1)
    hit = cand == labels[:, 1:, None]
    target = hit.float().argmax(-1)
    keep = hit.any(-1) & valid[:, 1:]
    sel_ce = F.cross_entropy(scores.reshape(-1, top_k), target.reshape(-1),
                             reduction="none").view(target.shape)
    ws = weights[None, 1:] * keep
    sel_loss = (sel_ce * ws).sum() / ws.sum().clamp(min=1e-9)
    return unary_loss, sel_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_finetune_args(ap, steps=400, log_every=50)
    ap.add_argument("--conv-kernel-size", type=int, default=2)
    ap.add_argument("--conv-group-size", type=int, default=16)
    ap.add_argument("--selector-rank", type=int, default=64)
    ap.add_argument("--selector-top-k", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()

    base = DFlashDraftModel.from_pretrained(args.init, dtype=torch.float32)
    cfg = base.config
    cfg.architectures = ["DFlash2DraftModel"]
    cfg.dflash_config = dict(cfg.dflash_config, conv_kernel_size=args.conv_kernel_size,
                             conv_group_size=args.conv_group_size,
                             selector_rank=args.selector_rank,
                             selector_top_k=args.selector_top_k)
    model = DFlash2DraftModel(cfg).float()
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected, unexpected
    with torch.no_grad():  # identity convolutions: training starts from the DFlash drafter
        for name, p in model.named_parameters():
            if name.endswith("base_kernel"):
                p.zero_()
                p[:, 0] = 1.0
            elif name.endswith("kernel_projection.weight"):
                p.zero_()
            elif "candidate_selector" in name:
                torch.nn.init.normal_(p, std=0.02)
    block = cfg.block_size if hasattr(cfg, "block_size") else cfg.dflash_config["block_size"]
    layer_ids = cfg.dflash_config["target_layer_ids"]

    contract, embed, head, train = finetune_data(args, layer_ids, seed=args.seed + 7)
    weights = block_weights(block, args.gamma)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()

    def step_loss(g: torch.Generator) -> dict:
        rows = torch.randint(len(train), (args.batch,), generator=g).tolist()
        batch = per_block(make_batch([train[r] for r in rows], args.anchors_per_seq, block,
                                     cfg.dflash_config["mask_token_id"], g), block)
        unary, sel = losses(model, batch, embed, head, weights, args.selector_top_k)
        return {"loss": unary + sel, "unary_loss": unary, "selector_loss": sel}

    curve = fit(params, step_loss, args, args.seed)

    args.out.mkdir(parents=True, exist_ok=True)
    model.eval().to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    # z-lab's published layout: the selector's codebooks without ".weight", rope at the top.
    path = args.out / "model.safetensors"
    weights_out = {k.replace("_codebook.weight", "_codebook"): v
                   for k, v in load_file(str(path)).items()}
    save_file(weights_out, str(path))
    os.chmod(path, 0o644)
    cpath = args.out / "config.json"
    c = json.loads(cpath.read_text())
    rope = c.pop("rope_parameters", None) or {}
    c["rope_theta"] = rope.get("rope_theta", 1_000_000.0)
    c["rope_scaling"] = None
    cpath.write_text(json.dumps(c, indent=2) + "\n")
    log = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "parameters": sum(p.numel() for p in params), "train_sequences": len(train),
           "train_s": curve[-1]["wall_s"] if curve else 0.0, "wall_s": round(time.time() - t_start, 1),
           "loss_curve": curve, "corpus": corpus.manifest()}
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    main()
