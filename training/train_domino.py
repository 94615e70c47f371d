"""Trains a Domino drafter against a target served by specwire-extractor, starting from a DFlash
drafter of the same target, and saves it in SpecForge's layout (a z-lab DFlash config with
dflash_config.projector_type "domino"; architectures DominoDraftModel).

The pipeline is train_drafter.py's (prompts from the corpus, the target's greedy completions,
features streamed by FeatureDataset, the target's frozen embedding and lm_head). The model is the
DFlash backbone (dflash 0.1.0's DFlashDraftModel, initialised from --init) with Domino's logit
correction, as SpecForge's DominoDraftModel defines it: draft position k of a block (the anchor
at 0) takes the backbone's logits lm_head(h_k) plus

    embed_proj(cat[h_k, g_{k-1}])      embed_proj: Linear(H + G -> E) -> SiLU -> Linear(E -> V)

where g_{k-1} is a one-layer GRU without biases over the target embeddings of the block's tokens
0 .. k-1 (the anchor and the tokens before k), so a position conditions on the drafts before it.
The layout is DFlash's (shift_label false: slot k holds h_k; pure_draft_prefix_len 0), so the
backbone is the DFlash drafter's, kept frozen (fine-tuning it with the correction at this
learning rate first undoes what it knows), and embed_proj's last layer starts at zero: training
starts from the DFlash drafter's drafts and learns only what the drafts before a position add.
The objective is DFlash's weighted cross-entropy over the corrected logits, teacher-forced (the GRU
reads the target's tokens), which is what the greedy replay sees at a position once every
earlier draft was accepted.

    .venv/bin/python training/train_domino.py --target models/tiny-qwen3 \\
        --init models/tiny-qwen3-dflash --out models/tiny-qwen3-domino
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
from train_drafter import (add_finetune_args, block_slot_tokens, block_weights,  # noqa: E402
                           dflash_init, dflash_loss, finetune_data, finetune_log, fit,
                           frozen_backbone_batch, save_on_dflash_backbone)


class DominoCorrection(torch.nn.Module):
    """SpecForge's prefix_gru and embed_proj (its parameter names)."""

    def __init__(self, hidden: int, vocab: int, gru_hidden: int, emb_dim: int):
        super().__init__()
        self.prefix_gru = torch.nn.GRU(hidden, gru_hidden, num_layers=1, bias=False,
                                       batch_first=True)
        self.embed_proj = torch.nn.Sequential(
            torch.nn.Linear(hidden + gru_hidden, emb_dim, bias=False), torch.nn.SiLU(),
            torch.nn.Linear(emb_dim, vocab, bias=False))
        torch.nn.init.zeros_(self.embed_proj[2].weight)

    def forward(self, hidden, prefix_embeddings, block: int):
        """hidden [b, Q, H] (slot k of each block holds h_k), prefix_embeddings [b, Q, H] (slot k:
        the embedding of the block's token k) -> the correction [b, Q, V] (slot 0: zero)."""
        b, Q, H = hidden.shape
        n = Q // block
        x = prefix_embeddings.view(b * n, block, H)[:, :block - 1]  # tokens 0 .. B-2
        g = self.prefix_gru(x)[0]                                     # g_0 .. g_{B-2}
        h = hidden.view(b * n, block, H)[:, 1:]                       # h_1 .. h_{B-1}
        corr = self.embed_proj(torch.cat([h, g], -1))
        corr = torch.cat([torch.zeros_like(corr[:, :1]), corr], 1)
        return corr.view(b, Q, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_finetune_args(ap, steps=1200, log_every=200)
    ap.add_argument("--gru-hidden", type=int, default=64)
    ap.add_argument("--emb-dim", type=int, default=64)
    args = ap.parse_args()
    t_start = time.time()
    model, block, layer_ids, mask_id = dflash_init(args)
    cfg = model.config
    correction = DominoCorrection(cfg.hidden_size, cfg.vocab_size, args.gru_hidden, args.emb_dim)

    contract, embed, head, train = finetune_data(args, layer_ids, seed=args.seed + 13)
    weights = block_weights(block, args.gamma)
    model.requires_grad_(False).eval()
    params = list(correction.parameters())

    def step_loss(g: torch.Generator) -> dict:
        seqs, batch, hidden = frozen_backbone_batch(model, train, args, block, mask_id, embed, g)
        base = F.linear(hidden, head)
        tokens = F.embedding(block_slot_tokens(batch, seqs, block), embed)
        logits = base + correction(hidden, tokens, block)
        labels = batch["labels"]
        loss = dflash_loss(logits, labels, weights, block)
        valid = labels != -100
        with torch.no_grad():
            base_loss = dflash_loss(base, labels, weights, block)
            acc = ((logits.argmax(-1) == labels) & valid).sum() / valid.sum()
        return {"loss": loss, "backbone_only_loss": base_loss, "slot_accuracy": acc}

    curve = fit(params, step_loss, args, args.seed)
    save_on_dflash_backbone(
        model, dict(correction.state_dict()), args.out, "DominoDraftModel",
        {"projector_type": "domino", "emb_dim": args.emb_dim,
         "gru_hidden_dim": args.gru_hidden, "pure_draft_prefix_len": 0, "shift_label": False},
        finetune_log(args, params, curve, train, t_start))
    print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    main()
