"""The reference side of test_mtp_parity.py, run in a subprocess with speculators 0.9.0 on the path
(.venv/trainer-oracles; its pins clash with the project's).

    python mtp_reference.py SPEC.json
    python mtp_reference.py replay SPEC.json

The head's layer is always speculators' own (`MTPDraftModel`: its MTP layer built on transformers'
Qwen3 / Qwen3.5 decoder layer and norms, its rotary embedding and position handling), run through
its own forward. A checkpoint's own `mtp.*` tensors reach it through speculators' own converter
(`MTPConverter.convert_to_state_dict`), so the key mapping is the package's too.

That forward is the teacher-forced training forward: its step k > 0 attends to the other rows of
step k, not to the context, so it is not the chain a serving engine runs. The chain is written
here from the head's definition (vLLM's MTP proposer): the context rows pair the target's
final-normed hidden state h_j with the token at j + 1; the first draft is the head's output on the
last context row; each further draft is one more row at the next position, pairing the previous
row's output with the previous draft (teacher forcing: the trajectory's token). Each step runs the
package's forward (one step) over all rows so far, which for a causal layer is the same as the
serving engine's cached rows.

SPEC: {"out": DIR, "variants": {name: {...}}, "length": L, "drafts": K, "seed": S}. For each
variant: a tiny random target (Qwen3.5 hybrid, text or VLM-packaged, or Qwen3) saved by
transformers, a random head of the target's layer type, saved either as the target's own mtp.*
tensors (config mtp_num_hidden_layers: 1) or by speculators' save_pretrained into DIR/name.head;
DIR/name.cases.safetensors holds case.0.features [T, H] (the target's hidden_states[L] on random
ids), case.0.tokens [T] (row j's next token), ref.end.e [K, V] (the chain after context end e,
teacher-forced) and ref64.end.e (the same in float64), ref.step0 [T - 1, V] (the package's own
multi-step forward's first step: every row's first draft).

replay: SPEC {"target": DIR, "prompt_len", "max_new_tokens", "prompts", "block", "train_steps"}:
the target's greedy trajectories (transformers), a head trained on them with the package's own
multi-step loss, written into the target as its mtp.* tensors, and a greedy replay on the chain
above. Prints {"trajectories": [...], "step_lengths": [[...] per trajectory]}."""
from __future__ import annotations

import copy
import json
import os
import sys
import zlib
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import hybrid_fixtures as HF  # noqa: E402
from eagle3_reference import greedy_steps  # noqa: E402

# speculators' MTPConverter maps mtp.* to these; the target format is its inverse.
TO_TARGET = [("mtp_layers.0.input_proj.", "mtp.fc."),
             ("mtp_layers.0.final_layernorm.", "mtp.norm."),
             ("mtp_layers.0.hidden_layernorm.", "mtp.pre_fc_norm_hidden."),
             ("mtp_layers.0.token_layernorm.", "mtp.pre_fc_norm_embedding."),
             ("mtp_layers.0.", "mtp.layers.0.")]


def target_name(key: str) -> str:
    for src, dst in TO_TARGET:
        if key.startswith(src):
            return dst + key[len(src):]
    raise KeyError(key)


def make_target(v: dict, seed: int):
    """A random target of the variant's architecture (in memory)."""
    if v["arch"] == "qwen3_5":
        name = f"mtp-{seed}"
        HF.HYBRID_CONFIGS[name] = v.get("config", {})
        HF.HYBRID_CONFIGS[name].setdefault("num_hidden_layers", 4)
        HF.HYBRID_CONFIGS[name].setdefault("tie_word_embeddings", False)
        return HF.random_causal_lm(name, seed)
    torch.manual_seed(seed)
    c = v.get("config", {})
    cfg = transformers.Qwen3Config(
        vocab_size=c.get("vocab_size", 160), hidden_size=c.get("hidden_size", 48),
        intermediate_size=96, num_hidden_layers=c.get("num_hidden_layers", 3),
        num_attention_heads=4, num_key_value_heads=c.get("num_key_value_heads", 2), head_dim=16,
        rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": c.get("theta", 10000.0)},
        initializer_range=0.1)
    model = transformers.Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(torch.randn_like(p) * 0.2)
    return model


def head_model(tc, drafts: int, verifier: str):
    from speculators.models.mtp import MTPDraftModel, MTPSpeculatorConfig
    from speculators_configs import greedy_speculators_config

    tc = copy.deepcopy(tc)
    tc._attn_implementation = "sdpa"
    cfg = MTPSpeculatorConfig(
        transformer_layer_config=tc,
        speculators_config=greedy_speculators_config("mtp", drafts, [verifier]))
    return MTPDraftModel(cfg)


def set_steps(m, steps: int) -> None:
    m.config.speculators_config.proposal_methods[0].speculative_tokens = steps


def randomize_head(m, target, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.startswith("mtp_layers."):
                continue
            if "norm" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        attach_target_head(m, target)


def attach_target_head(m, target) -> None:
    with torch.no_grad():
        m.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        m.lm_head.weight.copy_(target.get_output_embeddings().weight)


def head_state(m) -> dict:
    return {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()
            if k.startswith("mtp_layers.")}


def write_target_head(target_dir: Path, m, vlm: bool) -> None:
    """The head as the target's own mtp.* tensors, and mtp_num_hidden_layers: 1."""
    st = target_dir / "model.safetensors"
    tensors = {k: v for k, v in load_file(st).items() if not k.startswith("mtp.")}
    for k, v in head_state(m).items():
        tensors[target_name(k)] = v
    save_file(tensors, str(st), metadata={"format": "pt"})
    cfg = json.loads((target_dir / "config.json").read_text())
    (cfg["text_config"] if vlm else cfg)["mtp_num_hidden_layers"] = 1
    (target_dir / "config.json").write_text(json.dumps(cfg, indent=1))


def head_from_target(target_dir: Path, tc, target, drafts: int, verifier: str):
    """A fresh head loaded from the target's mtp.* through speculators' own converter."""
    from speculators.convert.mtp.converter import MTPConverter

    m = head_model(tc, drafts, verifier)
    state = MTPConverter().convert_to_state_dict(str(target_dir))
    missing, unexpected = m.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert not [k for k in missing if k.startswith("mtp_layers.")], missing
    attach_target_head(m, target)
    return m.eval()


def step_rows(m, hid: torch.Tensor, tok: torch.Tensor):
    """One step of the package's forward over rows (hid[j], tok[j]) at positions 0..R-1: the
    logits [R, V] and the head's outputs [R, H] (final-normed, what lm_head reads)."""
    R, H = hid.shape
    z = torch.zeros(1, dtype=torch.long)
    ids = torch.cat([z, tok.long(), z])[None]             # step 0 embeds ids[1 : 1 + R]
    hs = torch.cat([hid, torch.zeros(2, H, dtype=hid.dtype)])[None]
    cap = []
    hook = m.lm_head.register_forward_hook(lambda mod, a, o: cap.append((a[0], o)))
    try:
        with torch.no_grad():
            m(input_ids=ids, hidden_states=hs)
    finally:
        hook.remove()
    y, logits = cap[0]
    assert logits.shape[1] == R, (logits.shape, R)
    return logits[0], y[0]


def chain(m, feats: torch.Tensor, nxt: torch.Tensor, end: int, drafts: int, given=None):
    """The serving chain after context end `end`: logits [drafts, V]; draft k ≥ 2's row pairs
    the previous row's output with given[k - 2] (None: the previous argmax)."""
    hid, tok = feats[:end], nxt[:end]
    logits, y = step_rows(m, hid, tok)
    out = [logits[-1]]
    for k in range(1, drafts):
        t = int(given[k - 1]) if given is not None else int(out[-1].argmax())
        hid = torch.cat([hid, y[-1:]])
        tok = torch.cat([tok, torch.tensor([t])])
        logits, y = step_rows(m, hid, tok)
        out.append(logits[-1])
    return torch.stack(out)


def save_target(model, path: Path, vlm: bool) -> Path:
    if vlm:
        return HF.save_vlm(model, path)
    model.save_pretrained(path, safe_serialization=True)
    return path


def forward_main(spec: dict) -> None:
    out = Path(spec["out"])
    L, K = spec["length"], spec["drafts"]
    T = L + K
    for name, v in spec["variants"].items():
        seed = zlib.crc32(name.encode()) ^ spec["seed"]
        gen = torch.Generator().manual_seed(seed)
        target = make_target(v, seed % 100000)
        tc = target.config
        verifier = type(target).__name__
        target_dir = save_target(target, out / f"{name}.target", v.get("vlm", False))
        m = head_model(tc, K, verifier)
        randomize_head(m, target, gen)
        if v["format"] == "target":
            write_target_head(target_dir, m, v.get("vlm", False))
            m = head_from_target(target_dir, tc, target, K, verifier)
        else:
            m.save_pretrained(out / f"{name}.head")
        m.eval()
        ids = torch.randint(0, tc.vocab_size, (T + 1,), generator=gen)
        with torch.no_grad():
            feats = target(ids[None, :T], output_hidden_states=True).hidden_states[-1][0]
        nxt = ids[1:T + 1]
        # The package's own multi-step forward: its first step drafts every row's next token.
        set_steps(m, K)
        cap = []
        hook = m.lm_head.register_forward_hook(lambda mod, a, o: cap.append(o))
        with torch.no_grad():
            m(input_ids=ids[None, :T], hidden_states=feats[None])
        hook.remove()
        set_steps(m, 1)
        m64 = copy.deepcopy(m).double()
        cases = {"case.0.features": feats.contiguous(), "case.0.tokens": nxt.contiguous(),
                 "ref.step0": cap[0][0].contiguous()}
        for e in range(1, L + 1):
            given = [int(ids[e + k]) for k in range(1, K)]
            cases[f"ref.end.{e}"] = chain(m, feats, nxt, e, K, given).contiguous()
            cases[f"ref64.end.{e}"] = chain(m64, feats.double(), nxt, e, K, given).contiguous()
        save_file(cases, str(out / f"{name}.cases.safetensors"))


def replay_main(spec: dict) -> None:
    torch.manual_seed(0)
    target_dir = Path(spec["target"])
    target = HF.hf_reference(target_dir, torch.float32)
    tc = target.config
    P, N, B = spec["prompt_len"], spec["max_new_tokens"], spec["block"]
    K = B - 1
    trajs = [p + HF.hf_greedy(target, p, N) for p in spec["prompts"]]
    with torch.no_grad():
        feats = [target(torch.tensor([t]), output_hidden_states=True).hidden_states[-1][0]
                 for t in trajs]
    m = head_model(tc, K, "Qwen3_5ForCausalLM")
    randomize_head(m, target, torch.Generator().manual_seed(3))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.startswith("mtp_layers.") and "norm" not in name:
                p.mul_(0.3)
    # Training with the package's own multi-step loss (teacher-forced), on the trajectories.
    set_steps(m, K)
    m.train()
    params = [p for n, p in m.named_parameters() if n.startswith("mtp_layers.")]
    opt = torch.optim.Adam(params, lr=3e-3)
    for step in range(spec["train_steps"]):
        i = step % len(trajs)
        _, loss, _ = m(input_ids=torch.tensor([trajs[i]]), hidden_states=feats[i][None])
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    write_target_head(target_dir, m, vlm=False)
    m = head_from_target(target_dir, tc, target, K, "Qwen3_5ForCausalLM")
    set_steps(m, 1)

    def draft(i: int, start: int, drafts: int) -> list[int]:
        return chain(m, feats[i], torch.tensor(trajs[i])[1:], start, drafts).argmax(-1).tolist()

    lengths = greedy_steps(trajs, [P] * len(trajs), N, B, draft)
    print(json.dumps({"trajectories": trajs, "step_lengths": lengths}))


def paths_main(spec: dict) -> None:
    """Per query [response, start, path] of a tree check: the log-softmax of the head that
    replay_main wrote into the target after that trajectory's context [0, start) and the drafts
    `path` (the package's own forward over every row, no cache), in out.Q of spec["out"]."""
    target_dir = Path(spec["target"])
    target = HF.hf_reference(target_dir, torch.float32)
    m = head_from_target(target_dir, target.config, target, spec["drafts"], "Qwen3_5ForCausalLM")
    set_steps(m, 1)
    feats: dict[int, torch.Tensor] = {}
    out = {}
    for q, (i, start, path) in enumerate(spec["queries"]):
        traj = spec["trajectories"][i]
        if i not in feats:
            with torch.no_grad():
                feats[i] = target(torch.tensor([traj]),
                                  output_hidden_states=True).hidden_states[-1][0]
        logits = chain(m, feats[i], torch.tensor(traj)[1:], start, len(path) + 1, given=path)
        out[f"out.{q}"] = torch.log_softmax(logits[-1].float(), -1).contiguous()
    save_file(out, spec["out"])


if __name__ == "__main__":
    if sys.argv[1] in ("replay", "paths"):
        {"replay": replay_main, "paths": paths_main}[sys.argv[1]](
            json.loads(Path(sys.argv[2]).read_text()))
    else:
        forward_main(json.loads(Path(sys.argv[1]).read_text()))
