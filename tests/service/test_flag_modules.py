"""The flags several binaries share are defined once (common/models/target_flags.cc for the
target-loading ones, common/rpc/server_flags.cc for the servers'), and each binary resolves
their "auto" defaults to its own: the extractor computes in bfloat16 and specwire-extract in
float32 unless told otherwise; a negative value is refused naming the flag."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

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


# What a scoring run reads in specwire-score and specwire-replay alike
# (services/scorer/replay/score_flags.cc): one definition, so one default and one help text.
SCORE_FLAGS = ("max_new_tokens", "bootstrap_resamples", "bootstrap_seed", "dspark_cutoff")


def flag_help(exe: Path, flag: str) -> str:
    """--flag's entry in exe's --help (its text and default), whitespace folded."""
    text = subprocess.run([str(exe), "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    m = re.search(rf"^\s+--{flag} \((.*?)\);", text, re.M | re.S)
    assert m, (exe.name, flag)
    return " ".join(m.group(1).split())


def test_score_flags_are_defined_once_with_one_default():
    found = definitions()
    scorer = build_dir() / "services" / "scorer"
    for name in SCORE_FLAGS:
        # specwire-extract's and specwire-cli's --max_new_tokens are their generate verbs' own.
        assert [f for f in found[name] if f.startswith("services/scorer/")] == [
            "services/scorer/replay/score_flags.cc"], (name, found[name])
        assert (flag_help(scorer / "specwire-score", name)
                == flag_help(scorer / "specwire-replay", name)), name


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


# What a request asks of the target (common/request_flags.h): each group defined once, in its
# own object file, and a binary links (and --help lists) the groups it reads and no other.
REQUEST_GROUPS = {"tokens": ("tokens", "tokens_file"), "prompts": ("text", "prompts_file"),
                  "states": ("layers", "embedding", "final_norm"),
                  "stop": ("stop", "ignore_model_eos")}
REQUEST_USERS = {"specwire-extract": {"tokens", "states", "stop"},
                 "specwire-cli": {"tokens", "prompts", "states", "stop"},
                 "specwire-replay": {"tokens", "stop"},
                 "specwire-score": {"tokens", "prompts"}}


def request_binary(name: str) -> Path:
    if name in ("specwire-replay", "specwire-score"):
        return build_dir() / "services" / "scorer" / name
    if name == "specwire-cli":
        return build_dir() / "clients" / "cli" / name
    return binary(name)


def help_flags(exe: Path) -> set[str]:
    text = subprocess.run([str(exe), "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    return set(re.findall(r"^\s+--(\w+) \(", text, re.M))


def test_request_flags_are_defined_once_and_linked_by_group():
    found = definitions()
    for group, names in REQUEST_GROUPS.items():
        for name in names:
            # bench/'s --layers names a workload ("all": every state), not a request's states.
            tools = [f for f in found[name] if not f.startswith("bench/")]
            assert tools == [f"common/request_flags_{group}.cc"], (name, found[name])
    for name, groups in REQUEST_USERS.items():
        listed = help_flags(request_binary(name))
        for group, flags in REQUEST_GROUPS.items():
            for flag in flags:
                assert (flag in listed) == (group in groups), (name, group, flag)


def request_case(tmp_path: Path, args: list[str]) -> list[str]:
    files = {"{empty}": [[1, 2], []], "{text_id}": [[1, "a"]], "{not_a_list}": {"a": 1}}
    out = []
    for a in args:
        for key, content in files.items():
            if key in a:
                f = tmp_path / (key.strip("{}") + ".json")
                f.write_text(json.dumps(content))
                a = a.replace(key, str(f))
        out.append(a)
    return out


# The same bad request, the same refusal (INVALID_ARGUMENT naming the flag, exit 2) from every
# binary that reads it; nothing is sent or loaded past it.
BAD_REQUESTS = [
    (["--tokens=1,2;;3"], '--tokens: sequences[1]: empty'),
    (["--tokens=1,2;"], '--tokens: sequences[1]: empty'),
    (["--tokens=1,x"], '--tokens: "x" is not an integer'),
    (["--tokens_file={empty}"], "--tokens_file: sequences[1]: empty"),
    (["--tokens_file={text_id}"], "--tokens_file: sequences[0]: token ids must be integers"),
    (["--tokens_file={not_a_list}"], "--tokens_file: expected a JSON list of token-id lists"),
    (["--tokens_file=/nonexistent/tokens.json"], "/nonexistent/tokens.json"),
]


def refusal(name: str, args: list[str], tmp_path: Path, extractor: str) -> tuple[int, str]:
    base = {"specwire-extract": ["extract", "--model", str(ROOT / "models" / "tiny-qwen3"),
                                 "--layers=0", f"--out={tmp_path / 'o.safetensors'}"],
            "specwire-cli": ["extract", f"--extractor={extractor}", "--layers=0",
                             f"--out={tmp_path / 'o.safetensors'}"],
            "specwire-replay": ["replay", "--drafter", str(ROOT / "models" / "tiny-qwen3-eagle3"),
                                "--target_checkpoint", str(ROOT / "models" / "tiny-qwen3")],
            "specwire-score": [f"--extractor={extractor}", "--quiet",
                               "--drafter", str(ROOT / "models" / "tiny-qwen3-eagle3")]}[name]
    r = subprocess.run([str(request_binary(name)), *base, *args], capture_output=True, text=True,
                       timeout=300)
    return r.returncode, r.stderr


@pytest.mark.parametrize("case", range(len(BAD_REQUESTS)))
def test_bad_request_refused_alike_everywhere(case, tmp_path):
    args, message = BAD_REQUESTS[case]
    args = request_case(tmp_path, args)
    # An address nothing listens on: a binary that got past the flags would fail UNAVAILABLE.
    for name in REQUEST_USERS:
        code, err = refusal(name, args, tmp_path, "127.0.0.1:9")
        if "/nonexistent/" in message:
            assert code != 0 and message in err and "UNAVAILABLE" not in err, (name, err)
            continue
        assert code == 2 and f"INVALID_ARGUMENT: {message}" in err, (name, code, err)
        assert not (tmp_path / "o.safetensors").exists()


def test_stop_flags_refused_alike(tmp_path):
    for name, args in (("specwire-extract", ["generate", "--model",
                                             str(ROOT / "models" / "tiny-qwen3"), "--tokens=1"]),
                       ("specwire-cli", ["generate", "--extractor=127.0.0.1:9", "--tokens=1"]),
                       ("specwire-replay", ["replay", "--drafter",
                                            str(ROOT / "models" / "tiny-qwen3-eagle3"),
                                            "--target_checkpoint",
                                            str(ROOT / "models" / "tiny-qwen3"), "--tokens=1"])):
        r = subprocess.run([str(request_binary(name)), *args, "--stop=2,x"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 2 and 'INVALID_ARGUMENT: --stop: "x" is not an integer' in r.stderr, (
            name, r.stderr)
