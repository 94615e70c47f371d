"""Trains an EAGLE-3 drafter against a target served by specwire-extractor, and saves it in
vllm-project/speculators' format (the format vLLM serves and specwire-score reads).

The pipeline is train_drafter.py's: prompts from the corpus, the target's own greedy completions
(Generate), the features streamed by FeatureDataset; the target's embedding comes through
get_tensors (frozen, saved with the drafter as speculators does) and its lm_head rows of the draft
vocabulary initialise the drafter's head.

The model is EAGLE-3's (speculators' Eagle3DraftModel with one Llama layer): fc over the
auxiliary states of three target layers, one decoder layer over [input_layernorm(embedding) ;
hidden_norm(hidden)], the draft vocabulary (the --draft-vocab most frequent completion tokens)
with its d2t / t2d maps. The objective is speculators' training-time test (TTT): step 0 pairs the
target's states at t with the token at t + 1 and predicts t + 2; step k feeds the drafter's own
output of step k − 1 with the true token at t + 1 + k (each lane attends to the context lanes
before it and its own earlier steps), loss weights 0.8^k.

Auxiliary layers are given in speculators' convention (HF hidden-state indices; vLLM's): index i
is the output of decoder layer i − 1 before the final norm, which the extractor serves as
layer.{i−1} (the raw output, also for the last layer).

    .venv/bin/python training/train_eagle3.py --target models/tiny-qwen3 \\
        --out models/tiny-qwen3-eagle3
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_drafter import (add_loop_args, add_target_args, extractor,  # noqa: E402
                           fit_one_sequence_at_a_time, rotary, self_generated_features,
                           served_target, speculators_config, training_log)

DECAY = 0.8


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def projection_tensors(p: str, layer: torch.nn.Module) -> dict:
    """A decoder layer's attention and MLP projections (its q, k, v, o, gate, up and down
    Linears) under their Hugging Face names after the prefix `p`, as speculators saves them."""
    return {p + "self_attn.q_proj.weight": layer.q.weight,
            p + "self_attn.k_proj.weight": layer.k.weight,
            p + "self_attn.v_proj.weight": layer.v.weight,
            p + "self_attn.o_proj.weight": layer.o.weight,
            p + "mlp.gate_proj.weight": layer.gate.weight,
            p + "mlp.up_proj.weight": layer.up.weight,
            p + "mlp.down_proj.weight": layer.down.weight}


class Eagle3(torch.nn.Module):
    """speculators' Eagle3DraftModel (one Llama layer, no extra norms), state-dict compatible."""

    def __init__(self, V: int, Vd: int, H: int, A: int, heads: int, kv: int, hd: int,
                 inter: int, theta: float, eps: float) -> None:
        super().__init__()
        self.H, self.heads, self.kv, self.hd, self.theta, self.eps = H, heads, kv, hd, theta, eps
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.fc = lin(A * H, H)
        self.embed_tokens = torch.nn.Embedding(V, H)
        self.embed_tokens.weight.requires_grad_(False)
        self.input_layernorm = torch.nn.Parameter(torch.ones(H))
        self.hidden_norm = torch.nn.Parameter(torch.ones(H))
        self.post_attention_layernorm = torch.nn.Parameter(torch.ones(H))
        self.q, self.k, self.v = lin(2 * H, heads * hd), lin(2 * H, kv * hd), lin(2 * H, kv * hd)
        self.o = lin(heads * hd, H)
        self.gate, self.up, self.down = lin(H, inter), lin(H, inter), lin(inter, H)
        self.norm = torch.nn.Parameter(torch.ones(H))
        self.lm_head = lin(H, Vd)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return rotary(x, pos, self.theta)

    def step(self, emb, hid, pos, cache):
        """One TTT step over all lanes: cache holds (K, V) of earlier steps; step 0's keys are
        attended causally, later steps' only on the diagonal."""
        T = emb.shape[0]
        x = torch.cat([rms(emb, self.input_layernorm, self.eps), rms(hid, self.hidden_norm, self.eps)], -1)
        q = self.rope(self.q(x).view(T, self.heads, self.hd), pos)
        k = self.rope(self.k(x).view(T, self.kv, self.hd), pos)
        v = self.v(x).view(T, self.kv, self.hd)
        rep = self.heads // self.kv
        cache.append((k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
        k0, v0 = cache[0]
        scores = [torch.einsum("thd,shd->hts", q, k0) / math.sqrt(self.hd)]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores[0] = scores[0].masked_fill(~causal, float("-inf"))
        for ki, _ in cache[1:]:
            scores.append((q * ki).sum(-1).transpose(0, 1)[..., None] / math.sqrt(self.hd))
        p = torch.cat(scores, -1).softmax(-1)
        out = torch.einsum("hts,shd->thd", p[..., :T], v0)
        for i, (_, vi) in enumerate(cache[1:]):
            out = out + p[..., T + i].transpose(0, 1)[..., None] * vi
        h = hid + self.o(out.reshape(T, self.heads * self.hd))
        y = rms(h, self.post_attention_layernorm, self.eps)
        return h + self.down(F.silu(self.gate(y)) * self.up(y))

    def logits(self, h):
        return self.lm_head(rms(h, self.norm, self.eps))

    def state_dict_speculators(self, d2t, t2d) -> dict:
        p = "layers.0."
        return {"fc.weight": self.fc.weight, "embed_tokens.weight": self.embed_tokens.weight,
                p + "input_layernorm.weight": self.input_layernorm,
                p + "hidden_norm.weight": self.hidden_norm,
                p + "post_attention_layernorm.weight": self.post_attention_layernorm,
                **projection_tensors(p, self),
                "norm.weight": self.norm, "lm_head.weight": self.lm_head.weight,
                "d2t": d2t, "t2d": t2d}


def ttt_loss(model: Eagle3, seq: dict, to_draft: torch.Tensor, steps: int,
             parallel: tuple | None = None) -> torch.Tensor:
    """speculators' TTT on one sequence: lanes t pair states g_t with token x_{t+1}; step k's
    lane t predicts x_{t+2+k}; loss over completion positions whose token is in the draft
    vocabulary. parallel = (mask token id, mask_hidden [A·H]): P-EAGLE's parallel drafting
    instead, where step k ≥ 1 feeds every lane the mask token's embedding and fc(mask_hidden)
    rather than the true token and the step before's output (the attention is the same: the
    context lanes up to t, then the lane's own earlier steps)."""
    ids, P, feats = seq["input_ids"], seq["prompt_len"], seq["features"]
    T = len(ids) - 2
    x = torch.as_tensor(ids)
    hid = model.fc(feats[:T])
    if parallel is not None:
        mask_emb = model.embed_tokens(torch.tensor([parallel[0]]))
        mask_hid = model.fc(parallel[1][None])
    cache: list = []  # (K, V) of every earlier step, lanes cut to the current step's
    loss, weight = 0.0, 0.0
    for k in range(steps):
        n = T - k  # lanes whose token x_{t+1+k} and label x_{t+2+k} exist
        if n <= 0:
            break
        cache = [(a[:n], b[:n]) for a, b in cache]
        tok = x[1 + k:T + 1]
        pos = torch.arange(n) + 1 + k
        if parallel is not None and k > 0:
            h = model.step(mask_emb.expand(n, -1), mask_hid.expand(n, -1), pos, cache)
        else:
            h = model.step(model.embed_tokens(tok), hid[:n], pos, cache)  # appends its K/V
        labels = to_draft[x[2 + k:T + 2]]
        keep = torch.arange(n) + 2 + k >= P  # the label is a completion token
        labels = torch.where(keep, labels, torch.full_like(labels, -100))
        if (labels >= 0).any():
            loss = loss + DECAY ** k * F.cross_entropy(model.logits(h), labels, ignore_index=-100)
            weight += DECAY ** k
        hid = h  # the drafter's own output feeds the next step
    return loss / max(weight, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_target_args(ap)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--aux-ids", default="1,2,4",
                    help="auxiliary layers, speculators' HF hidden-state indices")
    ap.add_argument("--draft-vocab", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--speculative-tokens", type=int, default=5)
    add_loop_args(ap, steps=1500)
    args = ap.parse_args()
    aux_ids = [int(v) for v in args.aux_ids.split(",")]
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()
    with extractor(args) as address:
        contract, tensors = served_target(address)
        bad = [i for i in aux_ids if not 1 <= i <= contract.num_layers]
        if bad:
            sys.exit(f"--aux-ids {bad}: indices run from 1 to {contract.num_layers}")
        layers = [i - 1 for i in aux_ids]  # the extractor's numbering: raw layer outputs
        names = [f"layer.{k}" for k in layers]
        train = self_generated_features(address, args, sorted(set(layers)), False, names,
                                        contract)
    V, H = contract.vocab_size, contract.hidden_size
    counts = Counter(int(t) for s in train for t in s["input_ids"][s["prompt_len"]:])
    chosen = sorted(t for t, _ in counts.most_common(args.draft_vocab))
    chosen += [t for t in range(V) if t not in set(chosen)][: args.draft_vocab - len(chosen)]
    chosen = torch.tensor(sorted(chosen))
    Vd = len(chosen)
    d2t = chosen - torch.arange(Vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[chosen] = True
    to_draft = torch.full((V,), -100, dtype=torch.long)
    to_draft[chosen] = torch.arange(Vd)

    model = Eagle3(V, Vd, H, len(aux_ids), args.heads, args.kv_heads, args.head_dim,
                   args.intermediate, theta=10000.0, eps=1e-6)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(tensors["model.embed_tokens.weight"].float())
        model.lm_head.weight.copy_(tensors["lm_head.weight"].float()[chosen])
        for lin in (model.fc, model.q, model.k, model.v, model.o, model.gate, model.up,
                    model.down):
            torch.nn.init.normal_(lin.weight, std=0.02)
    params = [p for p in model.parameters() if p.requires_grad]
    curve = fit_one_sequence_at_a_time(
        params, train, lambda seq: ttt_loss(model, seq, to_draft, args.ttt_steps), args)

    args.out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()
          for k, v in model.state_dict_speculators(d2t, t2d).items()}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(args.out / "model.safetensors"))
    os.chmod(args.out / "model.safetensors", 0o644)  # read by the containers' non-root user
    layer_config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                    "vocab_size": V, "hidden_size": H, "intermediate_size": args.intermediate,
                    "num_hidden_layers": 1, "num_attention_heads": args.heads,
                    "num_key_value_heads": args.kv_heads, "head_dim": args.head_dim,
                    "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False,
                    "mlp_bias": False, "max_position_embeddings": 4096,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                    "tie_word_embeddings": False}
    config = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
              "speculators_version": "0.9.0", "draft_vocab_size": Vd,
              "eagle_aux_hidden_state_layer_ids": aux_ids, "norm_before_fc": False,
              "fc_norm": False, "norm_before_residual": False, "norm_output": False,
              "embed_requires_grad": False, "target_hidden_size": None,
              "tie_word_embeddings": False, "transformer_layer_config": layer_config,
              "speculators_config": speculators_config("eagle3", args.speculative_tokens,
                                                       contract.architecture)}
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    log = training_log(args, params, contract, curve, train, t_start, feature_states=names,
                       draft_vocab_size=Vd)
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(f"saved {args.out} ({Vd} draft tokens, final loss {curve[-1]['loss']})", flush=True)


if __name__ == "__main__":
    main()
