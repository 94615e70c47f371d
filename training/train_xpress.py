"""Trains an XPress drafter against a target served by specwire-extractor, starting from a DFlash
drafter of the same target, and saves it in speculators' format (speculators_model_type
"xpress"), through speculators' own XPressDraftModel and XPressRefinerHead.

The pipeline is train_drafter.py's (prompts from the corpus, the target's greedy completions,
features streamed by FeatureDataset, the target's frozen embedding and lm_head). The model is the
DFlash drafter's backbone (dflash 0.1.0's DFlashDraftModel, from --init, kept frozen) with
speculators' causal refiner head (rank --rank, SwiGLU ratio --mlp-ratio; its mixer starts at zero,
so training starts from the DFlash drafter's drafts). In the fill-in layout (sample_from_anchor
false: slot s of the block [anchor, mask, ...] predicts the token at start + s), slot s's logits
are lm_head(h_s) + refiner(the token before it, h_s, the block's mean state); drafting resolves
the block with --passes Jacobi passes from the backbone's argmax. The objective is speculators'
recurrence: a teacher-forced refine pass (the previous tokens are the target's) and
--consistency-passes free-running rounds, each on the argmax of the round before (stop-grad
between rounds, as XPressDraftModel.forward runs them), under DFlash's weighted cross-entropy.

speculators comes from the test oracles' virtualenv:

    PYTHONPATH=.venv/trainer-oracles .venv/bin/python training/train_xpress.py \\
        --target models/tiny-qwen3 --init models/tiny-qwen3-dflash --out models/tiny-qwen3-xpress
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
from safetensors.torch import load_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_drafter import (add_finetune_args, block_slot_tokens, block_weights,  # noqa: E402
                           dflash_init, dflash_loss, finetune_data, finetune_log, fit,
                           frozen_backbone_batch)


def speculators_xpress(dflash_dir: Path, target_config: dict, embed: torch.Tensor,
                       head: torch.Tensor, refiner: dict, args):
    """speculators' XPressDraftModel holding the DFlash drafter's backbone (its layer config;
    aux ids are the DFlash ids + 1, speculators' convention), the target's embedding and head
    (the full vocabulary) and the trained refiner head."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.xpress import XPressDraftModel
    from speculators.models.xpress.config import XPressSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    dc = json.loads((dflash_dir / "config.json").read_text())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
            "max_position_embeddings")
    layers = Qwen3Config(**{k: dc[k] for k in keys}, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": dc["rope_theta"]})
    B = dc["block_size"]
    cfg = XPressSpeculatorConfig(
        transformer_layer_config=layers, draft_vocab_size=dc["vocab_size"], block_size=B,
        aux_hidden_state_layer_ids=[k + 1 for k in dc["dflash_config"]["target_layer_ids"]],
        mask_token_id=dc["dflash_config"]["mask_token_id"], sample_from_anchor=False,
        xpress_rank=args.rank, xpress_mlp_ratio=args.mlp_ratio, num_jacobi_passes=args.passes,
        speculators_config=SpeculatorsConfig(
            algorithm="xpress", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=B - 1)],
            verifier=VerifierConfig(name_or_path=None,
                                    architectures=target_config["architectures"])))
    m = XPressDraftModel(cfg).eval()
    state = {k: v.float() for k, v in load_file(str(dflash_dir / "model.safetensors")).items()}
    state.update({"embed_tokens.weight": embed, "lm_head.weight": head})
    state.update({f"refiner_head.{k}": v for k, v in refiner.items()})
    missing, unexpected = m.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith(("d2t", "t2d", "verifier_")) for k in missing), \
        (missing, unexpected)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_finetune_args(ap, steps=1200, log_every=200)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--mlp-ratio", type=int, default=2)
    ap.add_argument("--passes", type=int, default=4, help="Jacobi passes at inference")
    ap.add_argument("--consistency-passes", type=int, default=3)
    ap.add_argument("--consistency-weight", type=float, default=0.3)
    args = ap.parse_args()
    from speculators.models.xpress.model_definitions import XPressRefinerHead

    t_start = time.time()
    model, block, layer_ids, mask_id = dflash_init(args)
    cfg = model.config
    refiner = XPressRefinerHead(verifier_vocab_size=cfg.vocab_size,
                                draft_vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                                block_size=block, rank=args.rank, mlp_ratio=args.mlp_ratio)

    contract, embed, head, train = finetune_data(args, layer_ids, seed=args.seed + 17)
    weights = block_weights(block, args.gamma)
    model.requires_grad_(False).eval()
    params = list(refiner.parameters())

    def step_loss(g: torch.Generator) -> dict:
        seqs, batch, hidden = frozen_backbone_batch(model, train, args, block, mask_id, embed, g)
        b, Q = batch["ids"].shape
        base = F.linear(hidden, head).view(b * (Q // block), block, -1)
        hcache = refiner.hidden_cache(hidden.view(b * (Q // block), block, -1))
        # The fill-in layout's teacher-forced previous tokens: slot s gets x[a + s − 1].
        prev_tf = block_slot_tokens(batch, seqs, block, shift=-1).view(-1, block)
        labels = batch["labels"]
        teacher = (base + refiner.block_bias(prev_tf, hcache=hcache)).view(b, Q, -1)
        loss_tf = dflash_loss(teacher, labels, weights, block)
        rounds = []
        pred = base.argmax(-1)
        for _ in range(args.consistency_passes):  # XPressDraftModel.forward's rounds
            pred[:, :1] = prev_tf[:, 1:2]  # slot 0 is the anchor
            prev_j = torch.cat([prev_tf[:, :1], pred[:, :-1]], dim=1)
            refined = base + refiner.block_bias(prev_j, hcache=hcache)
            rounds.append(dflash_loss(refined.view(b, Q, -1), labels, weights, block))
            pred = refined.detach().argmax(-1)
        loss_j = torch.stack(rounds).mean() if rounds else torch.zeros(())
        with torch.no_grad():
            base_loss = dflash_loss(base.view(b, Q, -1), labels, weights, block)
        return {"loss": loss_tf + args.consistency_weight * loss_j, "teacher_forced": loss_tf,
                "jacobi_rounds": loss_j, "backbone_only_loss": base_loss}

    curve = fit(params, step_loss, args, args.seed)

    target_config = {"architectures": [contract.architecture]}
    m = speculators_xpress(args.init, target_config, embed, head,
                           {k: v.detach() for k, v in refiner.state_dict().items()}, args)
    args.out.mkdir(parents=True, exist_ok=True)
    m.to(torch.bfloat16).save_pretrained(args.out)
    for p in args.out.iterdir():
        os.chmod(p, 0o644)
    (args.out / "train_log.json").write_text(
        json.dumps(finetune_log(args, params, curve, train, t_start), indent=1) + "\n")
    print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    main()
