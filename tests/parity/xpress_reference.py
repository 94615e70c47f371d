"""The reference side of test_xpress_parity.py, run in a subprocess with speculators 0.9.0 on the
path (.venv/trainer-oracles; its pins clash with the project's).

    python xpress_reference.py SPEC.json
    python xpress_reference.py replay SPEC.json   (see replay)

SPEC: {"target": DIR (a HF Qwen3 checkpoint), "out": DIR, "variants": {name: {...}},
"context": C, "seed": S}. For each variant, speculators' own XPressDraftModel with random weights
(the refiner's mixer too) and the target's embedding and head (or its rows of a draft
vocabulary), saved by its save_pretrained into DIR/name; random context features and a random
block of tokens (anchor first, after the token at C − 1). The package's own backbone layers over
[anchor, mask × (B − 1)] after the context, its head, and its own refiner (hidden_cache,
block_bias) exactly as XPressDraftModel.forward runs it:
- teacher-forced: the refine pass on the block's true previous tokens: ref.logits;
- Jacobi: its consistency rounds (drafts from the base argmax, then num_jacobi_passes passes
  each fed the previous pass's argmax): ref.jacobi_logits (the last pass) and ref.drafts.
Only the drafting slots are kept (slots 1.. in the fill-in layout, all with sample_from_anchor).
DIR/name.cases.safetensors holds case.0.features [C + B, n·H], case.0.tokens [C + B] and the
references."""
from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from dspark_reference import (qwen3_layers, random_case, randomize,  # noqa: E402
                              run_reference, share_target_head, speculators_block_states)


def xpress_model(v: dict, tc, target: dict, g: torch.Generator, layers=None,
                 mask_token_id: int | None = None, refiner_scale: float = 4.0):
    """speculators' XPressDraftModel of variant `v` (random weights; its layer config `layers`,
    by default qwen3_layers of v), the target's embedding and head; the refiner scaled by
    `refiner_scale` (strong enough to move argmaxes by default)."""
    from speculators.models.xpress import XPressDraftModel
    from speculators.models.xpress.config import XPressSpeculatorConfig
    from speculators_configs import greedy_speculators_config

    V = tc.vocab_size
    tl = layers if layers is not None else qwen3_layers(v, tc)
    B, Vd, sfa = v["block"], v["draft_vocab"], v["sample_from_anchor"]
    cfg = XPressSpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=Vd, block_size=B,
        aux_hidden_state_layer_ids=v["aux_ids"],
        mask_token_id=V - 1 if mask_token_id is None else mask_token_id, sample_from_anchor=sfa,
        xpress_rank=v["rank"], xpress_mlp_ratio=v["mlp_ratio"], num_jacobi_passes=v["passes"],
        speculators_config=greedy_speculators_config("xpress", B if sfa else B - 1,
                                                     tc.architectures))
    m = XPressDraftModel(cfg).eval()
    randomize(m, g)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.startswith("refiner_head."):
                p.mul_(refiner_scale)
    share_target_head(m, target, V, Vd, g)
    return m


def xpress_block(m, feats, block, am1, passes: int, sfa: bool, block_tokens=None):
    """The package's own backbone layers over `block` [1, B] after the context features `feats`
    [1, C, n·H], its head, and its own refiner (hidden_cache, block_bias) exactly as
    XPressDraftModel.forward runs it: (the teacher-forced logits on `block_tokens`' previous
    tokens, or None; the last Jacobi pass's logits; its drafts), every slot."""
    hb = speculators_block_states(m, feats, block)  # [1, B, H]
    base = m.lm_head(hb)
    head = m.refiner_head
    hcache = head.hidden_cache(hb.to(head.down_h.weight.dtype))
    # XPressDraftModel.forward's teacher-forced pass and consistency rounds, verbatim.
    anchor_tokens = block[:, :1]
    logits_tf = None
    if block_tokens is not None:
        prev_tf = block_tokens if sfa else torch.cat([am1, block_tokens[:, :-1]], dim=1)
        logits_tf = base + head.block_bias(prev_tf, hcache=hcache)
    pred = m._draft_to_verifier_ids(base.argmax(dim=-1))
    refined = base
    for _ in range(passes):
        if sfa:
            prev_j = torch.cat([anchor_tokens, pred[:, :-1]], dim=1)
        else:
            pred[:, :1] = anchor_tokens
            prev_j = torch.cat([am1, pred[:, :-1]], dim=1)
        refined = base + head.block_bias(prev_j, hcache=hcache)
        pred = m._draft_to_verifier_ids(refined.argmax(dim=-1))
    return logits_tf, refined, pred


def replay(spec: dict) -> None:
    """SPEC: {"dflash": DIR (a z-lab DFlash drafter of "target"), "target": DIR, "out": DIR,
    "prompts": [[ids]], "max_new_tokens": N, "seed": S, "rank": r, "mlp_ratio": m, "passes": p}.
    speculators' own XPressDraftModel holding the DFlash drafter's backbone (its layer config,
    ids + 1 in speculators' convention), the target's embedding and head, and a random refiner,
    saved by its save_pretrained into DIR (or, with "drafter": DIR, a trained one: built from its
    config.json, its weights loaded from its file, the target's embedding and head as its
    verifier weights); the target's
    greedy trajectories and the greedy replay
    written on the package's own drafting (xpress_block: the backbone, then its Jacobi passes):
    per step the full block [anchor, mask × (B − 1)] after the context features of [0, start)
    (dspark_reference.reference_replay). Prints its JSON."""
    from transformers import AutoConfig
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    from dspark_reference import reference_replay

    torch.set_num_threads(1)
    dc = AutoConfig.from_pretrained(spec["dflash"])
    target = load_file(str(Path(spec["target"]) / "model.safetensors"))
    tc = AutoConfig.from_pretrained(spec["target"])
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
            "max_position_embeddings")
    theta = json.loads((Path(spec["dflash"]) / "config.json").read_text())["rope_theta"]
    tl = Qwen3Config(**{k: getattr(dc, k) for k in keys}, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": theta})
    tl._attn_implementation = "eager"
    g = torch.Generator().manual_seed(spec["seed"])
    if spec.get("drafter"):  # a trained one, read by the package's own from_pretrained
        from eagle3_reference import load_speculators
        from speculators.models.xpress import XPressDraftModel
        from speculators.models.xpress.config import XPressSpeculatorConfig

        m, _ = load_speculators(spec["drafter"], XPressSpeculatorConfig, XPressDraftModel)
        share_target_head(m, target, tc.vocab_size, tc.vocab_size, g)  # verifier weights
        v = {"passes": m.config.num_jacobi_passes, "block": m.block_size}
    else:
        v = {"block": dc.block_size, "draft_vocab": dc.vocab_size, "sample_from_anchor": False,
             "aux_ids": [k + 1 for k in dc.dflash_config["target_layer_ids"]],
             "rank": spec["rank"], "mlp_ratio": spec["mlp_ratio"], "passes": spec["passes"]}
        m = xpress_model(v, tc, target, g, layers=tl,
                         mask_token_id=dc.dflash_config["mask_token_id"],
                         refiner_scale=spec.get("refiner_scale", 1.0))
        backbone = {k: x.float() for k, x in
                    load_file(str(Path(spec["dflash"]) / "model.safetensors")).items()}
        missing, unexpected = m.load_state_dict(backbone, strict=False)
        assert not unexpected and all(k.startswith(("refiner_head.", "embed_tokens.", "lm_head.",
                                                    "d2t", "t2d", "verifier_"))
                                      for k in missing), (missing, unexpected)
        m.save_pretrained(spec["out"])
    B, mask = v["block"], dc.dflash_config["mask_token_id"]
    ids = dc.dflash_config["target_layer_ids"]

    def draft(target, feats, traj, start, max_length):
        # Full blocks only: the refiner's mixer is sized for B (a replay that gives max_length
        # room past the trajectory drafts only full blocks too).
        block = torch.tensor([[traj[start]] + [mask] * (B - 1)])
        _, refined, pred = xpress_block(m, feats[:, :start], block,
                                        torch.tensor([[traj[start - 1]]]), v["passes"], False)
        top = refined[0, 1:].topk(2, -1).values
        return pred[0, 1:].tolist(), {"margin": (top[:, 0] - top[:, 1]).tolist(),
                                      "max": float(refined.abs().max())}

    print(json.dumps(reference_replay(spec, ids, draft)))


def forward_main(spec: dict, out: Path, tc, target: dict) -> None:
    V, H = tc.vocab_size, tc.hidden_size
    for i, (name, v) in enumerate(spec["variants"].items()):
        g = torch.Generator().manual_seed(spec["seed"] + i)
        m = xpress_model(v, tc, target, g)
        m.save_pretrained(out / name)
        B, C, sfa = v["block"], spec["context"], v["sample_from_anchor"]
        feats, tokens, block_tokens, block = random_case(v, C, V, H, g)
        am1 = tokens[C - 1:C][None]
        with torch.no_grad():
            logits_tf, refined, pred = xpress_block(m, feats[:, :C], block, am1, v["passes"], sfa,
                                                    block_tokens)
        keep = slice(0, B) if sfa else slice(1, B)
        save_file({"case.0.features": feats[0].contiguous(),
                   "case.0.tokens": tokens.to(torch.int64).contiguous(),
                   "ref.logits": logits_tf[0, keep].float().contiguous(),
                   "ref.jacobi_logits": refined[0, keep].float().contiguous(),
                   "ref.drafts": pred[0, keep].to(torch.int64).contiguous()},
                  str(out / f"{name}.cases.safetensors"))
    print(json.dumps({"variants": list(spec["variants"])}))


if __name__ == "__main__":
    run_reference(replay, forward_main)
