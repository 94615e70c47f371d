"""The canary fingerprint in the contract: statistics of every tap on a fixed input, computed at
load, the same for two servers of the same checkpoint, rounding-level apart between float32 and
bfloat16 servers, a mismatch for another checkpoint of the same shape; `specwire-cli fingerprint`
prints and compares them without moving tensors, and the scorer's reports carry the target's."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from extractor_harness import build_dir
from safetensors.torch import load_file, save_file

from specwire_client import ExtractorClient
from specwire_client.audit import compare_fingerprints

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "tiny-qwen3"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(build_dir() / "clients" / "cli" / "specwire-cli"), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory) -> Path:
    """tiny-qwen3 with one MLP weight perturbed: same shapes, other weights."""
    out = tmp_path_factory.mktemp("other") / "tiny-qwen3"
    out.mkdir()
    for f in TARGET.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    w = load_file(TARGET / "model.safetensors")
    name = "model.layers.2.mlp.down_proj.weight"
    w[name] = (w[name].float() * 1.05).to(w[name].dtype)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def servers(server_factory, other_checkpoint):
    return {"fp32": server_factory(TARGET, dtype="float32"),
            "fp32-again": server_factory(TARGET, dtype="float32"),
            "bf16": server_factory(TARGET, dtype="bfloat16"),
            "other": server_factory(other_checkpoint, dtype="float32"),
            "none": server_factory(TARGET, dtype="float32", args=("--canary_tokens=0",))}


def canary(server) -> dict:
    with ExtractorClient(server.address, timeout=30) as c:
        return c.model_info().canary


def test_the_contract_carries_every_tap(servers):
    c = canary(servers["fp32"])
    assert [t["tap"] for t in c["taps"]] == ["embedding", "layer.0", "layer.1", "layer.2",
                                             "layer.3", "final_norm"]
    assert c["compute_dtype"] == "float32" and len(c["token_ids"]) == 80
    assert c["token_ids"] == [(7919 * i + 11) % 2048 for i in range(80)]
    assert all(len(t["sketch"]) == 8 and t["rms"] > 0 for t in c["taps"])
    # The statistics are those of the canonical states (recomputed here from an Extract).
    with ExtractorClient(servers["fp32"].address, timeout=30) as cl:
        s = cl.extract([c["token_ids"]], [0, 1, 2, 3], embedding=True, final_norm=True,
                       dtype="fp32")[0]
    for t in c["taps"]:
        x = s[t["tap"]].double()
        assert abs(x.pow(2).mean().sqrt().item() - t["rms"]) <= 1e-9 * t["rms"]
        assert abs(x.mean().item() - t["mean"]) <= 1e-9 * t["rms"]
    assert canary(servers["none"])["taps"] == []


def test_fingerprints_tell_rounding_from_drift(servers):
    base = canary(servers["fp32"])
    assert compare_fingerprints(base, canary(servers["fp32-again"]))["level"] == "identical"
    rounding = compare_fingerprints(base, canary(servers["bf16"]))
    assert rounding["level"] == "rounding", rounding
    other = compare_fingerprints(base, canary(servers["other"]))
    assert other["level"] in ("drift", "mismatch"), other
    by_tap = {t["tap"]: t["level"] for t in other["taps"]}
    assert by_tap["embedding"] == by_tap["layer.0"] == by_tap["layer.1"] == "identical"
    assert by_tap["layer.2"] != "identical"
    assert compare_fingerprints(base, canary(servers["none"]))["level"] == "mismatch"


def test_cli_prints_and_compares(servers, tmp_path):
    r = cli("fingerprint", "--extractor", servers["fp32"].address)
    assert r.returncode == 0, r.stderr
    saved = tmp_path / "fp32.json"
    saved.write_text(r.stdout)
    printed = json.loads(r.stdout)
    assert printed["canary"] == json.loads(json.dumps(canary(servers["fp32"])))
    same = cli("fingerprint", "--extractor", servers["fp32-again"].address, "--compare", str(saved))
    assert same.returncode == 0 and "verdict: identical" in same.stdout, same.stdout
    bf16 = cli("fingerprint", "--extractor", servers["bf16"].address, "--compare", str(saved))
    assert bf16.returncode == 0 and "verdict: rounding" in bf16.stdout, bf16.stdout
    other = cli("fingerprint", "--extractor", servers["other"].address, "--compare", str(saved))
    assert other.returncode == 1 and "layer.2" in other.stdout, other.stdout
    (tmp_path / "other.json").write_text(cli("fingerprint", "--extractor",
                                             servers["other"].address).stdout)
    offline = cli("fingerprint", "--compare", f"{saved},{tmp_path / 'other.json'}")
    assert offline.returncode == 1 and other.stdout == offline.stdout
    (tmp_path / "bad.json").write_text("[1, 2]")
    bad = cli("fingerprint", "--compare", f"{saved},{tmp_path / 'bad.json'}")
    assert bad.returncode == 2 and "bad.json" in bad.stderr and "not a JSON object" in bad.stderr


def test_the_fingerprint_is_the_same_in_process(servers):
    """specwire-extract computes the same canary in-process (the checkpoint path, no server)."""
    exe = build_dir() / "services" / "extractor" / "specwire-extract"
    r = subprocess.run([str(exe), "info", "--model", str(TARGET), "--dtype", "float32"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert compare_fingerprints(json.loads(r.stdout), canary(servers["fp32"]))["level"] == \
        "identical"
