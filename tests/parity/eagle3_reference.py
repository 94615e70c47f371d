"""The reference side of test_eagle3_parity.py, run in a subprocess with the trainers' packages
on the path (speculators 0.9.0 and SpecForge 0.2.0 from .venv/trainer-oracles; their pins clash
with the project's, so they never share its interpreter).

    python eagle3_reference.py SPEC.json

SPEC: {"out": DIR, "variants": {name: {...}}, "length": L, "steps": K, "seed": S}. For each
variant: a tiny random drafter of that family and format, saved by the package's own
save_pretrained into DIR/name, random auxiliary features and next tokens, and the package's own
training-time multi-step forward (its test-time-training loop, teacher-forced) over them:
DIR/name.cases.safetensors holds case.0.features [L, A·T], case.0.tokens [L] and, per step k,
ref.step.k [L, Vd] (the logits of every lane) and ref64.step.k (the same forward in float64: how
far fp32 rounding alone carries the reference over the chained steps)."""
from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402


def perturb(model, seed: int) -> None:
    """Random weights everywhere, norms around 1 (a fresh model's norms are all ones)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.dtype.is_floating_point:
                continue
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") or ".fc_norm." in name
                    or name.startswith("fc_norm") else 0.2 * noise)


def vocab_maps(V: int, Vd: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(V, generator=g)[:Vd].sort().values
    d2t = chosen - torch.arange(Vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def speculators_variant(v: dict, out: Path, L: int, K: int, seed: int) -> dict:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    H, V, Vd, layers = v["hidden"], v["vocab"], v["draft_vocab"], v.get("layers", 1)
    cls = LlamaConfig if v["arch"] == "llama" else Qwen3Config
    extra = {}
    if v["arch"] == "llama":
        extra = {"attention_bias": v.get("attention_bias", False),
                 "mlp_bias": v.get("mlp_bias", False)}
    if v.get("window"):
        extra.update(sliding_window=v["window"], use_sliding_window=True,
                     layer_types=["sliding_attention"] * layers, max_window_layers=0)
    tl = cls(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=layers,
             num_attention_heads=4, num_key_value_heads=2, head_dim=H // 4,
             max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": v.get("theta", 10000.0)},
             **extra)
    tl._attn_implementation = "eager"
    aux = v["aux_ids"]
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=Vd,
        eagle_aux_hidden_state_layer_ids=aux,
        norm_before_fc=v.get("norm_before_fc", False), fc_norm=v.get("fc_norm", False),
        norm_before_residual=v.get("norm_before_residual", False),
        norm_output=v.get("norm_output", False),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=K)],
            verifier=VerifierConfig(name_or_path=None, architectures=["Qwen3ForCausalLM"])))
    m = Eagle3DraftModel(cfg).eval()
    perturb(m, seed)
    if Vd != V:
        d2t, t2d = vocab_maps(V, Vd, seed + 1)
        m.d2t.copy_(d2t)
        m.t2d.copy_(t2d)
    m.save_pretrained(out)
    A = len(aux)
    g = torch.Generator().manual_seed(seed + 2)
    feats = torch.randn(1, L, A * H, generator=g)
    ids = torch.randint(0, V, (1, L), generator=g)
    def ttt(model, x):
        captured = []
        hook = model.lm_head.register_forward_hook(
            lambda mod, i, o: captured.append(o.detach()[0]))
        with torch.no_grad():
            model(hidden_states=x, input_ids=ids,
                  document_ids=torch.zeros(1, L, dtype=torch.long), ttt_steps=K)
        hook.remove()
        return captured[:K]

    return {"features": feats[0], "tokens": ids[0], "steps": ttt(m, feats),
            "steps64": ttt(copy.deepcopy(m).double(), feats.double())}


def specforge_variant(v: dict, out: Path, L: int, K: int, seed: int) -> dict:
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.utils import padding
    from transformers import LlamaConfig

    H, V, Vd, T = v["hidden"], v["vocab"], v["draft_vocab"], v.get("target_hidden", v["hidden"])
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=H // 4,
                      max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=0,
                      tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default",
                                       "rope_theta": v.get("theta", 10000.0)})
    cfg.draft_vocab_size = Vd
    cfg.target_hidden_size = T
    cfg.fc_norm = v.get("fc_norm", False)
    cfg.norm_output = v.get("norm_output", True)
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": v["aux_ids"]}
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    m = LlamaForCausalLMEagle3(cfg, attention_backend="sdpa").eval()
    perturb(m, seed)
    d2t, t2d = vocab_maps(V, Vd, seed + 1) if Vd != V else (torch.zeros(Vd, dtype=torch.long),
                                                         torch.ones(V, dtype=torch.bool))
    m.d2t.copy_(d2t)
    m.t2d.copy_(t2d)
    m.save_pretrained(out)
    g = torch.Generator().manual_seed(seed + 2)
    feats = torch.randn(1, L, 3 * T, generator=g)
    ids = torch.randint(0, V, (1, L), generator=g)
    def ttt(model, x):
        steps = []
        with torch.no_grad():
            hs = model.project_hidden_states(x)
            pos = torch.arange(L)[None]
            # (SpecForge builds the mask in float32 whatever the dtype: made there, then cast.)
            mask = model.prepare_decoder_attention_mask(torch.ones(1, L, dtype=torch.bool),
                                                        hs.float(), 1, L, 0).to(hs.dtype)
            cache, cur = [[], []], ids
            for _ in range(K):
                emb = model.embed_input_ids(cur).to(hs.dtype)
                hs = model.backbone(input_embeds=emb, hidden_states=hs, cache_hidden=cache,
                                    attention_mask=mask, position_ids=pos)
                steps.append(model.compute_logits(hs)[0])
                cur = padding(cur, left=False)
        return steps

    return {"features": feats[0], "tokens": ids[0], "steps": ttt(m, feats),
            "steps64": ttt(copy.deepcopy(m).double(), feats.double())}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    torch.set_num_threads(1)
    for i, (name, v) in enumerate(spec["variants"].items()):
        make = speculators_variant if v["format"] == "speculators" else specforge_variant
        r = make(v, out / name, spec["length"], spec["steps"], spec["seed"] + 100 * i)
        tensors = {"case.0.features": r["features"].contiguous(),
                   "case.0.tokens": r["tokens"].to(torch.int64).contiguous()}
        for k, s in enumerate(r["steps"]):
            tensors[f"ref.step.{k}"] = s.float().contiguous()
        for k, s in enumerate(r["steps64"]):
            tensors[f"ref64.step.{k}"] = s.double().contiguous()
        save_file(tensors, str(out / f"{name}.cases.safetensors"))
    print(json.dumps({"variants": list(spec["variants"])}))


if __name__ == "__main__":
    main()
