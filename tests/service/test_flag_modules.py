"""The flags several binaries share are defined once (common/models/target_flags.cc for the
target-loading ones, common/rpc/server_flags.cc for the servers'), and each binary resolves
their "auto" defaults to its own: the extractor computes in bfloat16 and specwire-extract in
float32 unless told otherwise; a negative value is refused naming the flag."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from extractor_harness import binary, build_dir

ROOT = Path(__file__).resolve().parents[2]
TARGET_FLAGS = ("dtype", "device_map", "threads", "kernels", "batch_layout")
SERVER_FLAGS = ("listen", "metrics_listen", "max_queue", "stream_idle_seconds", "max_text_bytes",
                "max_new_tokens_limit", "tls_cert", "drain_seconds")
DEFINITION = re.compile(r"ABSL_FLAG\(\s*[\w:<> ]+,\s*(\w+)\s*,")


def definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for folder in ("common", "services", "clients", "bench"):
        for path in sorted((ROOT / folder).rglob("*.cc")):
            for name in DEFINITION.findall(path.read_text()):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_shared_flags_are_defined_once():
    found = definitions()
    for name in SERVER_FLAGS:
        assert found[name] == ["common/rpc/server_flags.cc"], (name, found[name])
    # Every binary that loads a target through the engine takes these from one module; the
    # other definitions of the same spelling are the drafter's own (--dtype, --threads of
    # specwire-score and specwire-scorer, services/scorer/runner_flags.cc) and decode_bench's,
    # which drives the models without the engine.
    allowed = {"common/models/target_flags.cc", "services/scorer/runner_flags.cc",
               "bench/decode_bench.cc"}
    for name in TARGET_FLAGS:
        assert "common/models/target_flags.cc" in found[name], name
        assert set(found[name]) <= allowed, (name, found[name])


def help_of(exe: Path) -> str:
    text = subprocess.run([str(exe), "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    return " ".join(text.split())  # absl wraps the help lines


def test_each_binary_names_its_own_auto_default():
    for name in ("specwire-extractor", "specwire-extract"):
        text = help_of(binary(name))
        assert "--dtype" in text and 'default: "auto"' in text, name
        assert "bfloat16 in specwire-extractor" in text, name
    scorer = build_dir() / "services" / "scorer" / "specwire-scorer"
    text = help_of(scorer)
    for flag in ("--listen", "--metrics_listen", "--max_queue", "--stream_idle_seconds",
                 "--max_text_bytes", "--max_new_tokens_limit"):
        assert flag in text, flag
    assert "127.0.0.1:50061 for specwire-scorer" in text


def test_specwire_extract_computes_in_float32_by_default(checkpoint):
    out = subprocess.run([str(binary("specwire-extract")), "info", f"--model={checkpoint}",
                          "--threads=1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["compute_dtype"] == "float32"


def test_negative_values_are_refused_naming_the_flag(checkpoint):
    out = subprocess.run([str(binary("specwire-extract")), "info", f"--model={checkpoint}",
                          "--threads=-2"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "--threads" in out.stderr, out.stderr
    out = subprocess.run([str(binary("specwire-extractor")), f"--model={checkpoint}",
                          "--max_queue=-5"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "--max_queue" in out.stderr, out.stderr
    out = subprocess.run([str(binary("specwire-extract")), "info", f"--model={checkpoint}",
                          "--dtype=int8"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "--dtype" in out.stderr, out.stderr
