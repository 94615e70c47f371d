"""The training corpus: the Python standard library's own .py sources.

Every machine with a CPython has them, so the corpus needs no download. Test suites, lib2to3 and
site-packages are left out (they are large, repetitive or not part of the library). Each file goes
to the train or the held-out split by a hash of its path relative to the stdlib root, so the split
is the same on any machine with the same Python version, whatever the install prefix.
"""
from __future__ import annotations

import hashlib
import json
import platform
import sysconfig
from pathlib import Path

EXCLUDED_DIRS = {"test", "tests", "idle_test", "lib2to3", "site-packages", "dist-packages"}
HELDOUT_PERCENT = 10

# Special tokens in Qwen's order, appended after the BPE vocabulary as in Qwen's tokenizer files.
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, "<|im_start|>", "<|im_end|>", "<|MASK|>"]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel: str) -> bool:
    digest = hashlib.sha256(rel.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def corpus_files() -> list[str]:
    """Relative paths (posix, sorted) of the corpus files that decode as UTF-8."""
    root = stdlib_root()
    out = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        try:
            f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(rel.as_posix())
    return out


def split(heldout: bool) -> list[str]:
    return [rel for rel in corpus_files() if is_heldout(rel) == heldout]


def read(rel: str) -> str:
    return (stdlib_root() / rel).read_text(encoding="utf-8")


def manifest() -> dict:
    files = corpus_files()
    train = [f for f in files if not is_heldout(f)]
    held = [f for f in files if is_heldout(f)]

    def digest(names: list[str]) -> str:
        return hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()

    return {
        "corpus": "Python standard library .py sources (sysconfig stdlib path), "
                  f"excluding directories {sorted(EXCLUDED_DIRS)}",
        "python_version": platform.python_version(),
        "files": len(files),
        "train_files": len(train),
        "heldout_files": len(held),
        "heldout_rule": f"sha256(relative path)[:4] as big-endian int % 100 < {HELDOUT_PERCENT}",
        "train_chars": sum(len(read(f)) for f in train),
        "file_list_sha256": digest(files),
        "train_list_sha256": digest(train),
        "heldout_list_sha256": digest(held),
    }


def write_manifest(path: Path) -> dict:
    m = manifest()
    path.write_text(json.dumps(m, indent=2) + "\n")
    return m
