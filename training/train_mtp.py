"""Trains a multi-token-prediction (MTP) head for a target served by specwire-extractor, and saves
it in vllm-project/speculators' MTP format (`speculators_model_type: "mtp"`, `mtp_layers.0.*`),
which specwire-score reads as the mtp drafter family.

The pipeline is train_drafter.py's: prompts from the corpus, the target's own greedy completions
(Generate), the features streamed by FeatureDataset: the target's final-normed last hidden state
(HF hidden_states[L], what the serving engines feed an MTP head). The head is one decoder layer
of the target's own architecture (its config.json is the head's transformer_layer_config) after
an input projection: x = input_proj([token_layernorm(e) ; hidden_layernorm(h)]), y =
final_layernorm(layer(x)), logits = the target's lm_head(y), with the target's embedding and
lm_head frozen and not saved (speculators loads them from the verifier).

The objective is speculators' own MTP training (MTPDraftModel.forward, teacher-forced): step 0
pairs the target's state at t with the token at t + 1 and predicts t + 2; step k feeds the head's
own output of step k − 1 with the true token at t + 1 + k (causal attention within each step's
rows), loss weights beta^k normalised (FastMTP's, beta 0.6), over completion labels.

    .venv/bin/python training/train_mtp.py --target models/tiny-qwen3 --out models/tiny-qwen3-mtp
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_drafter import (add_loop_args, extractor, fit_one_sequence_at_a_time,  # noqa: E402
                           rotary, self_generated_features, served_target, speculators_config,
                           training_log)
from train_eagle3 import projection_tensors, rms  # noqa: E402


class MtpHead(torch.nn.Module):
    """speculators' MTP head on a Qwen3 decoder layer (per-head q/k norms, plain RMSNorms),
    state-dict compatible with MTPDraftModel's mtp_layers.0."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        H, self.heads, self.kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or H // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 1e4))
        inter = cfg["intermediate_size"]
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        ones = lambda n: torch.nn.Parameter(torch.ones(n))  # noqa: E731
        self.input_proj = lin(2 * H, H)
        self.token_layernorm, self.hidden_layernorm = ones(H), ones(H)
        self.input_layernorm, self.post_attention_layernorm = ones(H), ones(H)
        self.final_layernorm = ones(H)
        self.q_norm, self.k_norm = ones(self.hd), ones(self.hd)
        self.q, self.k = lin(H, self.heads * self.hd), lin(H, self.kv * self.hd)
        self.v, self.o = lin(H, self.kv * self.hd), lin(self.heads * self.hd, H)
        self.gate, self.up, self.down = lin(H, inter), lin(H, inter), lin(inter, H)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return rotary(x, pos, self.theta)

    def forward(self, emb: torch.Tensor, hid: torch.Tensor) -> torch.Tensor:
        """Rows (embedding e_t, hidden h_t) at positions 0..T−1, causal: y [T, H]."""
        T = emb.shape[0]
        x = self.input_proj(torch.cat([rms(emb, self.token_layernorm, self.eps),
                                       rms(hid, self.hidden_layernorm, self.eps)], -1))
        n = rms(x, self.input_layernorm, self.eps)
        pos = torch.arange(T)
        q = self.rope(rms(self.q(n).view(T, self.heads, self.hd), self.q_norm, self.eps), pos)
        k = self.rope(rms(self.k(n).view(T, self.kv, self.hd), self.k_norm, self.eps), pos)
        v = self.v(n).view(T, self.kv, self.hd)
        rep = self.heads // self.kv
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(rep, 1).transpose(0, 1),
            v.repeat_interleave(rep, 1).transpose(0, 1), is_causal=True)
        h = x + self.o(attn.transpose(0, 1).reshape(T, self.heads * self.hd))
        m = rms(h, self.post_attention_layernorm, self.eps)
        h = h + self.down(F.silu(self.gate(m)) * self.up(m))
        return rms(h, self.final_layernorm, self.eps)

    def state_dict_speculators(self) -> dict:
        p = "mtp_layers.0."
        return {p + "input_proj.weight": self.input_proj.weight,
                p + "token_layernorm.weight": self.token_layernorm,
                p + "hidden_layernorm.weight": self.hidden_layernorm,
                p + "final_layernorm.weight": self.final_layernorm,
                p + "input_layernorm.weight": self.input_layernorm,
                p + "post_attention_layernorm.weight": self.post_attention_layernorm,
                p + "self_attn.q_norm.weight": self.q_norm,
                p + "self_attn.k_norm.weight": self.k_norm,
                **projection_tensors(p, self)}


def step_weights(beta: float, steps: int) -> list[float]:
    raw = [beta ** k for k in range(steps)]
    return [w / sum(raw) for w in raw]


def mtp_loss(model: MtpHead, seq: dict, embed: torch.Tensor, head: torch.Tensor,
             weights: list[float]) -> torch.Tensor:
    """speculators' MTP forward loss on one sequence (rows t < valid_len at every step)."""
    ids, P, feats = seq["input_ids"], seq["prompt_len"], seq["features"]
    x = torch.as_tensor(ids)
    K = min(len(weights), max(0, len(ids) - 2))
    n = len(ids) - K - 1
    hid = feats[:n]
    loss = torch.zeros(())
    for k in range(K):
        y = model(embed[x[k + 1:k + 1 + n]], hid)
        labels = x[k + 2:k + 2 + n].clone()
        labels[torch.arange(n) + k + 2 < P] = -100  # prompt labels are not trained
        if (labels >= 0).any():
            loss = loss + weights[k] * F.cross_entropy(y @ head.T, labels, ignore_index=-100)
        hid = y  # the head's own output feeds the next step
    return loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True,
                    help="target checkpoint (its config.json is the head's layer config); an "
                         "extractor is started on it")
    ap.add_argument("--extractor-bin", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--speculative-tokens", type=int, default=3)
    ap.add_argument("--beta", type=float, default=0.6, help="step weights beta^k, normalised")
    add_loop_args(ap, steps=1200)
    args = ap.parse_args()
    args.extractor = None  # train_drafter.extractor(): start one on --target
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target_config = json.loads((args.target / "config.json").read_text())
    if target_config.get("model_type") != "qwen3":
        sys.exit(f"--target: model_type {target_config.get('model_type')!r}; this script "
                 "trains a head of Qwen3 layers (a Qwen3.5 target ships its own mtp.* head)")
    t_start = time.time()
    with extractor(args) as address:
        contract, tensors = served_target(address)
        train = self_generated_features(address, args, [], True, ["final_norm"], contract)
    embed = tensors["model.embed_tokens.weight"].float()
    head = tensors["lm_head.weight"].float()
    model = MtpHead(target_config)
    with torch.no_grad():
        for lin in (model.input_proj, model.q, model.k, model.v, model.o, model.gate, model.up,
                    model.down):
            torch.nn.init.normal_(lin.weight, std=0.02)
    params = list(model.parameters())
    weights = step_weights(args.beta, args.speculative_tokens)
    curve = fit_one_sequence_at_a_time(
        params, train, lambda seq: mtp_loss(model, seq, embed, head, weights), args)

    args.out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous()
          for k, v in model.state_dict_speculators().items()}
    save_file(sd, str(args.out / "model.safetensors"))
    os.chmod(args.out / "model.safetensors", 0o644)  # read by the containers' non-root user
    layer_config = {k: v for k, v in target_config.items()
                    if k not in ("architectures", "transformers_version", "dtype")}
    config = {"architectures": ["MTPDraftModel"], "speculators_model_type": "mtp",
              "speculators_version": "0.9.0", "num_nextn_predict_layers": 1,
              "transformer_layer_config": layer_config,
              "speculators_config": speculators_config("mtp", args.speculative_tokens,
                                                       contract.architecture)}
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    log = training_log(args, params, contract, curve, train, t_start,
                       feature_states=["final_norm"], step_weights=weights)
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(f"saved {args.out} (final loss {curve[-1]['loss']})", flush=True)


if __name__ == "__main__":
    main()
