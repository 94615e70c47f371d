"""The reference side of test_eagle3_parity.py, run in a subprocess with the trainers' packages
on the path (speculators 0.9.0 and SpecForge 0.2.0 from .venv/trainer-oracles; their pins clash
with the project's, so they never share its interpreter).

    python eagle3_reference.py SPEC.json
    python eagle3_reference.py replay SPEC.json
    python eagle3_reference.py paths SPEC.json

SPEC: {"out": DIR, "variants": {name: {...}}, "length": L, "steps": K, "seed": S}. For each
variant: a tiny random drafter of that family and format, saved by the package's own
save_pretrained into DIR/name, random auxiliary features and next tokens, and the package's own
training-time multi-step forward (its test-time-training loop, teacher-forced) over them:
DIR/name.cases.safetensors holds case.0.features [L, A·T], case.0.tokens [L] and, per step k,
ref.step.k [L, Vd] (the logits of every lane) and ref64.step.k (the same forward in float64: how
far fp32 rounding alone carries the reference over the chained steps).

replay: SPEC {"data": F.safetensors (traj.{i} [T_i] I64, aux.{i} [T_i, A·H] = the target's
hidden_states at the auxiliary indices, from transformers), "prompt_len", "max_new_tokens",
"block", "target": DIR, "out": DIR, "train_steps"}: a speculators drafter for the target (its
embedding, lm_head rows of the draft vocabulary as speculators initialises them), trained a few
steps on the trajectories, saved by save_pretrained, and replayed: at each step the chain of
drafts after the context is drafted with the package's forward (a draft is fed back as the next
lane token and the forward run again), accepted up to the first mismatch with the trajectory.
Prints {"step_lengths": [[...] per trajectory]}.

paths: SPEC {"drafter": DIR (speculators), "data": F (as for replay), "queries": [[i, start,
[tokens...]], ...], "out": F}: for each query, the drafter's log-probabilities over the draft
vocabulary after the context [0, start) of trajectory i and the drafted path `tokens` (target ids,
fed back as the chain's tokens): out.{q} [Vd]."""
from __future__ import annotations

import copy
import json
import os
import sys
import time
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
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators_configs import eagle_speculator_kwargs
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
        transformer_layer_config=tl, draft_vocab_size=Vd, eagle_aux_hidden_state_layer_ids=aux,
        **eagle_speculator_kwargs(v, "eagle3", K, "Qwen3ForCausalLM"))
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
    if v.get("sglang_export"):
        # SpecForge's serving export (export/to_sglang.py): the frozen embedding left out (the
        # runtime takes the target's), the required keys checked, legacy rope keys written.
        from safetensors.torch import load_file
        from specforge.export.checkpoint_io import apply_legacy_rope_scaling
        from specforge.export.to_sglang import _serving_state
        with torch.no_grad():
            m.embed_tokens.weight.copy_(load_file(v["target_embed"])["embed"])
        full = {k: t for k, t in m.state_dict().items() if "embed" not in k.lower()}
        m.save_pretrained(out, state_dict=_serving_state(full, {}))
        apply_legacy_rope_scaling(str(out))
    else:
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


def replay_data(spec: dict) -> tuple:
    """A replay spec's data (torch seeded 0): the trajectories and auxiliary states of
    spec["data"] (traj.{i}, aux.{i}), the target's config and its tensors."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    torch.manual_seed(0)
    data = load_file(spec["data"])
    n = len([k for k in data if k.startswith("traj.")])
    trajs = [data[f"traj.{i}"].tolist() for i in range(n)]
    aux = [data[f"aux.{i}"].float() for i in range(n)]
    tc = AutoConfig.from_pretrained(spec["target"])
    target = load_file(str(Path(spec["target"]) / "model.safetensors"))
    return trajs, aux, tc, target


def replay_main(spec: dict) -> None:
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators_configs import greedy_speculators_config
    from transformers import LlamaConfig

    trajs, aux, tc, target = replay_data(spec)
    n = len(trajs)
    V, H = tc.vocab_size, tc.hidden_size
    ids_layers = spec["aux_ids"]
    # The draft vocabulary: every token the trajectories use, then the lowest others.
    used = sorted({t for tr in trajs for t in tr})
    rest = [t for t in range(V) if t not in set(used)]
    chosen = torch.tensor(sorted(used + rest[: max(0, spec["draft_vocab"] - len(used))]))
    Vd = len(chosen)
    tl = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=H // 4,
                     max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    tl._attn_implementation = "eager"
    K = spec["block"] - 1
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=Vd, eagle_aux_hidden_state_layer_ids=ids_layers,
        norm_before_residual=spec.get("norm_before_residual", True),
        speculators_config=greedy_speculators_config("eagle3", K, tc.architectures))
    m = Eagle3DraftModel(cfg)
    with torch.no_grad():
        if Vd != V:
            m.d2t.copy_(chosen - torch.arange(Vd))
            t2d = torch.zeros(V, dtype=torch.bool)
            t2d[chosen] = True
            m.t2d.copy_(t2d)
        m.embed_tokens.weight.copy_(target["model.embed_tokens.weight"])
        m.lm_head.weight.copy_(target["lm_head.weight"][chosen])
    to_draft = torch.full((V,), -100, dtype=torch.long)
    to_draft[chosen] = torch.arange(Vd)
    # Training: every lane's step-0 logits (the TTT forward with one step) against the next
    # token but one; enough for a spread of accepted lengths.
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=3e-3)
    m.train()
    for step in range(spec["train_steps"]):
        i = step % n
        L = len(trajs[i]) - 2
        feats = aux[i][:L][None]
        ids = torch.tensor(trajs[i][1:L + 1])[None]
        labels = to_draft[torch.tensor(trajs[i][2:L + 2])]
        captured = []
        hook = m.lm_head.register_forward_hook(lambda mod, a, o: captured.append(o))
        m(hidden_states=feats, input_ids=ids, document_ids=torch.zeros(1, L, dtype=torch.long),
          ttt_steps=1)
        hook.remove()
        loss = torch.nn.functional.cross_entropy(captured[0][0], labels, ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    out = Path(spec["out"])
    m.save_pretrained(out)

    chosen_ids = chosen.tolist() if Vd != V else None
    lengths, _ = chain_replay(m, trajs, aux, chosen_ids, [spec["prompt_len"]] * n,
                              spec["max_new_tokens"], spec["block"])
    print(json.dumps({"step_lengths": lengths, "draft_vocab": Vd}))


def chain_replay(m, trajs, aux, chosen, prompt_lens, max_new_tokens, block):
    """The greedy chain replay on the package's forward: at each step the drafts after the
    context [0, start) come one at a time (each draft is fed back as the lane's next token and
    the forward runs again: the package has no cached drafting loop), accepted up to the first
    mismatch. Returns (step lengths per trajectory, seconds spent in the drafter)."""
    drafting = 0.0

    def chain(i: int, start: int, drafts: int) -> list[int]:
        nonlocal drafting
        t = start - 1
        L = start + drafts  # lanes past t only hold the drafts fed back
        feats = torch.zeros(1, L, aux[i].shape[1])
        feats[0, :start] = aux[i][:start]
        ids = torch.zeros(1, L, dtype=torch.long)
        ids[0, :start] = torch.tensor(trajs[i][1:start + 1])
        out_tokens = []
        for k in range(drafts):
            captured = []
            hook = m.lm_head.register_forward_hook(lambda mod, a, o: captured.append(o))
            t0 = time.perf_counter()
            with torch.no_grad():
                m(hidden_states=feats, input_ids=ids,
                  document_ids=torch.zeros(1, L, dtype=torch.long), ttt_steps=k + 1)
            d = int(captured[k][0, t].argmax())
            drafting += time.perf_counter() - t0
            hook.remove()
            y = chosen[d] if chosen is not None else d
            out_tokens.append(y)
            if t + k + 1 < L:
                ids[0, t + k + 1] = y
        return out_tokens

    return greedy_steps(trajs, prompt_lens, max_new_tokens, block, chain), drafting


def greedy_steps(trajs, prompt_lens, max_new_tokens, block, draft) -> list[list[int]]:
    """The greedy replay's step lengths per trajectory: from each prompt on, draft(i, start,
    drafts) proposes the `drafts` tokens after the context [0, start) of trajectory i (block − 1,
    fewer near max_length = prompt + max_new_tokens); a step accepts them up to the first
    mismatch with the trajectory and produces one token more (the verifier's), at most the
    trajectory's end."""
    lengths = []
    for i, traj in enumerate(trajs):
        P = prompt_lens[i]
        max_length = P + max_new_tokens
        T, start, steps = len(traj), P, []
        while start + 1 < T:
            drafts = min(block, max_length - start) - 1
            got = draft(i, start, drafts) if drafts > 0 else []
            a = 0
            while a < len(got) and start + a + 1 < T and got[a] == traj[start + a + 1]:
                a += 1
            produced = min(a + 1, T - 1 - start)
            steps.append(produced)
            start += produced
        lengths.append(steps)
    return lengths


def load_speculators(drafter: str, config_cls=None, model_cls=None):
    """A speculators draft model (Eagle3DraftModel unless config_cls / model_cls name another
    family's) built from a checkpoint's config.json with eager attention, its weights loaded from
    its file, in fp32 and eval mode: (model, the file's tensors). Not from_pretrained: that needs
    the verifier's own files, and under transformers 5 it leaves non-persistent buffers (XPress's
    causal_tril, RoPE's inv_freq) uninitialised. Only the verifier's weights (embedding, head)
    and the vocabulary maps may be missing."""
    from safetensors.torch import load_file

    if config_cls is None:
        from speculators.models.eagle3 import Eagle3SpeculatorConfig as config_cls
        from speculators.models.eagle3.core import Eagle3DraftModel as model_cls
    cfg = config_cls.from_pretrained(drafter)
    cfg.transformer_layer_config._attn_implementation = "eager"
    m = model_cls(cfg).eval()
    weights = {k: (v.float() if v.is_floating_point() else v)
               for k, v in load_file(str(Path(drafter) / "model.safetensors")).items()}
    missing, unexpected = m.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.startswith(("embed_tokens.", "lm_head.", "verifier_", "d2t",
                                                "t2d")) for k in missing), (missing, unexpected)
    return m.float(), weights


def time_main(spec: dict) -> None:
    """time: SPEC {"drafter", "data" (traj.{i}, aux.{i}, prompt_len.{i}), "max_new_tokens",
    "block"}: the chain replay of an existing speculators drafter, with its drafting time."""
    from safetensors.torch import load_file

    m, weights = load_speculators(spec["drafter"])
    data = load_file(spec["data"])
    n = len([k for k in data if k.startswith("traj.")])
    trajs = [data[f"traj.{i}"].tolist() for i in range(n)]
    aux = [data[f"aux.{i}"].float() for i in range(n)]
    lens = [int(data[f"prompt_len.{i}"]) for i in range(n)]
    chosen = None
    if "d2t" in weights:
        chosen = (torch.arange(len(weights["d2t"])) + weights["d2t"]).tolist()
    lengths, seconds = chain_replay(m, trajs, aux, chosen, lens, spec["max_new_tokens"],
                                    spec["block"])
    print(json.dumps({"step_lengths": lengths, "drafting_seconds": seconds,
                      "threads": torch.get_num_threads()}))


def paths_main(spec: dict) -> None:
    from safetensors.torch import load_file

    m, _ = load_speculators(spec["drafter"])
    data = load_file(spec["data"])
    out = {}
    for q, (i, start, path) in enumerate(spec["queries"]):
        aux, traj = data[f"aux.{i}"].float(), data[f"traj.{i}"].tolist()
        t, L = start - 1, start + len(path) + 1
        feats = torch.zeros(1, L, aux.shape[1])
        feats[0, :start] = aux[:start]
        ids = torch.zeros(1, L, dtype=torch.long)
        ids[0, :start] = torch.tensor(traj[1:start + 1])
        for k, tok in enumerate(path):
            ids[0, t + k + 1] = tok
        captured = []
        hook = m.lm_head.register_forward_hook(lambda mod, a, o: captured.append(o))
        with torch.no_grad():
            m(hidden_states=feats, input_ids=ids,
              document_ids=torch.zeros(1, L, dtype=torch.long), ttt_steps=len(path) + 1)
        hook.remove()
        out[f"out.{q}"] = torch.log_softmax(captured[len(path)][0, t].float(), -1).contiguous()
    save_file(out, spec["out"])


def main() -> None:
    if sys.argv[1] == "time":
        torch.set_num_threads(int(os.environ.get("SPECWIRE_BENCH_THREADS", "1")))
        time_main(json.loads(Path(sys.argv[2]).read_text()))
        return
    if sys.argv[1] == "paths":
        torch.set_num_threads(1)
        paths_main(json.loads(Path(sys.argv[2]).read_text()))
        return
    if sys.argv[1] == "replay":
        torch.set_num_threads(1)
        replay_main(json.loads(Path(sys.argv[2]).read_text()))
        return
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
