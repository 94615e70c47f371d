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
{"anchor": a}.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402


def main() -> None:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    tc = AutoConfig.from_pretrained(spec["target"])
    target = load_file(str(Path(spec["target"]) / "model.safetensors"))
    V, H = tc.vocab_size, tc.hidden_size
    torch.set_num_threads(1)
    for i, (name, v) in enumerate(spec["variants"].items()):
        g = torch.Generator().manual_seed(spec["seed"] + i)
        tl = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=2 * H,
                         num_hidden_layers=v["layers"], num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": v["theta"]})
        tl._attn_implementation = "eager"
        B, Vd, ids = v["block"], v["draft_vocab"], v["aux_ids"]
        cfg = DFlashSpeculatorConfig(
            transformer_layer_config=tl, draft_vocab_size=Vd, block_size=B,
            aux_hidden_state_layer_ids=ids, mask_token_id=V - 1,
            speculators_config=SpeculatorsConfig(
                algorithm="dflash", default_proposal_method="greedy",
                proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=B - 1)],
                verifier=VerifierConfig(name_or_path=None, architectures=tc.architectures)))
        m = DFlashDraftModel(cfg).eval()
        with torch.no_grad():
            for pname, p in m.named_parameters():
                if p.dtype.is_floating_point:
                    noise = torch.randn(p.shape, generator=g)
                    p.copy_(1.0 + 0.2 * noise if pname.endswith("norm.weight") else 0.1 * noise)
            m.embed_tokens.weight.copy_(target["model.embed_tokens.weight"])
            head = target.get("lm_head.weight", target["model.embed_tokens.weight"])
            chosen = torch.arange(V)
            if Vd != V:
                chosen = torch.randperm(V, generator=g)[:Vd].sort().values
                m.d2t.copy_(chosen - torch.arange(Vd))
                t2d = torch.zeros(V, dtype=torch.bool)
                t2d[chosen] = True
                m.t2d.copy_(t2d)
            m.lm_head.weight.copy_(head[chosen])
        m.save_pretrained(out / name)
        C = spec["context"]
        feats = torch.randn(1, C, len(ids) * H, generator=g)
        anchor = int(torch.randint(0, V - 1, (1,), generator=g))
        block = torch.tensor([[anchor] + [V - 1] * (B - 1)])
        with torch.no_grad():
            noise = m.embed_tokens(block)
            pos = torch.arange(C + B)[None]
            th = m.hidden_norm(m.fc(feats))
            pe = m.rotary_emb(noise, pos)
            h = noise
            for layer in m.layers:
                h = layer(hidden_states=h, target_hidden=th, attention_mask=None,
                          position_ids=pos, position_embeddings=pe)
            logits = m.lm_head(m.norm(h))[0, 1:]
        save_file({"case.0.features": feats[0].contiguous(),
                   "ref.logits": logits.float().contiguous(),
                   "ref.chosen": chosen.to(torch.int64).contiguous()},
                  str(out / f"{name}.cases.safetensors"), metadata={"anchor": str(anchor)})
    print(json.dumps({"variants": list(spec["variants"])}))


if __name__ == "__main__":
    main()
