"""Trains a P-EAGLE drafter against a target served by specwire-extractor, starting from an
EAGLE-3 drafter of the same target (speculators' format), and saves it in speculators' P-EAGLE
format (speculators_model_type "peagle").

P-EAGLE (parallel drafting) is EAGLE-3's model drafting all k tokens in one forward: the block
is the last context lane (the target's states at t with the token at t + 1: draft 1) and k − 1
future slots, each the mask token's embedding with fc(mask_hidden) (a learnt auxiliary state) at
the next positions, attending to the context and to the block's earlier slots. The pipeline is
train_eagle3.py's (the same data, auxiliary states and draft vocabulary, which the EAGLE-3 drafter
fixes); the objective is its training-time test with P-EAGLE's inputs at every step past the
first (train_eagle3.ttt_loss(parallel=...)): step k's lane t predicts x_{t+2+k}, weights 0.8^k,
k < speculative tokens. Everything trains, mask_hidden from the mean auxiliary state of the data.

    .venv/bin/python training/train_peagle.py --target models/tiny-qwen3 \\
        --init models/tiny-qwen3-eagle3 --out models/tiny-qwen3-peagle
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
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_drafter import (add_loop_args, add_target_args, extractor,  # noqa: E402
                           fit_one_sequence_at_a_time, self_generated_features,
                           speculators_config, training_log)
from train_eagle3 import Eagle3, ttt_loss  # noqa: E402

from specwire_client import ExtractorClient  # noqa: E402


def load_eagle3(init: Path) -> tuple[Eagle3, dict, torch.Tensor, torch.Tensor]:
    """The EAGLE-3 drafter at `init` (speculators' format, as train_eagle3.py saves it) as an
    Eagle3 module, with its config and its d2t / t2d."""
    cfg = json.loads((init / "config.json").read_text())
    tl = cfg["transformer_layer_config"]
    sd = {k: v.float() if v.is_floating_point() else v
          for k, v in load_file(str(init / "model.safetensors")).items()}
    model = Eagle3(tl["vocab_size"], cfg["draft_vocab_size"], tl["hidden_size"],
                   len(cfg["eagle_aux_hidden_state_layer_ids"]), tl["num_attention_heads"],
                   tl["num_key_value_heads"], tl["head_dim"], tl["intermediate_size"],
                   theta=tl["rope_parameters"]["rope_theta"], eps=tl["rms_norm_eps"])
    d2t, t2d = sd.pop("d2t"), sd.pop("t2d")
    names = model.state_dict_speculators(d2t, t2d)
    with torch.no_grad():
        for key, target in names.items():
            if key not in ("d2t", "t2d"):
                target.copy_(sd[key])
    return model, cfg, d2t, t2d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_target_args(ap)
    ap.add_argument("--init", type=Path, required=True, help="an EAGLE-3 drafter of the target")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mask-token-id", type=int, default=-1,
                    help="the future slots' token (default: the vocabulary's last id)")
    add_loop_args(ap, steps=2000)
    ap.set_defaults(lr=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()

    model, cfg, d2t, t2d = load_eagle3(args.init)
    aux_ids = cfg["eagle_aux_hidden_state_layer_ids"]
    k = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    with extractor(args) as address:
        with ExtractorClient(address, timeout=120) as client:
            client.wait_ready(60)
            contract = client.model_info()
        layers = [i - 1 for i in aux_ids]  # the extractor's numbering: raw layer outputs
        names = [f"layer.{j}" for j in layers]
        train = self_generated_features(address, args, sorted(set(layers)), False, names,
                                        contract, seed=args.seed + 19)
    V = contract.vocab_size
    mask_id = V - 1 if args.mask_token_id < 0 else args.mask_token_id
    if not 0 <= mask_id < V:
        sys.exit(f"--mask-token-id {mask_id}: outside the vocabulary [0, {V})")
    to_draft = torch.full((V,), -100, dtype=torch.long)
    chosen = torch.arange(len(d2t)) + d2t
    to_draft[chosen] = torch.arange(len(d2t))
    mask_hidden = torch.nn.Parameter(torch.cat([s["features"] for s in train]).mean(0))
    params = [p for p in model.parameters() if p.requires_grad] + [mask_hidden]
    curve = fit_one_sequence_at_a_time(
        params, train,
        lambda seq: ttt_loss(model, seq, to_draft, k, parallel=(mask_id, mask_hidden)), args)

    args.out.mkdir(parents=True, exist_ok=True)
    sd = dict(model.state_dict_speculators(d2t, t2d), mask_hidden=mask_hidden.view(1, 1, -1))
    sd = {n: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach())
          .contiguous() for n, v in sd.items()}
    save_file(sd, str(args.out / "model.safetensors"))
    os.chmod(args.out / "model.safetensors", 0o644)
    config = dict(cfg, architectures=["PEagleDraftModel"], speculators_model_type="peagle",
                  mask_token_id=mask_id,
                  speculators_config=speculators_config("peagle", k, contract.architecture))
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    log = training_log(args, params, contract, curve, train, t_start, feature_states=names,
                       init=str(args.init))
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(f"saved {args.out} (final loss {curve[-1]['loss']})", flush=True)


if __name__ == "__main__":
    main()
