"""Trains a DSpark drafter against a target served by specwire-extractor, starting from a DFlash
drafter of the same target, and saves it in SpecForge's layout (a z-lab DFlash config with
dflash_config.projector_type "dspark"; architectures DSparkDraftModel).

The pipeline is train_drafter.py's (prompts from the corpus, the target's greedy completions,
features streamed by FeatureDataset, the target's frozen embedding and lm_head). The model is the
DFlash backbone (dflash 0.1.0's DFlashDraftModel, initialised from --init) with DSpark's two
heads, as SpecForge's DSparkDraftModel defines them:
- a Markov logit bias (markov_head_type "vanilla"): draft position k's logits gain
  W2 · W1[previous token], the previous token being the one at position k − 1 (the anchor for the
  first draft); W2 starts at zero, so training starts from the DFlash drafter's logits;
- a confidence head: sigmoid(w · [h_k ; W1[previous token]] + b), the predicted probability that
  draft k is accepted.

SpecForge trains every slot to draft (OnlineDSparkModel: slot k of the block [anchor, mask, ...]
predicts the token k + 1 after the anchor), one more than DFlash, whose slot 0 drafts nothing: the
backbone is fine-tuned into that layout. The objective is DFlash's weighted cross-entropy over the
Markov-corrected logits plus the confidence head's binary cross-entropy against whether each
position's argmax draft equals the target's token (teacher-forced: the earlier positions hold the
target's tokens), which is the greedy acceptance the replay observes at a position once every
earlier draft was accepted.

    .venv/bin/python training/train_dspark.py --target models/tiny-qwen3 \\
        --init models/tiny-qwen3-dflash --out models/tiny-qwen3-dspark
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_drafter import (add_finetune_args, dflash_init, finetune_data,  # noqa: E402
                           finetune_log, fit, make_batch, save_on_dflash_backbone)



class DSparkHeads(torch.nn.Module):
    """SpecForge's vanilla Markov head (markov_head.markov_w1 / markov_w2) and its confidence
    head over [hidden ; W1[previous token]] (confidence_head.proj)."""

    def __init__(self, vocab: int, hidden: int, rank: int):
        super().__init__()
        self.markov_w1 = torch.nn.Embedding(vocab, rank)
        torch.nn.init.normal_(self.markov_w1.weight, std=0.01)
        self.markov_w2 = torch.nn.Linear(rank, vocab, bias=False)
        torch.nn.init.zeros_(self.markov_w2.weight)
        self.proj = torch.nn.Linear(hidden + rank, 1)

    def forward(self, base_logits, hidden, prev):
        e = self.markov_w1(prev)
        return base_logits + self.markov_w2(e), self.proj(torch.cat([hidden, e], -1)).squeeze(-1)


def every_slot_labels(batch: dict, seqs: list[dict], T: int, block: int) -> tuple:
    """SpecForge's layout of make_batch's blocks: slot i of the block anchored at a predicts the
    token at a + i + 1 (−100 past the sequence), and its previous token is the one at a + i."""
    b, Q = batch["ids"].shape
    labels = torch.full((b, Q), -100, dtype=torch.long)
    prev = torch.zeros((b, Q), dtype=torch.long)
    for r, s in enumerate(seqs):
        x = s["input_ids"]
        t = len(x)
        for j in range(Q // block):
            a = int(batch["positions"][r, T + j * block])
            for i in range(block):
                if a + i < t:
                    prev[r, j * block + i] = x[a + i]
                if a + i + 1 < t:
                    labels[r, j * block + i] = x[a + i + 1]
    return labels, prev


def losses(model, heads, batch: dict, labels, prev, embed, head, weights, block: int):
    noise = F.embedding(batch["ids"], embed)
    hidden = model(position_ids=batch["positions"], attention_mask=batch["mask"],
                   noise_embedding=noise, target_hidden=batch["features"])  # [b, Q, H] normed
    logits, confidence = heads(F.linear(hidden, head), hidden, prev)
    valid = labels != -100
    w = weights.repeat(labels.shape[1] // block)[None, :] * valid
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         ignore_index=-100, reduction="none").view(labels.shape)
    hit = (logits.detach().argmax(-1) == labels).float()
    bce = F.binary_cross_entropy_with_logits(confidence, hit, reduction="none")
    return (ce * w).sum() / w.sum(), (bce * w).sum() / w.sum(), (hit * valid).sum() / valid.sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_finetune_args(ap, steps=1500, log_every=250)
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--confidence-alpha", type=float, default=1.0)
    args = ap.parse_args()
    t_start = time.time()
    model, block, layer_ids, mask_id = dflash_init(args)
    cfg = model.config
    heads = DSparkHeads(cfg.vocab_size, cfg.hidden_size, args.markov_rank)

    contract, embed, head, train = finetune_data(args, layer_ids, seed=args.seed + 11)
    # Every slot drafts: slot i weighs exp(−i / γ).
    weights = torch.exp(-torch.arange(block, dtype=torch.float32) / args.gamma)
    params = [p for p in list(model.parameters()) + list(heads.parameters()) if p.requires_grad]
    model.train()

    def step_loss(g: torch.Generator) -> dict:
        rows = torch.randint(len(train), (args.batch,), generator=g).tolist()
        seqs = [train[r] for r in rows]
        batch = make_batch(seqs, args.anchors_per_seq, block, mask_id, g)
        T = batch["features"].shape[1]
        labels, prev = every_slot_labels(batch, seqs, T, block)
        ce, bce, acc = losses(model, heads, batch, labels, prev, embed, head, weights, block)
        return {"loss": ce + args.confidence_alpha * bce, "draft_loss": ce,
                "confidence_loss": bce, "slot_accuracy": acc}

    curve = fit(params, step_loss, args, args.seed)

    named = {(f"markov_head.{n}" if n.startswith("markov_") else f"confidence_head.{n}"): p
             for n, p in heads.state_dict().items()}
    save_on_dflash_backbone(
        model, named, args.out, "DSparkDraftModel",
        {"projector_type": "dspark", "markov_rank": args.markov_rank,
         "markov_head_type": "vanilla", "enable_confidence_head": True,
         "confidence_head_with_markov": True, "confidence_head_alpha": args.confidence_alpha},
        finetune_log(args, params, curve, train, t_start))
    print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    main()
