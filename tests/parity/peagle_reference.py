"""The reference side of test_peagle_parity.py, run in a subprocess with the trainers' packages on
the path (speculators 0.9.0 and SpecForge 0.2.0 from .venv/trainer-oracles; their pins clash with
the project's, so they never share its interpreter).

    python peagle_reference.py SPEC.json
    python peagle_reference.py replay SPEC.json

SPEC: {"out": DIR, "variants": {name: {...}}, "length": L, "drafts": K, "seed": S}. For each
variant: a tiny random P-EAGLE drafter of that format built with the package's own classes and
saved by its own save_pretrained into DIR/name (SpecForge's config.json gets the mask_token_id
its run config would hold), random auxiliary features and next tokens, and the package's own
training forward (PEagleDraftModel.forward / OnlinePEagleModel.forward) over one layout holding
every context row at depth 0 and, for every context end e in 1..L, the chain of K − 1 future
slots after row e − 1 (the sampler of the chains replaced by that layout). DIR/name.cases
.safetensors holds case.0.features [L, A·T], case.0.tokens [L] (row j's next token) and ref.end.e
[K, Vd]: the block's logits (the anchor row's, then its future slots'), and ref64.end.e, the same
forward in float64.

replay: SPEC {"data": F.safetensors (traj.{i}, aux.{i}: the target's hidden_states at the
auxiliary indices), "target": DIR, "out": DIR, "prompt_len", "max_new_tokens", "block",
"train_steps", "aux_ids", "mask_token_id"}: a speculators P-EAGLE drafter for the target trained a
few steps on the trajectories (cross-entropy of every slot's logits against the token it
drafts), saved, and replayed greedily on the package's forward: each step drafts the block after
the context [0, start) in one forward and accepts up to the first mismatch. Prints
{"step_lengths": [[...] per trajectory]}."""
from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402


def layout(length: int, drafts: int, ends: list[int]):
    """(anchor, depth) of every context row at depth 0, then each end's chain of future slots."""
    anchor = [torch.arange(length)]
    depth = [torch.zeros(length, dtype=torch.long)]
    for e in ends:
        anchor.append(torch.full((drafts - 1,), e - 1))
        depth.append(torch.arange(1, drafts))
    return torch.cat(anchor), torch.cat(depth)


def speculators_model(v: dict, drafts: int):
    from speculators_configs import eagle_speculator_kwargs
    from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig
    from transformers import LlamaConfig, Qwen3Config

    H, V = v["hidden"], v["vocab"]
    layers = v.get("layers", 1)
    kw = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, head_dim=H // 4, rms_norm_eps=1e-6,
              max_position_embeddings=512, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": v.get("theta", 10000.0)},
              attention_bias=v.get("attention_bias", False))
    if v.get("window"):
        kw.update(sliding_window=v["window"],
                  layer_types=["sliding_attention"] + ["full_attention"] * (layers - 1))
    if v.get("arch", "llama") == "qwen3":
        tl = Qwen3Config(**kw, use_sliding_window=bool(v.get("window")))
    else:
        tl = LlamaConfig(**kw, mlp_bias=v.get("mlp_bias", False))
    tl._attn_implementation = "eager"
    cfg = PEagleSpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=v["draft_vocab"],
        eagle_aux_hidden_state_layer_ids=v["aux_ids"], mask_token_id=v["mask_token_id"],
        **eagle_speculator_kwargs(v, "peagle", drafts, "LlamaForCausalLM"))
    return PEagleDraftModel(cfg)


def specforge_model(v: dict):
    from specforge.modeling.draft.peagle import PEagleDraftModel
    from transformers import LlamaConfig

    H, V = v["hidden"], v["vocab"]
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=2 * H,
                      num_hidden_layers=v.get("layers", 1), num_attention_heads=4,
                      num_key_value_heads=2, head_dim=H // 4, rms_norm_eps=1e-6,
                      max_position_embeddings=512, pad_token_id=0, tie_word_embeddings=False,
                      rope_theta=v.get("theta", 10000.0))
    if v.get("rope_scaling"):  # SpecForge's P-EAGLE rotary ignores it: plain RoPE at theta
        cfg.rope_parameters = {"rope_type": "llama3", "rope_theta": v.get("theta", 10000.0),
                               "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64}
    cfg.draft_vocab_size = v["draft_vocab"]
    if v.get("target_hidden"):
        cfg.target_hidden_size = v["target_hidden"]
    return PEagleDraftModel(cfg, norm_before_residual=v.get("norm_before_residual", False))


def randomize(m, V: int, Vd: int, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in name or name.startswith("fc_norm"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "mask_hidden" in name
                                                                 else 0.08))
        chosen = torch.sort(torch.randperm(V, generator=gen)[:Vd]).values
        if hasattr(m, "d2t") and m.d2t is not None:
            m.d2t.copy_(chosen - torch.arange(Vd))
            t2d = torch.zeros(V, dtype=torch.bool)
            t2d[chosen] = True
            m.t2d.copy_(t2d)


def run_forward(fmt: str, m, ids, aux, anchor, depth, drafts, mask_id):
    """The package's own forward over (anchor, depth): the logits [N, Vd] of every slot."""
    captured = []
    hook = m.lm_head.register_forward_hook(lambda mod, a, o: captured.append(o.detach()))
    n = ids.shape[0]
    try:
        with torch.no_grad():
            if fmt == "speculators":
                import speculators.models.peagle.core as core
                from speculators.losses import resolve_loss_config
                core.generate_cod_sample_indices = lambda **kw: (anchor, depth)
                m(hidden_states=aux[None], input_ids=ids[None],
                  document_ids=torch.zeros(1, n, dtype=torch.long),
                  verifier_last_hidden_states=torch.zeros(1, n, m.config.transformer_layer_config
                                                          .hidden_size, dtype=aux.dtype),
                  num_depths=drafts, loss_config=resolve_loss_config("kl_div", "eager"))
            else:
                import specforge.algorithms.peagle.model as sf
                sf.generate_cod_sample_indices = lambda **kw: (anchor, depth)
                sf.compute_peagle_metrics = lambda **kw: (torch.zeros(()), {})  # triton (GPU)
                online = sf.OnlinePEagleModel(m, mask_token_id=mask_id, num_depths=drafts)
                online(input_ids=ids[None], attention_mask=torch.ones(1, n),
                       target=torch.zeros(1, n, m.config.vocab_size, dtype=aux.dtype),
                       loss_mask=torch.ones(1, n), hidden_states=aux[None],
                       lengths=torch.tensor([n]))
    finally:
        hook.remove()
    return captured[0][0]


def forward_main(spec: dict) -> None:
    out = Path(spec["out"])
    L, K = spec["length"], spec["drafts"]
    ends = list(range(1, L + 1))
    anchor, depth = layout(L, K, ends)
    for name, v in spec["variants"].items():
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ spec["seed"])
        fmt = v["format"]
        m = speculators_model(v, K) if fmt == "speculators" else specforge_model(v)
        randomize(m, v["vocab"], v["draft_vocab"], gen)
        m.eval()
        m.save_pretrained(out / name)
        if fmt == "specforge":  # its run config holds the mask token; vLLM wants it here
            cfg = json.loads((out / name / "config.json").read_text())
            cfg["mask_token_id"] = v["mask_token_id"]
            (out / name / "config.json").write_text(json.dumps(cfg, indent=1))
        A = len(v["aux_ids"]) if fmt == "speculators" else 3
        T = v.get("target_hidden", v["hidden"]) if fmt == "specforge" else v["hidden"]
        pad = L + K - 1  # the forwards index ids / states at anchor + depth
        ids = torch.randint(0, v["vocab"], (pad,), generator=gen)
        aux = torch.randn(pad, A * T, generator=gen)
        logits = run_forward(fmt, m, ids, aux, anchor, depth, K, v["mask_token_id"])
        m64 = m.double()
        logits64 = run_forward(fmt, m64, ids, aux.double(), anchor, depth, K, v["mask_token_id"])
        cases = {"case.0.features": aux[:L].contiguous(), "case.0.tokens": ids[:L].contiguous()}
        for j, e in enumerate(ends):
            rows = [e - 1] + [L + j * (K - 1) + d for d in range(K - 1)]
            cases[f"ref.end.{e}"] = logits[rows].float().contiguous()
            cases[f"ref64.end.{e}"] = logits64[rows].contiguous()
        save_file(cases, str(out / f"{name}.cases.safetensors"))


def trained_here(spec: dict, trajs: list, aux: list, target: dict, V: int, H: int, K: int):
    """A speculators P-EAGLE drafter trained here on the trajectories with the package's own
    forward (its parallel-group layout, cross-entropy on the next tokens), saved into
    spec["out"]."""
    n = len(trajs)
    v = {"hidden": H, "vocab": V, "draft_vocab": V, "aux_ids": spec["aux_ids"],
         "mask_token_id": spec["mask_token_id"], "norm_before_residual": True}
    m = speculators_model(v, K)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if torch.isnan(p).any():
                p.normal_(0, 0.02)
        m.embed_tokens.weight.copy_(target["model.embed_tokens.weight"])
        m.lm_head.weight.copy_(target["lm_head.weight"])
    import speculators.models.peagle.core as core
    from speculators.losses import resolve_loss_config
    loss_config = resolve_loss_config("kl_div", "eager")
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    m.train()
    for step in range(spec["train_steps"]):
        i = step % n
        T = len(trajs[i])
        Lc = T - 2  # slot j: (traj[j + 1], states at j), drafting traj[j + 2]
        anchors = torch.randperm(Lc, generator=gen)[: max(1, Lc // 3)]
        a = [torch.arange(Lc)] + [torch.full((K - 1,), int(x)) for x in anchors]
        d = [torch.zeros(Lc, dtype=torch.long)] + [torch.arange(1, K) for _ in anchors]
        anchor, depth = torch.cat(a), torch.cat(d)
        core.generate_cod_sample_indices = lambda **kw: (anchor, depth)
        pad = Lc + K - 1
        ids = torch.zeros(pad, dtype=torch.long)
        ids[:Lc] = torch.tensor(trajs[i][1:Lc + 1])
        feats = torch.zeros(pad, aux[i].shape[1])
        feats[:Lc] = aux[i][:Lc]
        captured = []
        hook = m.lm_head.register_forward_hook(lambda mod, a_, o: captured.append(o))
        m(hidden_states=feats[None], input_ids=ids[None],
          document_ids=torch.zeros(1, pad, dtype=torch.long),
          verifier_last_hidden_states=torch.zeros(1, pad, H), num_depths=K,
          loss_config=loss_config)
        hook.remove()
        pos = anchor + depth + 2
        labels = torch.tensor([trajs[i][p] if p < T else -100 for p in pos.tolist()])
        loss = torch.nn.functional.cross_entropy(captured[0][0], labels, ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    m.save_pretrained(spec["out"])
    return m


def replay_main(spec: dict) -> None:
    from eagle3_reference import greedy_steps, load_speculators, replay_data

    trajs, aux, tc, target = replay_data(spec)
    V, H = tc.vocab_size, tc.hidden_size
    K = spec["block"] - 1
    if spec.get("drafter"):  # a trained one: the package's model built from its config.json
        from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig

        m, _ = load_speculators(spec["drafter"], PEagleSpeculatorConfig, PEagleDraftModel)
    else:
        m = trained_here(spec, trajs, aux, target, V, H, K)

    def block(i: int, start: int, drafts: int) -> list[int]:
        pad = start + drafts - 1
        ids = torch.zeros(pad, dtype=torch.long)
        ids[:start] = torch.tensor(trajs[i][1:start + 1])
        feats = torch.zeros(pad, aux[i].shape[1])
        feats[:start] = aux[i][:start]
        anchor, depth = layout(start, drafts, [start])
        logits = run_forward("speculators", m, ids, feats, anchor, depth, drafts,
                             spec["mask_token_id"])
        rows = [start - 1] + list(range(start, start + drafts - 1))
        best = logits[rows].argmax(-1)
        if getattr(m, "d2t", None) is not None:  # draft-vocabulary ids to the target's
            best = best + m.d2t[best]
        return best.tolist()

    lengths = greedy_steps(trajs, [spec["prompt_len"]] * len(trajs), spec["max_new_tokens"],
                           spec["block"], block)
    print(json.dumps({"step_lengths": lengths}))


if __name__ == "__main__":
    if sys.argv[1] == "replay":
        replay_main(json.loads(Path(sys.argv[2]).read_text()))
    else:
        forward_main(json.loads(Path(sys.argv[1]).read_text()))
