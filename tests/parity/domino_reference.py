"""The reference side of test_domino_parity.py, run in a subprocess with SpecForge 0.2.0 on the
path (.venv/trainer-oracles; its pins clash with the project's).

    python domino_reference.py SPEC.json
    python domino_reference.py replay SPEC.json   (see replay)

SPEC: {"target": DIR (a HF Qwen3 checkpoint), "out": DIR, "variants": {name: {...}},
"context": C, "seed": S}. For each variant, SpecForge's own DominoDraftModel with random weights,
saved by its save_pretrained into DIR/name (with "legacy_keys", its head renamed under
logit_head., the layout early checkpoints have and SpecForge still loads); random context
features [C, n·H] and a random block of tokens (anchor first). Two references:
- teacher-forced: the package's forward over [anchor, mask × (B − 1)] after the context (every
  key visible), the target's lm_head, and its own apply_logits_head with the block's true tokens
  as the previous tokens: ref.logits [B − 1, V], the drafts' rows (slot k, or k − 1 with
  shift_label);
- greedy: its own _sample_draft_tokens (spec_generate's block sampler, temperature 0) on the
  same block: ref.drafts [B − 1].
DIR/name.cases.safetensors holds case.0.features [C + B, n·H] (rows past C unused),
case.0.tokens [C + B] (the block's tokens at C ..), ref.logits and ref.drafts."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from dspark_reference import (on_dflash_backbone, random_case, randomize,  # noqa: E402
                              reference_replay, run_reference, specforge_config)


def domino_model(v: dict, tc, g: torch.Generator):
    from specforge.modeling.draft.domino import DominoDraftModel

    cfg = specforge_config(v, tc, "domino", "DominoDraftModel", emb_dim=v["emb_dim"],
                           gru_hidden_dim=v["gru"], pure_draft_prefix_len=v["prefix"],
                           shift_label=v["shift"])
    m = DominoDraftModel(cfg).eval()
    randomize(m, g)
    with torch.no_grad():  # a correction large enough to change argmaxes
        for name, p in m.named_parameters():
            if name.startswith(("prefix_gru.", "embed_proj.")):
                p.mul_(5.0)
    return m


def replay(spec: dict) -> None:
    """SPEC: {"dflash": DIR (a z-lab DFlash drafter), "target": DIR, "out": DIR, "prompts":
    [[ids]], "max_new_tokens": N, "seed": S, "shift_label": bool, "pure_draft_prefix_len": p,
    "emb_dim": e, "gru_hidden_dim": g}. SpecForge's own DominoDraftModel on the DFlash drafter's
    backbone with a random logit correction (large enough to change drafts), saved by its
    save_pretrained into DIR (or, with "drafter": DIR, a trained one loaded by its
    from_pretrained); the target's greedy trajectories and the greedy replay written on
    the package's own forward and block sampler (_sample_draft_tokens, spec_generate's): per step
    the block [anchor, mask × (len − 1)], len = min(B, max_length − start), after the context
    features of [0, start) (dspark_reference.reference_replay). Prints its JSON."""
    from specforge.modeling.draft.domino import DominoDraftModel

    def heads(name, p, g):  # a correction that changes some drafts and keeps others
        p.copy_(spec.get("head_scale", 0.1) * torch.randn(p.shape, generator=g))

    if spec.get("drafter"):  # a trained one, read by the package's own from_pretrained
        from transformers import AutoConfig

        torch.set_num_threads(1)
        cfg = AutoConfig.from_pretrained(spec["drafter"])
        cfg._attn_implementation = "eager"
        m = DominoDraftModel.from_pretrained(spec["drafter"], config=cfg,
                                             dtype=torch.float32).eval()
    else:
        m = on_dflash_backbone(spec, DominoDraftModel, "domino", ("prefix_gru.", "embed_proj."),
                               heads, emb_dim=spec["emb_dim"],
                               gru_hidden_dim=spec["gru_hidden_dim"],
                               pure_draft_prefix_len=spec["pure_draft_prefix_len"],
                               shift_label=spec["shift_label"])
    B, mask = m.block_size, m.mask_token_id

    def draft(target, feats, traj, start, max_length):
        n = min(B, max_length - start)
        block = torch.tensor([[traj[start]] + [mask] * (n - 1)])
        hidden = m(position_ids=torch.arange(start + n)[None], attention_mask=None,
                   noise_embedding=target.model.embed_tokens(block),
                   target_hidden=feats[:, :start])  # [1, n, H]
        return m._sample_draft_tokens(target, hidden, block.clone())[0].tolist(), {}

    print(json.dumps(reference_replay(spec, m.target_layer_ids, draft)))


def forward_main(spec: dict, out: Path, tc, target: dict) -> None:
    V = tc.vocab_size
    embed = target["model.embed_tokens.weight"].float()
    target_head = target.get("lm_head.weight", embed).float()
    stub = SimpleNamespace(lm_head=lambda h: h @ target_head.T,
                           model=SimpleNamespace(embed_tokens=lambda ids: embed[ids]))
    for i, (name, v) in enumerate(spec["variants"].items()):
        g = torch.Generator().manual_seed(spec["seed"] + i)
        m = domino_model(v, tc, g)
        m.save_pretrained(out / name)
        if v.get("legacy_keys"):
            st = out / name / "model.safetensors"
            t = load_file(str(st))
            t = {("logit_head." + k if k.startswith(("prefix_gru.", "embed_proj.")) else k): x
                 for k, x in t.items()}
            save_file(t, str(st), metadata={"format": "pt"})
        B, C = v["block"], spec["context"]
        feats, tokens, block_tokens, block = random_case(v, C, V, tc.hidden_size, g)
        with torch.no_grad():
            hidden = m(position_ids=torch.arange(C + B)[None], attention_mask=None,
                       noise_embedding=embed[block], target_hidden=feats[:, :C])  # [1, B, H]
            base = stub.lm_head(hidden)
            final = m.apply_logits_head(base.unsqueeze(1),
                                        prev_token_embeddings=embed[block_tokens].unsqueeze(1),
                                        hidden_states=hidden.unsqueeze(1))[0, 0]  # [B, V]
            logits = final[:B - 1] if v["shift"] else final[1:]
            drafts = m._sample_draft_tokens(stub, hidden, block.clone())[0]
        save_file({"case.0.features": feats[0].contiguous(),
                   "case.0.tokens": tokens.to(torch.int64).contiguous(),
                   "ref.logits": logits.float().contiguous(),
                   "ref.drafts": drafts.to(torch.int64).contiguous()},
                  str(out / f"{name}.cases.safetensors"))
    print(json.dumps({"variants": list(spec["variants"])}))


if __name__ == "__main__":
    run_reference(replay, forward_main)
