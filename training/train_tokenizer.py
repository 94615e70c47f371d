"""Trains the byte-level BPE tokenizer of the tiny models, in the Qwen style.

NFC normalizer, Qwen2's pre-tokenizer regex (Split, isolated) followed by ByteLevel without its own
regex, ByteLevel decoder; the special tokens <|endoftext|>, <|im_start|>, <|im_end|> and <|MASK|>
(DFlash's mask token) follow the BPE vocabulary. Trained on the train split of training/corpus.py;
the corpus manifest (Python version, file counts, sha256 of the file lists) is written next to it.

    .venv/bin/python training/train_tokenizer.py --out models/tiny-qwen3
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

import corpus

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def train(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(corpus.SPECIAL_TOKENS),
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((corpus.read(f) for f in corpus.split(heldout=False)), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in corpus.SPECIAL_TOKENS])
    return tok


def save(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "special": True, "normalized": False,
                                        "lstrip": False, "rstrip": False, "single_word": False}
             for t in corpus.SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 4096,
        "eos_token": corpus.ENDOFTEXT,
        "pad_token": corpus.ENDOFTEXT,
        "bos_token": None,
        "unk_token": None,
        "mask_token": "<|MASK|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for tokenizer files")
    ap.add_argument("--vocab-size", type=int, default=2048,
                    help="total vocabulary including the special tokens")
    args = ap.parse_args()
    t0 = time.time()
    tok = train(args.vocab_size)
    save(tok, args.out)
    corpus.write_manifest(args.out / "corpus_manifest.json")
    print(json.dumps({"vocab_size": tok.get_vocab_size(),
                      "special_ids": {t: tok.token_to_id(t) for t in corpus.SPECIAL_TOKENS},
                      "wall_s": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
