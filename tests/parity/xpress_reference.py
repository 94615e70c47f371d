"""The reference side of test_xpress_parity.py, run in a subprocess with speculators 0.9.0 on the
path (.venv/trainer-oracles; its pins clash with the project's).

    python xpress_reference.py SPEC.json

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

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from dspark_reference import load_spec, qwen3_layers, randomize, share_target_head  # noqa: E402


def xpress_model(v: dict, tc, target: dict, g: torch.Generator):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.xpress import XPressDraftModel
    from speculators.models.xpress.config import XPressSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    V = tc.vocab_size
    tl = qwen3_layers(v, tc)
    B, Vd, sfa = v["block"], v["draft_vocab"], v["sample_from_anchor"]
    cfg = XPressSpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=Vd, block_size=B,
        aux_hidden_state_layer_ids=v["aux_ids"], mask_token_id=V - 1, sample_from_anchor=sfa,
        xpress_rank=v["rank"], xpress_mlp_ratio=v["mlp_ratio"], num_jacobi_passes=v["passes"],
        speculators_config=SpeculatorsConfig(
            algorithm="xpress", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=B if sfa else B - 1)],
            verifier=VerifierConfig(name_or_path=None, architectures=tc.architectures)))
    m = XPressDraftModel(cfg).eval()
    randomize(m, g)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.startswith("refiner_head."):
                p.mul_(4.0)  # a refiner strong enough to move argmaxes
    share_target_head(m, target, V, Vd, g)
    return m


def main() -> None:
    spec, out, tc, target = load_spec()
    V, H = tc.vocab_size, tc.hidden_size
    for i, (name, v) in enumerate(spec["variants"].items()):
        g = torch.Generator().manual_seed(spec["seed"] + i)
        m = xpress_model(v, tc, target, g)
        m.save_pretrained(out / name)
        B, C, ids, sfa = v["block"], spec["context"], v["aux_ids"], v["sample_from_anchor"]
        feats = torch.randn(1, C + B, len(ids) * H, generator=g)
        tokens = torch.randint(0, V - 1, (C + B,), generator=g)
        block_tokens = tokens[C:C + B][None]  # [1, B]: the anchor and the tokens after it
        am1 = tokens[C - 1:C][None]
        block = torch.tensor([[int(block_tokens[0, 0])] + [V - 1] * (B - 1)])
        with torch.no_grad():
            pos = torch.arange(C + B)[None]
            noise = m.embed_tokens(block)
            th = m.hidden_norm(m.fc(feats[:, :C]))
            pe = m.rotary_emb(noise, pos)
            h = noise
            for layer in m.layers:
                h = layer(hidden_states=h, target_hidden=th, attention_mask=None,
                          position_ids=pos, position_embeddings=pe)
            hb = m.norm(h)  # [1, B, H]
            base = m.lm_head(hb)
            head = m.refiner_head
            hcache = head.hidden_cache(hb.to(head.down_h.weight.dtype))
            # XPressDraftModel.forward's teacher-forced pass and consistency rounds, verbatim.
            anchor_tokens = block_tokens[:, :1]
            prev_tf = block_tokens if sfa else torch.cat([am1, block_tokens[:, :-1]], dim=1)
            logits_tf = base + head.block_bias(prev_tf, hcache=hcache)
            pred = m._draft_to_verifier_ids(base.argmax(dim=-1))
            refined = base
            for _ in range(v["passes"]):
                if sfa:
                    prev_j = torch.cat([anchor_tokens, pred[:, :-1]], dim=1)
                else:
                    pred[:, :1] = anchor_tokens
                    prev_j = torch.cat([am1, pred[:, :-1]], dim=1)
                refined = base + head.block_bias(prev_j, hcache=hcache)
                pred = m._draft_to_verifier_ids(refined.argmax(dim=-1))
        keep = slice(0, B) if sfa else slice(1, B)
        save_file({"case.0.features": feats[0].contiguous(),
                   "case.0.tokens": tokens.to(torch.int64).contiguous(),
                   "ref.logits": logits_tf[0, keep].float().contiguous(),
                   "ref.jacobi_logits": refined[0, keep].float().contiguous(),
                   "ref.drafts": pred[0, keep].to(torch.int64).contiguous()},
                  str(out / f"{name}.cases.safetensors"))
    print(json.dumps({"variants": list(spec["variants"])}))


if __name__ == "__main__":
    main()
