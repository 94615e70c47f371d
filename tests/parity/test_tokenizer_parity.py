"""Parity of common/tokenizer (through specwire-tokenize) with Hugging Face `tokenizers`.

The oracle is `tokenizers` itself, reading the very tokenizer.json file the C++ side reads. The
tokenizer is realistic rather than tiny: byte-level BPE with a 4000-token vocabulary trained by
BpeTrainer on a few MB of Python's standard library sources (present on every machine), in six
configurations of the files we support:

  qwen2        NFC, Split(Qwen2 regex, Isolated) + ByteLevel(use_regex=False), Qwen's added tokens
  qwen35       the same with the Qwen3.5 regex (\\p{M} joins words) and legacy "a b" merge strings
  llama3       no normalizer, Llama-3 regex (\\p{N}{1,3}), ignore_merges, TemplateProcessing BOS
  gpt2         ByteLevel(use_regex=True) alone (the GPT-2 regex), TemplateProcessing BOS
  gpt2_prefix  NFC + ByteLevel(add_prefix_space=True, use_regex=True)
  splits       every other Split behavior, invert, a literal pattern, \\w \\W \\h

The compared texts: hand-written edge cases (code, prose, CJK, emoji and ZWJ sequences, NFC vs NFD
input, whitespace runs / tabs / CRLF, long numbers, upper-case contractions, added tokens inline,
the empty string), a sweep over every combining mark, random lines and multi-line chunks of the
corpus, and random Unicode strings. Random code points are limited to those assigned in Unicode 14
(Python 3.11's unicodedata): PCRE2 10.42 knows Unicode 14, the Oniguruma inside `tokenizers` a
newer one, so later letters may split differently (documented in common/tokenizer.h).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sysconfig
import time
import unicodedata
from pathlib import Path

import pytest
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

REPO = Path(__file__).resolve().parents[2]

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

VOCAB_SIZE = 4000
TRAIN_CHARS = 3_000_000
BOS = "<|begin_of_text|>"
# Qwen's special tokens, a BOS for the Llama-style template, and non-special added tokens that
# exercise the flags `tokenizers` honours: lstrip / rstrip, single_word and normalized.
SPECIAL_TOKENS = [
    AddedToken("<|endoftext|>", special=True, normalized=False),
    AddedToken("<|im_start|>", special=True, normalized=False),
    AddedToken("<|im_end|>", special=True, normalized=False),
    AddedToken("<|MASK|>", special=True, normalized=False, lstrip=True, rstrip=True),
    AddedToken(BOS, special=True, normalized=False),
]
PLAIN_ADDED_TOKENS = [
    AddedToken("<think>", special=False, normalized=False),
    AddedToken("</think>", special=False, normalized=False),
    AddedToken("cafe\u0301", special=False, normalized=True),  # matched after NFC as "café"
    AddedToken("XML", special=False, normalized=False, single_word=True),
]
VARIANTS = ["qwen2", "qwen35", "llama3", "gpt2", "gpt2_prefix", "splits"]
MODELS = ["qwen", "coarse"]


def tokenize_binary() -> Path:
    build = Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))
    return build / "services" / "extractor" / "specwire-tokenize"


# ------------------------------------------------------------------------------------------------
# Corpus and tokenizers
# ------------------------------------------------------------------------------------------------

def stdlib_sources(max_chars: int, seed: int) -> list[str]:
    """Whole .py files of the standard library, in a seeded random order, up to max_chars."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    random.Random(seed).shuffle(files)
    texts, total = [], 0
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def train_base(texts: list[str], coarse: bool) -> Tokenizer:
    """Byte-level BPE trained the Qwen way (NFC, Qwen2 split), or `coarse`: trained on whole lines,
    so that its merges cross spaces, digits and punctuation and any difference in where a variant
    splits changes the ids (with Qwen-split merges, a wrong split of digits or of exotic
    characters would often give the same ids)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    if coarse:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split("\n", behavior="merged_with_previous", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = split_then_byte_level(QWEN2_PATTERN)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    # After training, as in Qwen's files: added tokens follow the model vocabulary.
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens(PLAIN_ADDED_TOKENS)
    tok.pre_tokenizer = split_then_byte_level(QWEN2_PATTERN)  # every variant starts from Qwen2
    return tok


def split_then_byte_level(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def make_variant(base_json: str, name: str) -> str:
    """tokenizer.json text of one configuration, derived from the trained base."""
    tok = Tokenizer.from_str(base_json)
    bos_template = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))])
    if name == "qwen35":
        tok.pre_tokenizer = split_then_byte_level(QWEN35_PATTERN)
    elif name == "llama3":
        tok.pre_tokenizer = split_then_byte_level(LLAMA3_PATTERN)
        tok.post_processor = processors.Sequence(
            [processors.ByteLevel(trim_offsets=False), bos_template])
    elif name == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.post_processor = bos_template
    elif name == "gpt2_prefix":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    elif name == "splits":  # the other Split behaviors, invert, literal patterns, \w and \h
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(".", behavior="merged_with_previous"),
            pre_tokenizers.Split(Regex(r"\s*\n"), behavior="merged_with_next"),
            pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous"),
            pre_tokenizers.Split(Regex(r"\w+"), behavior="removed", invert=True),
            pre_tokenizers.Split(Regex(r"[\h_]+|\W"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
        ])
    doc = json.loads(tok.to_str())
    if name == "qwen35":
        doc["model"]["merges"] = [" ".join(m) for m in doc["model"]["merges"]]
    if name in ("llama3", "gpt2"):
        doc["normalizer"] = None
    if name == "llama3":
        doc["model"]["ignore_merges"] = True
    return json.dumps(doc, ensure_ascii=False)


def handwritten_texts() -> list[str]:
    return [
        "",
        " ",
        "\n",
        "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product\r\n",
        "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see.",
        "SHE'S HERE, THEY'LL COME, I'M SURE, WE'VE SEEN IT, YOU'D KNOW, DON'T, IT'S",
        "case folding: it'\u017ft x'\u017f WE'\uff2c\uff2c he'\uff33 '\u212a '\u0130 'st '\ufb05",
        "Speculative decoding drafts k tokens and the target verifies them in one pass.",
        "日本語のテキストと中文文本，还有한국어 문장도 있습니다。",
        "Ελληνικά, русский текст, עברית, العربية, हिन्दी, ไทย",
        "👩‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs, 🇯🇵🇫🇷 flags, ❤️ heart",
        "cafe\u0301 vs caf\u00e9, A\u030a vs \u00c5, \u1100\u1161\u11a8 vs \uac01",
        "n\u0303o\u0308\u0301 x\u0323\u0307 q\u0307\u0323",
        "tabs\tand\t\ttabs\n\n\nnewlines\r\n\r\nCRLF   trailing   \n   ",
        "      leading spaces and \u00a0no-break\u2003em\u3000ideographic\u2028line\u2029para",
        "3.14159265358979323846264338327950288419716939937510 and 1,000,000,000 and 007",
        "٠١٢٣٤٥٦٧٨٩ ０１２３ ²³¹ ½ Ⅻ",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
        "<|im_start|><|im_end|><|endoftext|><|endoftext|>",
        "a <|MASK|> b   <|MASK|>   c<|MASK|>d",
        "<think>\nreasoning\n</think>\n\nanswer</think><think>",
        "I like cafe\u0301 and café and XML, but not XMLHttp or myXML; XML.",
        "<|im_start|notquite|> <|im_end <|endoftext|",
        "\u180e\u180e mongolian vowel separator \u0085 next line \x0b\x0c",
        "x" * 300 + " " + "ab" * 200,
        " " * 100 + "\n" * 20 + "\t" * 10,
    ]


def combining_mark_sweep() -> list[str]:
    """Every combining mark after a higher-class mark, so NFC must reorder or leave it."""
    out = []
    for cp in range(0x300, 0x110000):
        ch = chr(cp)
        if unicodedata.category(ch) == "Cn" or unicodedata.combining(ch) == 0:
            continue
        out.append(f"a\u0345{ch}\u0301 e{ch}\u0323")
    out.append("\U00011935\U00011930 \U00011938")  # Dives Akuru O, composed only by new data
    return out


def random_lines(sources: list[str], rng: random.Random, n_lines: int,
                 n_chunks: int) -> list[str]:
    lines = [line for text in sources for line in text.splitlines(keepends=True)
             if line.strip()]
    out = [rng.choice(lines) for _ in range(n_lines)]
    for _ in range(n_chunks):
        text = rng.choice(sources)
        start = rng.randrange(len(text))
        out.append(text[start:start + rng.randrange(200, 4000)])
    return out


def fuzz_strings(rng: random.Random, n: int) -> list[str]:
    assigned = [cp for cp in range(0x110000)
                if not 0xD800 <= cp < 0xE000 and unicodedata.category(chr(cp)) != "Cn"]
    pools = [
        [chr(c) for c in range(0x20, 0x7F)] + ["\n", "\t", "\r", "'"],
        [chr(c) for c in range(0xA0, 0x250)],
        [chr(c) for c in range(0x300, 0x370)],                 # combining diacritics
        [chr(c) for c in range(0x1100, 0x1200)] + [chr(c) for c in range(0xAC00, 0xAC40)],
        [chr(c) for c in range(0x4E00, 0x4F00)] + [chr(c) for c in range(0x3040, 0x3100)],
        [chr(c) for c in range(0x1F300, 0x1F650)] + ["\u200d", "\ufe0f", "\U0001F3FD"],
        [" ", "  ", "\u00a0", "\u2009", "\u3000", "\u180e", "\u0085", "\u2028", "\x0b", "\x0c",
         "\r\n"],
        [chr(c) for c in (0x660, 0x6F1, 0x966, 0xFF11, 0xB2, 0xBD, 0x2167, 0x1D7CE)],
        ["'s", "'S", "'ll", "'LL", "'Re", "<|im_start|>", "<|MASK|>", " <|MASK|> ", "<think>",
         "XML", "cafe\u0301", "<|endoftext|>"],
        [chr(rng.choice(assigned)) for _ in range(4000)],
    ]
    out = []
    for _ in range(n):
        k = rng.randrange(1, 4)
        chosen = [rng.choice(pools) for _ in range(k)]
        out.append("".join(rng.choice(rng.choice(chosen)) for _ in range(rng.randrange(1, 40))))
    return out


@pytest.fixture(scope="module")
def binary() -> Path:
    exe = tokenize_binary()
    if not exe.exists():
        pytest.fail(f"{exe} not built; build it with `cmake --build <dir> --target "
                    f"specwire-tokenize` (set SPECWIRE_BUILD_DIR)", pytrace=False)
    return exe


@pytest.fixture(scope="module")
def sources() -> list[str]:
    return stdlib_sources(TRAIN_CHARS, seed=0)


@pytest.fixture(scope="module")
def tokenizer_files(sources, texts, tmp_path_factory) -> dict[tuple[str, str], tuple[Path, Tokenizer]]:
    """(model, variant) -> (tokenizer.json path, the HF oracle loaded from that same file)."""
    root = tmp_path_factory.mktemp("tokenizers")
    out = {}
    for model in MODELS:
        # The coarse model also learns from the compared texts, so that their exotic characters
        # and digit runs get merges.
        base = train_base(sources + texts if model == "coarse" else sources,
                          coarse=model == "coarse").to_str()
        for name in VARIANTS:
            path = root / f"{model}-{name}.json"
            path.write_text(make_variant(base, name), encoding="utf-8")
            out[model, name] = (path, Tokenizer.from_file(str(path)))
    return out


@pytest.fixture(scope="module")
def texts(sources) -> list[str]:
    rng = random.Random(1234)
    return (handwritten_texts() + combining_mark_sweep()
            + random_lines(sources, rng, n_lines=3000, n_chunks=150)
            + fuzz_strings(rng, 2000))


def run_cli(exe: Path, tokenizer: Path, docs: list[dict], *flags: str) -> list[dict]:
    stdin = "".join(json.dumps(d) + "\n" for d in docs)
    proc = subprocess.run([str(exe), "--tokenizer", str(tokenizer), *flags], input=stdin,
                          capture_output=True, text=True, encoding="utf-8", timeout=120)
    out = [json.loads(line) for line in proc.stdout.split("\n") if line]
    assert len(out) == len(docs), proc.stderr
    errors = [(i, o["error"]) for i, o in enumerate(out) if "error" in o]
    assert not errors, f"{len(errors)} lines failed, first: {errors[0]}"
    assert proc.returncode == 0, proc.stderr
    return out


def report(mismatches: list[tuple], total: int, what: str) -> str:
    lines = [f"{len(mismatches)} of {total} {what} differ; first ones:"]
    for item in mismatches[:5]:
        lines.append("  " + " | ".join(repr(x)[:300] for x in item))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("add_special_tokens", [False, True], ids=["plain", "special"])
def test_encode_matches_hf(model, variant, add_special_tokens, binary, tokenizer_files, texts):
    path, hf = tokenizer_files[model, variant]
    flags = ["--add_special_tokens"] if add_special_tokens else []
    ours = [o["ids"] for o in run_cli(binary, path, [{"text": t} for t in texts], *flags)]
    want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add_special_tokens)]
    bad = [(t, o, w) for t, o, w in zip(texts, ours, want) if o != w]
    assert not bad, report(bad, len(texts), f"{model}/{variant} encodings (text | ours | hf)")


@pytest.mark.parametrize("variant", VARIANTS)
def test_pre_tokenize_matches_hf(variant, binary, tokenizer_files, texts):
    """The pieces themselves: where ids could agree by luck (no merge across a piece boundary),
    this still sees every difference in regex semantics."""
    path, hf = tokenizer_files["qwen", variant]
    ours = [o["pieces"] for o in run_cli(binary, path, [{"text": t} for t in texts],
                                         "--pre_tokenize")]
    want = [[piece for piece, _ in hf.pre_tokenizer.pre_tokenize_str(t)] for t in texts]
    bad = [(t, o, w) for t, o, w in zip(texts, ours, want) if o != w]
    assert not bad, report(bad, len(texts), f"{variant} pre-tokenizations (text | ours | hf)")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_matches_hf(model, variant, binary, tokenizer_files, texts):
    path, hf = tokenizer_files[model, variant]
    rng = random.Random(99)
    size = hf.get_vocab_size(with_added_tokens=True)
    # Real encodings (with special tokens) and random id runs, which cut UTF-8 sequences apart.
    id_lists = [e.ids for e in hf.encode_batch(texts[:2000], add_special_tokens=True)]
    id_lists += [[rng.randrange(size) for _ in range(rng.randrange(1, 24))] for _ in range(1000)]
    docs = [{"ids": ids} for ids in id_lists]
    for skip in (False, True):
        flags = ["--decode"] + (["--skip_special_tokens"] if skip else [])
        ours = [o["text"] for o in run_cli(binary, path, docs, *flags)]
        want = hf.decode_batch(id_lists, skip_special_tokens=skip)
        bad = [(ids, o, w) for ids, o, w in zip(id_lists, ours, want) if o != w]
        assert not bad, report(bad, len(id_lists), f"{model}/{variant} decodings skip={skip}")
    # Round trip: decoding the encoding of a text gives back its normalized form. Not where HF
    # does not either: <|MASK|> swallows the spaces around it, add_prefix_space adds some, a
    # Removed split drops text, and the added token "café" decodes to "caf\ufffd" (its é is the
    # byte-level character of byte 0xE9).
    if variant in ("gpt2_prefix", "splits"):
        return
    normalize = hf.normalizer.normalize_str if hf.normalizer is not None else (lambda s: s)
    plain = [t for t in texts[:2000] if "<|MASK|>" not in t and "café" not in normalize(t)
             and "cafe\u0301" not in t]
    ids = [e.ids for e in hf.encode_batch(plain, add_special_tokens=False)]
    back = [o["text"] for o in run_cli(binary, path, [{"ids": i} for i in ids], "--decode")]
    bad = [(t, b) for t, b in zip(plain, back) if b != normalize(t)]
    assert not bad, report(bad, len(plain), f"{model}/{variant} round trips (text | decoded)")


def test_cli_rejects_bad_lines(binary, tokenizer_files):
    path, _ = tokenizer_files["qwen", "qwen2"]
    proc = subprocess.run([str(binary), "--tokenizer", str(path)],
                          input='{"text": "ok"}\nnot json\n{"text": 5}\n', capture_output=True,
                          text=True, timeout=60)
    out = [json.loads(line) for line in proc.stdout.split("\n") if line]
    assert "ids" in out[0] and "error" in out[1] and "error" in out[2]
    assert proc.returncode == 1
    proc = subprocess.run([str(binary), "--tokenizer", str(path), "--decode"],
                          input='{"ids": [1, 99999999]}\n', capture_output=True, text=True,
                          timeout=60)
    assert "ids[1]" in json.loads(proc.stdout)["error"]


def test_throughput_report(binary, tokenizer_files, sources, capsys):
    """Prints encode throughput of ours and of `tokenizers` (one thread each); never fails."""
    path, hf = tokenizer_files["qwen", "qwen2"]
    docs = sources[:40]
    proc = subprocess.run([str(binary), "--tokenizer", str(path), "--stats"],
                          input="".join(json.dumps({"text": d}) + "\n" for d in docs),
                          capture_output=True, text=True, timeout=120)
    stats = proc.stderr.strip().split()
    ours_tokens, ours_s = int(stats[3]), float(stats[5])
    start = time.perf_counter()
    hf_tokens = sum(len(hf.encode(d, add_special_tokens=False).ids) for d in docs)
    hf_s = time.perf_counter() - start
    assert ours_tokens == hf_tokens
    with capsys.disabled():
        print(f"\n[tokenizer throughput] {sum(map(len, docs)) / 1e6:.2f} M chars, {hf_tokens} "
              f"tokens: specwire {ours_tokens / ours_s / 1e6:.2f} M tok/s, "
              f"tokenizers {hf_tokens / hf_s / 1e6:.2f} M tok/s (single thread)")
