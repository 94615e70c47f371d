"""Features exported as SpecForge's and speculators' offline datasets (specwire_client.export and
`specwire-cli export`): both writers give the same tensors, the trainers' own readers (their PyPI
packages, from .venv/trainer-oracles) load them and read exactly what an Extract of each sample
returns, a few training steps of their model code run on them, the states are the ones their
heads expect (the target's logits come back), and bad input is refused naming the field."""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from extractor_harness import build_dir
from safetensors.torch import load_file

from specwire_client import ChatTemplate, ExtractorClient
from specwire_client.chat import tokenizer_encoder
from specwire_client.export import export_features, prepare_samples

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "tiny-qwen3"      # 4 layers, hidden 128, vocab 2048
DRAFTER = REPO / "models" / "tiny-qwen3-dflash"  # dflash_config.target_layer_ids [1, 3]
ORACLES = REPO / ".venv" / "trainer-oracles"
LAYERS = {"dflash": [1, 3], "eagle3": [0, 1, 2]}
CLI = lambda: build_dir() / "clients" / "cli" / "specwire-cli"  # noqa: E731
CASES = [(f, lay) for f in ("specforge", "speculators") for lay in ("dflash", "eagle3")]


def generated_samples(seed: int = 7) -> list:
    """Token lists, masked dicts (random spans, all zeros, all ones), an unmasked dict, and
    conversations rendered with a ChatML template with generation blocks."""
    rng = random.Random(seed)
    out: list = []
    for i in range(10):
        n = rng.choice([1, 2, 3, 17, 33, 48]) if i < 6 else rng.randint(2, 60)
        ids = [rng.randrange(2048) for _ in range(n)]
        kind = i % 4
        if kind == 0:
            out.append(ids)
        elif kind == 1:
            out.append({"input_ids": ids})
        else:
            cut = rng.randint(0, n)
            mask = [0] * cut + [1] * (n - cut) if kind == 2 else [rng.randint(0, 1) for _ in ids]
            out.append({"input_ids": ids, "loss_mask": mask})
    out.append({"messages": [{"role": "user", "content": "def add(a, b):"},
                             {"role": "assistant", "content": "return a + b"}]})
    out.append({"messages": [{"role": "system", "content": "You write Python."},
                             {"role": "user", "content": "Sort a list."},
                             {"role": "assistant", "content": "sorted(xs)"},
                             {"role": "user", "content": "Reverse it."},
                             {"role": "assistant", "content": "xs[::-1]"}]})
    return out


def untrainable(fmt: str, lay: str, rows: list[dict]) -> list[int]:
    """Rows a specforge dflash export leaves out: no two consecutive supervised tokens."""
    if (fmt, lay) != ("specforge", "dflash"):
        return []
    return [i for i, r in enumerate(rows)
            if not any(a and b for a, b in zip(r["loss_mask"], r["loss_mask"][1:]))]


def digest(t: torch.Tensor) -> str:
    return f"{t.dtype}:{list(t.shape)}:" + hashlib.sha256(
        t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(TARGET, dtype="float32")


@pytest.fixture(scope="module")
def template():
    return ChatTemplate((REPO / "tests/data/chat_templates/chatml_generation.jinja").read_text(),
                        "chatml_generation",
                        {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})


@pytest.fixture(scope="module")
def exports(server, template, tmp_path_factory):
    """Every format x layout written by the Python export (from messages and token ids) and by
    specwire-cli (from the same rows, prepared)."""
    root = tmp_path_factory.mktemp("export")
    encode = tokenizer_encoder(TARGET / "tokenizer.json")
    samples = generated_samples()
    rows = prepare_samples(samples, template, encode, {"enable_thinking": False})
    prepared = root / "prepared.jsonl"
    prepared.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for fmt, lay in CASES:
        export_features(server.address, samples, root / "py" / f"{fmt}-{lay}", format=fmt,
                        layout=lay, layer_ids=LAYERS[lay], template=template, encode=encode,
                        template_flags={"enable_thinking": False}, sequences_per_request=3)
        args = ["--layers", ",".join(map(str, LAYERS[lay]))] if lay == "eagle3" else [
            "--drafter", str(DRAFTER)]
        r = subprocess.run([str(CLI()), "export", "--extractor", server.address,
                            "--dataset", str(prepared), "--format", fmt, "--layout", lay, *args,
                            "--sequences_per_request", "4", "--out",
                            str(root / "cli" / f"{fmt}-{lay}")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert f"wrote {len(rows) - len(untrainable(fmt, lay, rows))} samples" in r.stdout
    return root, rows


def test_python_and_cli_write_the_same_tensors(exports):
    root, rows = exports
    for fmt, lay in CASES:
        py, cli = root / "py" / f"{fmt}-{lay}", root / "cli" / f"{fmt}-{lay}"
        names = sorted(p.relative_to(py).as_posix() for p in py.rglob("*") if p.is_file())
        assert names == sorted(p.relative_to(cli).as_posix() for p in cli.rglob("*")
                               if p.is_file())
        assert not [n for n in names if n.endswith(".tmp")]
        for n in names:
            if n.endswith(".ckpt"):
                a, b = (torch.load(d / n, weights_only=False, mmap=True) for d in (py, cli))
                with zipfile.ZipFile(cli / n) as z:  # specwire-cli's own zip: CRCs, alignment
                    assert z.testzip() is None
                    assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
            elif n.endswith(".safetensors"):
                a, b = (load_file(d / n) for d in (py, cli))
            else:
                continue
            assert a.keys() == b.keys(), n
            for k in a:
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (fmt, lay, n, k)
        ma, mb = (json.loads((d / "specwire_export.json").read_text()) for d in (py, cli))
        ma.pop("source"), mb.pop("source")
        assert ma == mb
        left_out = untrainable(fmt, lay, rows)
        assert [s["sample_index"] for s in ma["skipped"]] == left_out
        kept = [r for i, r in enumerate(rows) if i not in left_out]
        assert ma["samples"] == len(kept)
        assert ma["tokens"] == sum(len(r["input_ids"]) for r in kept)
        assert ma["supervised_tokens"] == sum(sum(r["loss_mask"]) for r in kept)
        assert ma["chat_templates"] and ma["chat_templates"][0]["flags"] == {
            "enable_thinking": False}


def test_manifest_keeps_the_contract_and_both_numberings(exports, server):
    root, _ = exports
    with ExtractorClient(server.address, timeout=30) as c:
        contract = json.loads(json.dumps(c.model_info().to_dict()))
    specforge = json.loads((root / "py/specforge-eagle3/specwire_export.json").read_text())
    assert specforge["contract"] == contract
    assert specforge["format_layers"] == {"aux_hidden_state_layer_ids": [0, 1, 2],
                                          "states": ["layer.0", "layer.1", "layer.2"],
                                          "hidden_state": "final_norm"}
    dflash = json.loads((root / "cli/specforge-dflash/specwire_export.json").read_text())
    assert dflash["format_layers"]["states"] == ["layer.1", "final_norm"]
    spec = json.loads((root / "py/speculators-dflash/specwire_export.json").read_text())
    assert spec["format_layers"]["target_layer_ids"] == [2, 4]  # hidden-state indices
    assert spec["format_layers"]["hidden_states_layers"] == [2, 4, 4]
    assert json.loads((root / "cli/specforge-dflash/specwire_export.json").read_text())[
        "layer_ids"] == [1, 3]  # from the drafter's config


def expected_tensors(server, rows) -> dict[str, list[dict[str, str]]]:
    """What each trainer's reader must return for each row, from a plain Extract (bf16)."""
    out: dict[str, list[dict[str, str]]] = {k: [] for k in (
        "specforge-dflash", "specforge-eagle3", "speculators-dflash", "speculators-eagle3")}
    with ExtractorClient(server.address, timeout=60) as c:
        states = c.extract([r["input_ids"] for r in rows], [0, 1, 2, 3], final_norm=True,
                           dtype="bf16")
    left_out = untrainable("specforge", "dflash", rows)
    for i, (r, s) in enumerate(zip(rows, states)):
        ids = torch.tensor(r["input_ids"], dtype=torch.long)
        mask = torch.tensor(r["loss_mask"], dtype=torch.long)
        cat = lambda ks: torch.cat([s[f"layer.{k}"] for k in ks], dim=-1)  # noqa: E731
        if i not in left_out:
            # SpecForge's id 3 = L - 1 is hidden_states[4], the final-norm output.
            both = torch.cat([s["layer.1"], s["final_norm"]], dim=-1)
            out["specforge-dflash"].append({"input_ids": digest(ids[None]),
                                            "loss_mask": digest(mask[None]),
                                            "hidden_states": digest(both[None])})
        eagle_mask = mask.clone()
        eagle_mask[-1] = 0  # SpecForge's reader drops the last position's loss
        out["specforge-eagle3"].append({
            "attention_mask": digest(torch.ones_like(mask)[None]),
            "loss_mask": digest(eagle_mask[None]), "target": digest(s["final_norm"][None]),
            "hidden_state": digest(cat([0, 1, 2])[None]), "input_ids": digest(ids[None])})
        for lay, ks in (("dflash", [1, 3]), ("eagle3", [0, 1, 2])):
            out[f"speculators-{lay}"].append({
                "hidden_states": digest(cat(ks)), "input_ids": digest(ids),
                "verifier_last_hidden_states": digest(s["layer.3"]), "loss_mask": digest(mask),
                "lengths": digest(torch.tensor([len(ids)])),
                "position_ids": digest(torch.arange(len(ids)))})
    return out


@pytest.mark.skipif(not ORACLES.is_dir(), reason="scripts/setup.sh installs .venv/trainer-oracles")
def test_trainers_read_and_train_on_the_export(exports, server, tmp_path):
    root, rows = exports
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ORACLES), *sys.path]),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("trainer_readers.py")),
                        str(root / "cli"), str(TARGET), str(DRAFTER), str(out)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    want = expected_tensors(server, rows)
    for name, expected in want.items():
        assert report[name]["tensors"] == expected, name
    left_out = untrainable("specforge", "dflash", rows)
    assert left_out  # the generated rows include some
    assert report["specforge-dflash"]["files"] == [f"data_{i:08d}.ckpt" for i in range(len(rows))
                                                   if i not in left_out]
    assert {s["hidden_states"][0] for s in report["specforge-dflash"]["specs"]} == {"bfloat16"}
    assert report["speculators-dflash"]["approx_lengths"] == [len(r["input_ids"]) for r in rows]
    for name in ("specforge-dflash", "speculators-eagle3"):
        losses = report[name]["losses"]
        assert len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses), name
    # The states are the ones each trainer's head expects: SpecForge projects the final-norm
    # state with the bare lm_head, speculators norms the last layer's output first. bf16 states.
    for name in ("specforge-eagle3", "speculators-eagle3"):
        assert report[name]["logits_max_abs_diff"] < 0.1, (name, report[name])


def cli_export(server, tmp_path, lines, *args):
    data = tmp_path / "in.jsonl"
    data.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return subprocess.run([str(CLI()), "export", "--extractor", server.address,
                           "--dataset", str(data), "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("lines,args,code,message", [
    ([{"input_ids": [1, 2]}, {"input_ids": [3]}, {"messages": [{"role": "user", "content": "x"}]}],
     ("--format", "specforge", "--layout", "dflash", "--layers", "1"), 2, ":3: has messages"),
    ([{"input_ids": [1, 2, 3], "loss_mask": [1, 1]}],
     ("--format", "specforge", "--layout", "dflash", "--layers", "1"), 2,
     "loss_mask has 2 entries for 3 input_ids"),
    ([{"input_ids": [1, 2], "loss_mask": [0, 2]}],
     ("--format", "speculators", "--layout", "dflash", "--layers", "1"), 2, "0 or 1"),
    ([{"input_ids": [1, "x"]}], ("--format", "specforge", "--layout", "dflash", "--layers", "1"),
     2, "input_ids holds \"x\""),
    (["not json"], ("--format", "specforge", "--layout", "dflash", "--layers", "1"), 2,
     ":1: not a JSON object"),
    ([{"input_ids": []}], ("--format", "specforge", "--layout", "dflash", "--layers", "1"), 2,
     "input_ids is empty"),
    ([{"input_ids": [1]}], ("--format", "safetensors", "--layout", "dflash"), 2, "--format"),
    ([{"input_ids": [1]}], ("--format", "specforge", "--layout", "medusa"), 2, "--layout"),
    ([{"input_ids": [1]}], ("--format", "specforge", "--layout", "eagle3"), 1,
     "EAGLE-3's default aux layers [1, 1, 0] do not fit a 4-layer target"),
    ([{"input_ids": [1]}], ("--format", "specforge", "--layout", "dflash"), 1,
     "a dflash export needs the drafter's layers"),
    ([{"input_ids": [1]}], ("--format", "specforge", "--layout", "dflash", "--layers", "9"), 1,
     "9 is outside the target's layers 0..3"),
    ([{"input_ids": [1]}], ("--format", "specforge", "--layout", "eagle3", "--layers", "0,1"), 1,
     "exactly three"),
    ([{"input_ids": [1]}], ("--format", "specforge", "--layout", "dflash", "--layers", "1,1"), 1,
     "repeats a layer"),
    ([{"input_ids": [5000]}], ("--format", "specforge", "--layout", "dflash", "--layers", "1"), 1,
     "INVALID_ARGUMENT"),
])
def test_cli_refuses_bad_input(server, tmp_path, lines, args, code, message):
    r = cli_export(server, tmp_path, lines, *args)
    assert r.returncode == code, r.stderr
    assert message in r.stderr, r.stderr
    assert not (tmp_path / "out" / "specwire_export.json").exists()


@pytest.mark.parametrize("samples,kwargs,message", [
    ([{"messages": [{"role": "user", "content": "x"}]}], {}, "sample 0: has messages"),
    ([[1, 2], {"input_ids": [1, 2], "loss_mask": [1]}], {}, "sample 1: loss_mask has 1"),
    ([[1, True]], {}, "not an integer"),
    ([[1, -2]], {}, "negative"),
    ([[1]], {"layout": "eagle3"}, "default aux layers"),
    ([[1]], {"layer_ids": [4]}, "outside the target's layers 0..3"),
    ([[1]], {"format": "parquet"}, "format"),
    ([], {}, "nothing to export"),
])
def test_python_export_refuses_bad_input(server, tmp_path, samples, kwargs, message):
    args = {"format": "specforge", "layout": "dflash", "layer_ids": None
            if kwargs.get("layout") == "eagle3" else [1], **kwargs}
    with pytest.raises(ValueError, match=None) as e:
        export_features(server.address, samples, tmp_path / "out", **args)
    assert message in str(e.value)
    assert not (tmp_path / "out" / "specwire_export.json").exists()


def test_python_export_takes_the_drafters_layers(server, tmp_path):
    cfg = json.loads((DRAFTER / "config.json").read_text())
    s = export_features(server.address, [[1, 2, 3]], tmp_path / "out", format="specforge",
                        layout="dflash", drafter_config=cfg)
    assert s.manifest["layer_ids"] == [1, 3]
    t = torch.load(tmp_path / "out" / "data_00000000.ckpt", weights_only=False)
    assert t["hidden_states"].shape == (3, 2 * 128) and t["hidden_states"].dtype == torch.bfloat16


def test_python_command_line_writes_what_the_cli_writes(exports, server, tmp_path):
    root, rows = exports
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "specwire_client.export", "--extractor",
                        server.address, "--dataset", str(root / "prepared.jsonl"), "--format",
                        "speculators", "--layout", "dflash", "--drafter", str(DRAFTER), "--out",
                        str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"wrote {len(rows)} samples" in r.stdout
    for i in range(len(rows)):
        a = load_file(out / "hidden_states" / f"hs_{i}.safetensors")
        b = load_file(root / "cli" / "speculators-dflash" / "hidden_states" / f"hs_{i}.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a) and a.keys() == b.keys()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2]}\n{"input_ids": [1], "loss_mask": [1, 1]}\n')
    r = subprocess.run([sys.executable, "-m", "specwire_client.export", "--extractor",
                        server.address, "--dataset", str(bad), "--format", "specforge",
                        "--layout", "dflash", "--layers", "1", "--out", str(tmp_path / "o2")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "sample 1: loss_mask has 2 entries for 1 input_ids" in r.stderr
