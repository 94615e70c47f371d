"""The reference side of test_dspark_parity.py, run in a subprocess with speculators 0.9.0 and
SpecForge 0.2.0 on the path (.venv/trainer-oracles; their pins clash with the project's).

    python dspark_reference.py SPEC.json

SPEC: {"target": DIR (a HF Qwen3 checkpoint), "out": DIR, "variants": {name: {...}},
"context": C, "seed": S}. For each variant, the package's own DSparkDraftModel (speculators' or
SpecForge's, by "format") with random weights and the target's embedding and head, saved by its
save_pretrained into DIR/name; random context features [C, n·H], a random block of tokens
(anchor first) and the package's own forward over them: its layers (queries from the block
[anchor, mask × (B − 1)], keys and values from [context ; block], every key visible), its final
norm, its head, and then its own Markov head and confidence head exactly as its training forward
applies them (speculators: `DSparkDraftModel.forward`'s block_bias over every slot, previous
tokens per `sample_from_anchor`; SpecForge: `apply_logits_head` / `predict_confidence` over every
slot, previous tokens as OnlineDSparkModel trains them: the anchor, then the block's tokens). DIR/name.cases.safetensors holds
case.0.features [C + B, n·H] (rows past C unused), case.0.tokens [C + B] (the block's tokens at
C ..), ref.logits [n, Vd] (the drafted positions, in order), ref.confidence [n] (sigmoid; absent
without the head), ref.chosen (the draft vocabulary's target ids).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402


def load_spec() -> tuple[dict, Path, object, dict]:
    """A reference script's SPEC.json (argv[1]): (spec, its "out", the target's config, the
    target's tensors); one torch thread."""
    from transformers import AutoConfig

    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    return (spec, Path(spec["out"]), AutoConfig.from_pretrained(spec["target"]),
            load_file(str(Path(spec["target"]) / "model.safetensors")))


def run_reference(replay, forward) -> None:
    """A reference script's command line: `replay SPEC.json` runs replay(spec); `SPEC.json`
    runs forward(*load_spec()), the forward cases."""
    if sys.argv[1] == "replay":
        replay(json.loads(Path(sys.argv[2]).read_text()))
        return
    forward(*load_spec())


def qwen3_layers(v: dict, tc):
    """The Qwen3 layer config of a DFlash-based variant `v` over the target config `tc`."""
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    tl = Qwen3Config(vocab_size=tc.vocab_size, hidden_size=tc.hidden_size,
                     intermediate_size=2 * tc.hidden_size, num_hidden_layers=v["layers"],
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": v["theta"]})
    tl._attn_implementation = "eager"
    return tl


def share_target_head(m, target: dict, V: int, Vd: int, g: torch.Generator) -> torch.Tensor:
    """The target's embedding and head into a speculators draft model `m` (no grad): with a draft
    vocabulary (Vd < V) a random sorted subset of the head's rows, d2t and t2d to match. The
    draft vocabulary's target ids."""
    with torch.no_grad():
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
    return chosen


def randomize(m: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for pname, p in m.named_parameters():
            if not p.dtype.is_floating_point:
                continue
            noise = torch.randn(p.shape, generator=g)
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif "markov" in pname or "confidence" in pname:
                p.copy_(0.5 * noise)  # large enough that the heads change argmaxes
            else:
                p.copy_(0.1 * noise)


def speculators_model(v: dict, tc, target: dict, g: torch.Generator):
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators_configs import greedy_speculators_config

    V = tc.vocab_size
    tl = qwen3_layers(v, tc)
    B, Vd = v["block"], v["draft_vocab"]
    sfa = v["sample_from_anchor"]
    cfg = DSparkSpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=Vd, block_size=B,
        aux_hidden_state_layer_ids=v["aux_ids"], mask_token_id=V - 1, sample_from_anchor=sfa,
        markov_rank=v["markov_rank"], markov_head_type=v["markov_head_type"],
        enable_confidence_head=v["confidence"],
        confidence_head_with_markov=v["confidence_with_markov"],
        speculators_config=greedy_speculators_config("dspark", B if sfa else B - 1,
                                                     tc.architectures))
    m = DSparkDraftModel(cfg).eval()
    randomize(m, g)
    return m, share_target_head(m, target, V, Vd, g)


def specforge_config(v: dict, tc, projector: str, architecture: str, **heads):
    """SpecForge's draft config of a DFlash-based family (`projector`: its projector_type) for
    the target config `tc`, with the family's head keys in dflash_config."""
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    V, H = tc.vocab_size, tc.hidden_size
    dflash_config = {"target_layer_ids": [k - 1 for k in v["aux_ids"]], "mask_token_id": V - 1,
                     "projector_type": projector, "attention_mode": "gqa", **heads}
    cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=2 * H,
                      num_hidden_layers=v["layers"], num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                      max_position_embeddings=4096, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": v["theta"]},
                      num_target_layers=tc.num_hidden_layers, block_size=v["block"],
                      dflash_config=dflash_config, architectures=[architecture])
    cfg._attn_implementation = "eager"
    return cfg


def specforge_model(v: dict, tc, target: dict, g: torch.Generator):
    from specforge.modeling.draft.dspark import DSparkDraftModel

    V = tc.vocab_size
    cfg = specforge_config(v, tc, "dspark", "DSparkDraftModel",
                           markov_rank=v["markov_rank"], markov_head_type=v["markov_head_type"],
                           enable_confidence_head=v["confidence"],
                           confidence_head_with_markov=v["confidence_with_markov"])
    m = DSparkDraftModel(cfg).eval()
    randomize(m, g)
    return m, torch.arange(V)


def replay(spec: dict) -> None:
    """SPEC: {"dflash": DIR (a z-lab DFlash drafter), "target": DIR, "out": DIR, "prompts":
    [[ids]], "max_new_tokens": N, "seed": S, "markov_head_type": ..., "markov_rank": r}.
    SpecForge's own DSparkDraftModel on the DFlash drafter's backbone with random Markov and
    confidence heads, saved by its save_pretrained into DIR; the target's greedy trajectories
    (transformers, eos ignored); and the greedy replay written on the package's own forward and
    head (`markov_head.sample_block_tokens`, `predict_confidence`) in the layout it trains
    (every slot drafts): per step n = min(B + 1, max_length − start) − 1 slots [anchor, mask ×
    (n − 1)] drafted after the context features of [0, start); a = leading drafts equal to the trajectory; produced =
    min(a + 1, T − 1 − start). Prints {"trajectories", "step_lengths", "blocks": [[{"accepted",
    "predicted"}]]}."""
    from specforge.modeling.draft.dspark import DSparkDraftModel

    def heads(name, p, g):
        p.copy_(0.5 * torch.randn(p.shape, generator=g))

    m = on_dflash_backbone(spec, DSparkDraftModel, "dspark", ("markov_head.", "confidence_head."),
                           heads, markov_rank=spec["markov_rank"],
                           markov_head_type=spec["markov_head_type"],
                           enable_confidence_head=True, confidence_head_with_markov=True)
    B, mask = m.block_size, m.mask_token_id

    def draft(target, feats, traj, start, max_length):
        # As SpecForge trains it, every slot drafts: a block of n = len − 1 slots after the
        # anchor drafts the n tokens after it, len = min(B + 1, max_length − start).
        n = min(B + 1, max_length - start) - 1
        block = torch.tensor([[traj[start]] + [mask] * (n - 1)])
        hidden = m(position_ids=torch.arange(start + n)[None], attention_mask=None,
                   noise_embedding=target.model.embed_tokens(block),
                   target_hidden=feats[:, :start])  # [1, n, H]
        base = target.lm_head(hidden)
        drafts, _ = m.markov_head.sample_block_tokens(
            base, first_prev_token_ids=block[:, 0], hidden_states=hidden)
        prev = torch.cat([block[:, :1], drafts[:, :-1]], dim=1)
        conf = torch.sigmoid(m.predict_confidence(hidden, prev_token_ids=prev))[0]
        return drafts[0].tolist(), {"predicted": conf.tolist()}

    print(json.dumps(reference_replay(spec, m.target_layer_ids, draft)))


def speculators_block_states(m, feats, block):
    """A speculators DFlash-based model's own layers over `block` [1, B] after the context
    features `feats` [1, C, n·H] (queries from the block, keys and values from [context ; block],
    every key visible): the final-normed states [1, B, H]."""
    C, B = feats.shape[1], block.shape[1]
    pos = torch.arange(C + B)[None]
    noise = m.embed_tokens(block)
    th = m.hidden_norm(m.fc(feats))
    pe = m.rotary_emb(noise, pos)
    h = noise
    for layer in m.layers:
        h = layer(hidden_states=h, target_hidden=th, attention_mask=None,
                  position_ids=pos, position_embeddings=pe)
    return m.norm(h)


def on_dflash_backbone(spec: dict, cls, projector: str, head_prefixes: tuple, init, **config):
    """SpecForge's model `cls` of a family on the DFlash backbone (dflash_config.projector_type
    `projector`, the family's `config` keys) holding spec["dflash"]'s weights (a z-lab DFlash
    drafter), its heads (the parameters under `head_prefixes`) set by init(name, p, g) with g
    seeded spec["seed"], saved by its save_pretrained into spec["out"]; one torch thread."""
    from transformers import AutoConfig

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(spec["seed"])
    cfg = AutoConfig.from_pretrained(spec["dflash"])
    cfg.architectures = [cls.__name__]
    cfg.dflash_config = dict(cfg.dflash_config, projector_type=projector, attention_mode="gqa",
                             **config)
    cfg._attn_implementation = "eager"
    m = cls(cfg).eval().float()
    backbone = {k: v.float() for k, v in
                load_file(str(Path(spec["dflash"]) / "model.safetensors")).items()}
    missing, unexpected = m.load_state_dict(backbone, strict=False)
    assert not unexpected and all(k.startswith(head_prefixes) for k in missing), \
        (missing, unexpected)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.startswith(head_prefixes):
                init(name, p, g)
    m.save_pretrained(spec["out"])
    return m


def reference_replay(spec: dict, layer_ids: list[int], draft) -> dict:
    """The greedy replay written on a reference package's own drafting: the target's greedy
    trajectories of spec["prompts"] (transformers, spec["max_new_tokens"] tokens, eos ignored),
    their features (the layers `layer_ids`, HF hidden_states[k + 1]), then per step
    draft(target, features [1, T, n·H], trajectory, start, max_length) → (drafts, record): a =
    leading drafts equal to the trajectory, produced = min(a + 1, T − 1 − start). Returns
    {"trajectories", "step_lengths", "blocks": [[{"accepted", **record}]]}."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(spec["target"], dtype=torch.float32).eval()
    N = spec["max_new_tokens"]
    trajectories, all_steps, all_blocks = [], [], []
    with torch.no_grad():
        for prompt in spec["prompts"]:
            traj = list(prompt)
            for _ in range(N):
                traj.append(int(target(torch.tensor([traj])).logits[0, -1].argmax()))
            T, P = len(traj), len(prompt)
            hs = target(torch.tensor([traj]), output_hidden_states=True).hidden_states
            feats = torch.cat([hs[k + 1] for k in layer_ids], dim=-1)  # [1, T, n·H]
            steps, blocks, start, max_length = [], [], P, P + N
            while start + 1 < T:
                drafts, record = draft(target, feats, traj, start, max_length)
                a = 0
                while a < len(drafts) and start + 1 + a < T and drafts[a] == traj[start + 1 + a]:
                    a += 1
                produced = min(a + 1, T - 1 - start)
                steps.append(produced)
                blocks.append({"accepted": a, **record})
                start += produced
            trajectories.append(traj)
            all_steps.append(steps)
            all_blocks.append(blocks)
    return {"trajectories": trajectories, "step_lengths": all_steps, "blocks": all_blocks}


def random_case(v: dict, context: int, V: int, H: int, g: torch.Generator) -> tuple:
    """A DFlash-based variant's forward case, drawn from `g`: features [1, C + B, n·H] and tokens
    [C + B] of a context of C = `context` rows and one block of B = v["block"] after it (n =
    len(v["aux_ids"])), the block's tokens [1, B] (the anchor and the tokens after it) and the
    block a drafter is fed [1, B] (the anchor, then the mask id V − 1). (feats, tokens,
    block_tokens, block)."""
    B, C = v["block"], context
    feats = torch.randn(1, C + B, len(v["aux_ids"]) * H, generator=g)
    tokens = torch.randint(0, V - 1, (C + B,), generator=g)
    block_tokens = tokens[C:C + B][None]
    block = torch.tensor([[int(block_tokens[0, 0])] + [V - 1] * (B - 1)])
    return feats, tokens, block_tokens, block


def forward_main(spec: dict, out: Path, tc, target: dict) -> None:
    V, H = tc.vocab_size, tc.hidden_size
    embed = target["model.embed_tokens.weight"]
    target_head = target.get("lm_head.weight", embed)
    for i, (name, v) in enumerate(spec["variants"].items()):
        g = torch.Generator().manual_seed(spec["seed"] + i)
        sf = v["format"] == "specforge"
        m, chosen = (specforge_model if sf else speculators_model)(v, tc, target, g)
        m.save_pretrained(out / name)
        B, C = v["block"], spec["context"]
        feats, tokens, block_tokens, block = random_case(v, C, V, H, g)
        with torch.no_grad():
            pos = torch.arange(C + B)[None]
            if sf:
                # OnlineDSparkModel's layout: every slot drafts (slot k the token k + 1 after
                # the anchor), its previous token the one at k (the anchor for slot 0).
                hidden = m(position_ids=pos, attention_mask=None,
                           noise_embedding=torch.nn.functional.embedding(block, embed),
                           target_hidden=feats[:, :C])  # [1, B, H]
                base = hidden @ target_head.T
                prev = block_tokens
                logits = m.apply_logits_head(base, prev_token_ids=prev, hidden_states=hidden)
                conf = m.predict_confidence(hidden, prev_token_ids=prev)
            else:
                noise = m.embed_tokens(block)
                th = m.hidden_norm(m.fc(feats[:, :C]))
                pe = m.rotary_emb(noise, pos)
                h = noise
                for layer in m.layers:
                    h = layer(hidden_states=h, target_hidden=th, attention_mask=None,
                              position_ids=pos, position_embeddings=pe)
                hb = m.norm(h)  # [1, B, H]: every slot
                logits = m.lm_head(hb)
                # DSparkDraftModel.forward's previous tokens and heads, verbatim.
                if m.config.sample_from_anchor:
                    prev = block_tokens
                else:
                    prev = torch.cat([block_tokens[:, :1], block_tokens[:, :-1]], dim=1)
                prev_emb = None
                if m.markov_head is not None:
                    prev_emb = m.markov_head.prev_embeddings(prev)
                    logits = logits + m.markov_head.block_bias(
                        prev_token_ids=prev, hidden_states=hb, prev_emb=prev_emb)
                conf = None
                if m.confidence_head is not None:
                    feats_c = hb
                    if m.config.confidence_head_with_markov and prev_emb is not None:
                        feats_c = torch.cat([hb, prev_emb.to(hb.dtype)], dim=-1)
                    conf = m.confidence_head(feats_c)
                if not m.config.sample_from_anchor:  # slot 0 (the anchor's) drafts nothing
                    logits = logits[:, 1:]
                    conf = None if conf is None else conf[:, 1:]
        tensors = {"case.0.features": feats[0].contiguous(),
                   "case.0.tokens": tokens.to(torch.int64).contiguous(),
                   "ref.logits": logits[0].float().contiguous(),
                   "ref.chosen": chosen.to(torch.int64).contiguous()}
        if conf is not None:
            tensors["ref.confidence"] = torch.sigmoid(conf[0].float()).contiguous()
        save_file(tensors, str(out / f"{name}.cases.safetensors"))
    print(json.dumps({"variants": list(spec["variants"])}))


if __name__ == "__main__":
    run_reference(replay, forward_main)
