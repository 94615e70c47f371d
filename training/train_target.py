"""Trains a tiny target language model on the corpus of training/corpus.py.

Two architectures, both transformers classes saved with save_pretrained (bfloat16 safetensors):
  qwen3    Qwen3ForCausalLM (GQA, q/k norm, tied embeddings)
  qwen3_5  Qwen3_5ForCausalLM, model_type qwen3_5_text: Gated DeltaNet (linear_attention) layers
           with a gated full-attention layer every `--full-attention-interval` layers

The train split is tokenized with the tokenizer in --tokenizer, files joined by <|endoftext|>,
cut into --seq-len windows; batches are drawn with a fixed seed. The tokenizer files and a
generation_config (eos = <|endoftext|>) are copied next to the weights, and train_log.json records
the loss curve, held-out loss, wall time and the corpus manifest.

    .venv/bin/python training/train_target.py --arch qwen3 --tokenizer models/tiny-qwen3 \
        --out models/tiny-qwen3
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

# Threads that sleep at barriers: busy-waiting OpenMP threads lose badly on a shared machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import corpus  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def model_config(args, vocab_size: int, eos: int) -> transformers.PretrainedConfig:
    common = dict(vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
                  num_hidden_layers=args.layers, num_attention_heads=args.heads,
                  num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  eos_token_id=eos, bos_token_id=None, pad_token_id=eos)
    if args.arch == "qwen3":
        return transformers.Qwen3Config(rope_theta=1_000_000.0, **common)
    types = ["full_attention" if (i + 1) % args.full_attention_interval == 0 else "linear_attention"
             for i in range(args.layers)]
    return transformers.Qwen3_5TextConfig(
        layer_types=types, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=args.head_dim, linear_value_head_dim=args.head_dim,
        linear_conv_kernel_dim=4,
        rope_parameters=dict(rope_type="default", rope_theta=10_000_000.0,
                             partial_rotary_factor=0.25),
        **common)


def token_stream(tok: Tokenizer, files: list[str], eos: int) -> torch.Tensor:
    ids: list[int] = []
    for enc in tok.encode_batch([corpus.read(f) for f in files], add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_loss(model, data: torch.Tensor, seq_len: int, batches: int = 8, batch: int = 8) -> float:
    model.eval()
    n = (len(data) - 1) // seq_len
    starts = torch.linspace(0, n - 1, batches * batch).long() * seq_len
    losses = []
    for b in range(batches):
        idx = starts[b * batch:(b + 1) * batch]
        x = torch.stack([data[s:s + seq_len] for s in idx])
        losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=["qwen3", "qwen3_5"], default="qwen3")
    ap.add_argument("--tokenizer", type=Path, required=True, help="directory with tokenizer.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--full-attention-interval", type=int, default=4, help="qwen3_5 only")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    eos = tok.token_to_id(corpus.ENDOFTEXT)
    train = token_stream(tok, corpus.split(heldout=False), eos)
    held = token_stream(tok, corpus.split(heldout=True), eos)
    print(f"train tokens {len(train)}, held-out tokens {len(held)}", flush=True)

    config = model_config(args, tok.get_vocab_size(), eos)
    cls = transformers.Qwen3ForCausalLM if args.arch == "qwen3" else transformers.Qwen3_5ForCausalLM
    model = cls(config).float().train()
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.arch}: {params / 1e6:.2f}M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(args.seed)
    curve = []
    t0 = time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        starts = torch.randint(0, len(train) - args.seq_len - 1, (args.batch,), generator=g)
        x = torch.stack([train[s:s + args.seq_len] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            curve.append({"step": step, "loss": round(loss.item(), 4),
                          "wall_s": round(time.time() - t0, 1)})
            print(json.dumps(curve[-1]), flush=True)
    wall = time.time() - t0
    held_loss = heldout_loss(model, held, args.seq_len)
    print(f"held-out loss {held_loss:.4f}, wall {wall:.0f} s", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    transformers.GenerationConfig(eos_token_id=eos, pad_token_id=eos, do_sample=False).save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        src = args.tokenizer / name
        if src.resolve() != (args.out / name).resolve():
            shutil.copy(src, args.out / name)
    log = {"arch": args.arch, "parameters": params,
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "train_tokens": len(train), "heldout_tokens": len(held),
           "tokens_seen": args.steps * args.batch * args.seq_len,
           "final_train_loss": curve[-1]["loss"], "heldout_loss": round(held_loss, 4),
           "wall_s": round(wall, 1), "loss_curve": curve,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "corpus": corpus.manifest()}
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")


if __name__ == "__main__":
    main()
