"""The reference side of test_dflash_speculators.py, run in a subprocess with speculators 0.9.0 on
the path (.venv/trainer-oracles; its pins clash with the project's).

    python dflash_speculators_reference.py SPEC.json

SPEC: {"target": DIR (a HF Qwen3 checkpoint), "out": DIR, "variants": {name: {...}},
"context": C, "seed": S}. For each variant: speculators' own DFlashDraftModel (random weights,
the target's embedding, and its lm_head or that head's rows of a draft vocabulary), saved by
save_pretrained into DIR/name; random context features [C, n·H] and a block [anchor, mask × (B −
1)] at positions C .. C + B − 1 after them; the package's own layers over them (queries from the
block, keys and values from [context ; block], every key visible: full attention) and its head:
DIR/name.cases.safetensors holds case.0.features and ref.logits [B − 1, Vd], metadata
{"anchor": a}. A variant with "dflash2" is speculators' DFlash2DraftModel (random convolutions and
selector): also ref.path [B − 1], z-lab's greedy walk over speculators' own candidate scores
(speculators scores given predecessors; the walk feeds each chosen token back as the next one),
and ref.forced_logits [B − 1, V]: the selector's candidate scores (−inf elsewhere) with random
predecessors ref.given [B − 2] after the anchor, the proposal's logits under teacher forcing.
"""
from __future__ import annotations

import json
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from dspark_reference import (load_spec, qwen3_layers, share_target_head,  # noqa: E402
                              speculators_block_states)


def main() -> None:
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig
    from speculators_configs import greedy_speculators_config

    spec, out, tc, target = load_spec()
    V, H = tc.vocab_size, tc.hidden_size
    for i, (name, v) in enumerate(spec["variants"].items()):
        g = torch.Generator().manual_seed(spec["seed"] + i)
        tl = qwen3_layers(v, tc)
        B, Vd, ids = v["block"], v["draft_vocab"], v["aux_ids"]
        two = v.get("dflash2", False)
        extra = {}
        if two:
            extra = dict(conv_kernel_size=v["conv_kernel_size"], conv_group_size=v["conv_group_size"],
                         selector_rank=v["selector_rank"], selector_top_k=v["selector_top_k"])
        cfg = (DFlash2SpeculatorConfig if two else DFlashSpeculatorConfig)(
            transformer_layer_config=tl, draft_vocab_size=Vd, block_size=B,
            aux_hidden_state_layer_ids=ids, mask_token_id=V - 1,
            speculators_config=greedy_speculators_config("dflash2" if two else "dflash", B - 1,
                                                         tc.architectures),
            **extra)
        m = (DFlash2DraftModel if two else DFlashDraftModel)(cfg).eval()
        with torch.no_grad():
            for pname, p in m.named_parameters():
                if p.dtype.is_floating_point:
                    noise = torch.randn(p.shape, generator=g)
                    if pname.endswith("norm.weight"):
                        p.copy_(1.0 + 0.2 * noise)
                    elif pname.endswith("base_kernel"):  # identity (tap 0 = 1) plus noise
                        p.copy_(0.3 * noise)
                        p[:, 0] += 1.0
                    elif "codebook" in pname:
                        p.copy_(1.5 * noise)
                    else:
                        p.copy_(0.1 * noise)
        chosen = share_target_head(m, target, V, Vd, g)
        m.save_pretrained(out / name)
        C = spec["context"]
        feats = torch.randn(1, C, len(ids) * H, generator=g)
        anchor = int(torch.randint(0, V - 1, (1,), generator=g))
        block = torch.tensor([[anchor] + [V - 1] * (B - 1)])
        with torch.no_grad():
            normed = speculators_block_states(m, feats, block)[0, 1:]
            logits = m.lm_head(normed)
            path, pred = [], anchor
            if two:
                sel = m.candidate_selector
                for t in range(B - 1):
                    cid, scores = sel.select(logits[None, t:t + 1], normed[None, t:t + 1],
                                             torch.tensor([[pred]]))
                    pred = int(cid[0, 0, int(scores[0, 0].argmax())])
                    path.append(pred)
                # Teacher forcing: the candidate scores given random predecessors (the anchor,
                # then tokens of a trajectory) in one call, as the package scores them.
                given = torch.randint(0, V - 1, (B - 2,), generator=g)
                cid, scores = sel.select(logits[None], normed[None],
                                         torch.cat([torch.tensor([anchor]), given])[None])
                forced = torch.full((B - 1, V), float("-inf"))
                forced.scatter_(1, cid[0], scores[0].float())
        tensors = {"case.0.features": feats[0].contiguous(),
                   "ref.logits": logits.float().contiguous(),
                   "ref.chosen": chosen.to(torch.int64).contiguous()}
        if two:
            assert Vd == V, "the DFlash2 variants have the full vocabulary"
            tensors["ref.path"] = torch.tensor(path, dtype=torch.int64)
            tensors["ref.given"] = given.to(torch.int64).contiguous()
            tensors["ref.forced_logits"] = forced.contiguous()
        save_file(tensors, str(out / f"{name}.cases.safetensors"), metadata={"anchor": str(anchor)})
    print(json.dumps({"variants": list(spec["variants"])}))


if __name__ == "__main__":
    main()
