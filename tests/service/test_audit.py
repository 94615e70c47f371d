"""specwire_client.audit against features made the other ways people make them: transformers'
output_hidden_states of the tiny target (fp32 and bf16), vLLM-style hs files with their
hidden-state index convention, SpecForge records, specwire's own exports; and the failure
classes seen in the field reproduced on purpose: layer ids off by one, a last state before or
after the final norm against its declaration, aux layers concatenated in another order, another
checkpoint of the same shape, other token ids (another thinking flag)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from specwire_client import ChatTemplate
from specwire_client.audit import (audit_features, capture_hidden_states, read_features,
                                   read_hf)
from specwire_client.chat import tokenizer_encoder
from specwire_client.export import export_features

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "tiny-qwen3"  # 4 layers, hidden 128, vocab 2048
L = 4


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(TARGET, dtype="float32")


@pytest.fixture(scope="module")
def sequences():
    rng = random.Random(11)
    return [[rng.randrange(2048) for _ in range(n)] for n in (1, 5, 23, 64)]


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def captures(hf_model, sequences, tmp_path_factory):
    """transformers' hidden states of every sequence (hidden_states.0..4, the last post-norm)."""
    d = tmp_path_factory.mktemp("hf")
    for i, s in enumerate(sequences):
        capture_hidden_states(hf_model, s, d / f"seq{i:02d}.safetensors")
    return d


def levels(report):
    return {(t.name, m.slice): m.level for s in report.samples for t in s.tensors
            for m in t.slices}


def findings(report):
    return [f for s in report.samples for t in s.tensors for f in t.findings]


def test_transformers_capture_is_canonical(server, captures):
    report = audit_features(server.address, read_features(captures))
    assert report.ok, report.table()
    for s in report.samples:
        assert [m.tap for t in s.tensors for m in t.slices] == [
            "embedding", "layer.0", "layer.1", "layer.2", "final_norm"]
        assert all(m.rel_l2 <= 1e-5 for t in s.tensors for m in t.slices)


def test_layer_hooks_name_the_tap_each_module_outputs(server, hf_model, sequences, tmp_path):
    """Forward hooks on a model's own modules (no output_hidden_states): the audit says which
    canonical tap each one holds. transformers' decoder layer k outputs layer.k; its final norm
    module outputs final_norm; the embedding module the embedding."""
    m = hf_model.model
    hooks = {"embed": m.embed_tokens, "layer0": m.layers[0], "layer3": m.layers[3],
             "norm": m.norm}
    for i, s in enumerate(sequences):
        capture_hidden_states(hf_model, s, tmp_path / f"seq{i}.safetensors", hooks=hooks)
    report = audit_features(server.address, read_hf(tmp_path))
    assert report.ok, report.table()
    for s in report.samples:
        assert {t.name: t.slices[0].tap for t in s.tensors} == {
            "hook.embed": "embedding", "hook.layer0": "layer.0", "hook.layer3": "layer.3",
            "hook.norm": "final_norm"}


def test_bf16_capture_is_rounding_level(server, hf_model, sequences, tmp_path):
    bf16 = AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.bfloat16).eval()
    for i, s in enumerate(sequences):
        capture_hidden_states(bf16, s, tmp_path / f"seq{i}.safetensors")
    report = audit_features(server.address, read_hf(tmp_path))
    assert report.ok, report.table()
    assert set(levels(report).values()) <= {"identical", "rounding"}
    assert any(v == "rounding" for v in levels(report).values())


def vllm_file(captures: Path, out: Path, indices: list[int]) -> None:
    """A vLLM extract_hidden_states-style file stacking transformers' hidden_states[i]."""
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import load_file
    for i, f in enumerate(sorted(captures.glob("*.safetensors"))):
        raw = load_file(str(f))
        save_file({"hidden_states": torch.stack([raw[f"hidden_states.{j}"] for j in indices], 1)
                   .contiguous(), "token_ids": raw["token_ids"]}, str(out / f"hs_{i}.safetensors"))


def test_layer_ids_off_by_one(server, captures, tmp_path):
    vllm_file(captures, tmp_path, [1, 3])
    good = audit_features(server.address, read_features(tmp_path, "vllm", layer_ids=[1, 3],
                                                        num_layers=L))
    assert good.ok, good.table()
    bad = audit_features(server.address, read_features(tmp_path, "vllm", layer_ids=[2, 4],
                                                       num_layers=L))
    assert not bad.ok
    page = bad.html()
    assert page.count("<svg") == 2 and "FAIL" in page and "off by -1" in page
    f = findings(bad)
    assert any("declared layer.1 (hidden_states[2]), holds layer.0 (hidden_states[1]): the layer "
               "ids are off by -1" in x for x in f), f


def test_last_state_after_the_norm_where_vllm_means_before(server, captures, tmp_path):
    # transformers' hidden_states[4] is after the final norm; vLLM's index 4 is before it.
    vllm_file(captures, tmp_path, [2, 4])
    report = audit_features(server.address, read_features(tmp_path, "vllm", layer_ids=[2, 4],
                                                          num_layers=L))
    assert not report.ok
    assert all(m.tap == "final_norm" for s in report.samples for m in s.tensors[1].slices)
    assert any("declared the last layer's raw output, holds it after the final norm" in x
               for x in findings(report))


def test_specforge_record_pre_norm_and_concatenation_order(server, captures, tmp_path):
    from safetensors.torch import load_file
    for i, f in enumerate(sorted(captures.glob("*.safetensors"))):
        raw = load_file(str(f))
        ids = raw["token_ids"]
        # An EAGLE-3 record whose hidden_state is the last layer before the norm (declared
        # after it) and whose aux layers [0, 1, 2] were concatenated as [2, 0, 1].
        aux = torch.cat([raw["hidden_states.3"], raw["hidden_states.1"], raw["hidden_states.2"]],
                        -1)
        hf_l3 = raw["hidden_states.4"]  # post-norm; the pre-norm one comes from the server below
        torch.save({"input_ids": ids, "loss_mask": torch.ones_like(ids),
                    "hidden_state": hf_l3[None], "aux_hidden_state": aux[None]},
                   tmp_path / f"data_{i:08d}.ckpt")
    report = audit_features(server.address, read_features(tmp_path, layer_ids=[0, 1, 2],
                                                          num_layers=L))
    f = findings(report)
    assert any("the slices hold ['layer.2', 'layer.0', 'layer.1']: the declared ['layer.0', "
               "'layer.1', 'layer.2'] concatenated in another order" in x for x in f), f
    # hidden_state was post-norm as declared: no finding on it.
    assert all(not t.findings for s in report.samples for t in s.tensors
               if t.name == "hidden_state")

    # The same record with a pre-norm last state: named.
    with __import__("specwire_client").ExtractorClient(server.address, timeout=30) as c:
        for i, f_ in enumerate(sorted(tmp_path.glob("*.ckpt"))):
            rec = torch.load(f_, weights_only=True)
            pre = c.extract([rec["input_ids"].tolist()], [L - 1], dtype="fp32")[0][f"layer.{L - 1}"]
            rec["hidden_state"] = pre[None]
            torch.save(rec, f_)
    report = audit_features(server.address, read_features(tmp_path, layer_ids=[0, 1, 2],
                                                          num_layers=L))
    assert any("declared after the final norm, holds the last layer's output before it" in x
               for x in findings(report))


def test_specforge_online_capture_files_written_by_specforge(server, sequences, tmp_path):
    """SpecForge's own writer (verify_capture, its feature store's dump_dir) on transformers'
    states: the EAGLE-3 (hidden_state = aux concatenation, target = final-norm state) and DFlash
    dumps of an online capture read and audit as canonical; declared one id off, they do not."""
    import os
    (tmp_path / "seqs.json").write_text(json.dumps(sequences))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / ".venv" / "trainer-oracles"), *sys.path]), OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, str(REPO / "tests" / "service" / "specforge_writer.py"),
                           str(TARGET), str(tmp_path / "seqs.json"), str(tmp_path / "sf"),
                           "0,1,2"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"eagle3": len(sequences),
                                                        "dflash": len(sequences)}
    for kind in ("eagle3", "dflash"):
        samples = read_features(tmp_path / "sf" / kind, layer_ids=[0, 1, 2], num_layers=L)
        assert sorted(len(s.token_ids) for s in samples) == sorted(len(s) for s in sequences)
        names = {t.name for s in samples for t in s.tensors}
        assert names == ({"hidden_state", "target"} if kind == "eagle3" else {"hidden_states"})
        report = audit_features(server.address, samples)
        assert report.ok, (kind, report.table())
        assert set(levels(report).values()) <= {"identical", "rounding"}, kind
        off = audit_features(server.address, read_features(tmp_path / "sf" / kind,
                                                           layer_ids=[1, 2, 3], num_layers=L))
        assert not off.ok and any("off by -1" in x or "off by 1" in x for x in findings(off)), \
            findings(off)


def test_another_checkpoint_of_the_same_shape(server, sequences, tmp_path):
    other = AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()
    with torch.no_grad():
        w = other.model.layers[1].mlp.down_proj.weight
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(3)) * w.std())
    for i, s in enumerate(sequences[1:]):
        capture_hidden_states(other, s, tmp_path / f"seq{i}.safetensors")
    report = audit_features(server.address, read_hf(tmp_path))
    assert not report.ok
    for s in report.samples:
        got = {t.name: t.level for t in s.tensors}
        assert got["hidden_states.0"] == "identical" and got["hidden_states.1"] == "rounding"
        assert got["hidden_states.2"] == "mismatch", report.table()
    assert any("matches no tap" in x and "other weights or another forward" in x
               for x in findings(report))


def test_specwire_exports_audit_clean(server, sequences, tmp_path):
    for fmt, lay, ids in (("specforge", "dflash", [1, 3]), ("specforge", "eagle3", [0, 1, 2]),
                          ("speculators", "dflash", [1, 3]), ("speculators", "eagle3", [0, 1, 2])):
        out = tmp_path / f"{fmt}-{lay}"
        export_features(server.address, [{"input_ids": s, "loss_mask": [1] * len(s)}
                                          for s in sequences], out, format=fmt, layout=lay,
                        layer_ids=ids)
        report = audit_features(server.address, read_features(out))
        assert report.ok, (fmt, lay, report.table())
        # bf16 files: exactly the canonical fp32 states rounded to bf16.
        assert set(levels(report).values()) == {"identical"}, (fmt, lay)


def test_token_ids_from_another_thinking_flag(server, tmp_path):
    template = ChatTemplate((REPO / "tests/data/chat_templates/qwen3.jinja").read_text(), "qwen3",
                            {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
    encode = tokenizer_encoder(TARGET / "tokenizer.json")
    messages = [{"role": "user", "content": "def add(a, b):"}]
    ids_on, _ = encode(template.render(messages, add_generation_prompt=True,
                                       enable_thinking=True))
    ids_off, _ = encode(template.render(messages, add_generation_prompt=True,
                                        enable_thinking=False))
    assert ids_on != ids_off
    out = tmp_path / "x"
    export_features(server.address, [ids_on], out, format="speculators", layout="dflash",
                    layer_ids=[1, 3])
    (tmp_path / "expected.jsonl").write_text(json.dumps({"input_ids": ids_off}) + "\n")
    r = subprocess.run([sys.executable, "-m", "specwire_client.audit", "--extractor",
                        server.address, "--features", str(out), "--expected",
                        str(tmp_path / "expected.jsonl"), "--json", str(tmp_path / "r.json"),
                        "--html", str(tmp_path / "r.html")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    n = next((i for i, (a, b) in enumerate(zip(ids_on, ids_off)) if a != b),
             min(len(ids_on), len(ids_off)))  # enable_thinking=False adds an empty think block
    assert f"token ids differ at position {n}" in r.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is False and report["samples"][0]["tokens"]["first_difference"] == n
    assert f"first difference at position {n}" in (tmp_path / "r.html").read_text()
    # The states themselves are canonical (for the ids that were used).
    assert all(t["level"] == "identical" for t in report["samples"][0]["tensors"])


def test_command_line_passes_clean_features_and_refuses_unknown_layouts(server, captures,
                                                                        tmp_path):
    # The console script the package installs runs the same main().
    ok = subprocess.run([str(Path(sys.executable).with_name("specwire-audit")), "--extractor",
                         server.address, "--features", str(captures)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verdict: every tensor is the canonical state" in ok.stdout
    (tmp_path / "notes.txt").write_text("x")
    bad = subprocess.run([sys.executable, "-m", "specwire_client.audit", "--extractor",
                          server.address, "--features", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no known feature layout" in bad.stderr
    save_file({"hidden_states": torch.zeros(3, 2, 128)}, str(tmp_path / "hs_0.safetensors"))
    bad = subprocess.run([sys.executable, "-m", "specwire_client.audit", "--extractor",
                          server.address, "--features", str(tmp_path / "hs_0.safetensors")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expected hidden_states [T, n, H] and token_ids" in bad.stderr


@pytest.fixture(scope="module")
def trajectories(server):
    """The target's greedy completions of held-out prompts (what the scorer replays), with the
    raw output of the last layer (the state before the final norm). 256 tokens: long enough
    for the smallest failure class's Δτ interval to leave 0."""
    from specwire_client import ExtractorClient
    prompts = [json.loads(line)["prompt"] for line in
               (REPO / "models" / "heldout_prompts.jsonl").read_text().splitlines()[:24]]
    with ExtractorClient(server.address, timeout=120) as c:
        return c.generate(prompts, 256, ignore_model_eos=True, layer_ids=[L - 1], dtype="fp32")


def test_acceptance_impact_of_each_failure_class(server, hf_model, trajectories):
    """The committed drafter reads ids [1, 3] = hidden_states[2] and [4] (the final norm's
    output). Measured on this tiny pair (24 prompts x 256 tokens): rounding-level features cost
    nothing; ids off by one cost ~0.5 of τ, aux layers in another order ~1.4; a pre-norm last
    state ~0.4 (this 4-layer target's neighbouring states are alike: the smallest effect, whose
    interval leaves 0 only with trajectories this long; at 96 tokens it still touched 0)."""
    from extractor_harness import build_dir

    from specwire_client.audit import acceptance_impact
    replay = build_dir() / "services" / "scorer" / "specwire-replay"
    drafter = REPO / "models" / "tiny-qwen3-dflash"
    traj = [(r.token_ids, len(r.prompt_ids)) for r in trajectories]
    with torch.no_grad():
        hs = [hf_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
              for ids, _ in traj]

    def impact(pick):
        return acceptance_impact(server.address, drafter, TARGET, traj,
                                 [pick(h, r) for h, r in zip(hs, trajectories)], replay=replay)

    same = impact(lambda h, r: torch.cat([h[2][0], h[4][0]], -1))  # transformers' capture
    rounded = impact(lambda h, r: torch.cat([h[2][0], h[4][0]], -1).bfloat16())
    shifted = impact(lambda h, r: torch.cat([h[1][0], h[3][0]], -1))
    pre_norm = impact(lambda h, r: torch.cat([h[2][0], r.states[f"layer.{L - 1}"]], -1))
    swapped = impact(lambda h, r: torch.cat([h[4][0], h[2][0]], -1))
    print(f"\nacceptance impact (24 prompts x 256 tokens): transformers fp32 {same.verdict()}; "
          f"bf16 {rounded.verdict()}; ids off by one {shifted.verdict()}; pre-norm last state "
          f"{pre_norm.verdict()}; layers swapped {swapped.verdict()}")
    for r in (same, rounded):
        assert r.delta_tau_ci is not None and r.delta_tau_ci[0] <= 0 <= r.delta_tau_ci[1], r
        assert r.tau_canonical > 2, r
    assert all(r.tau_canonical == same.tau_canonical for r in (shifted, pre_norm, swapped))
    assert shifted.delta_tau < -0.2 and shifted.delta_tau_ci[1] < 0, shifted
    assert pre_norm.delta_tau < -0.2 and pre_norm.delta_tau_ci[1] < 0, pre_norm
    assert swapped.delta_tau < -0.5 and swapped.delta_tau_ci[1] < 0, swapped
    assert "cost acceptance" in swapped.verdict()


def test_command_line_acceptance_impact(server, trajectories, tmp_path):
    from extractor_harness import build_dir
    rows = [{"input_ids": r.token_ids} for r in trajectories[:8]]
    export_features(server.address, rows, tmp_path / "x", format="specforge", layout="dflash",
                    layer_ids=[1, 3])
    r = subprocess.run([sys.executable, "-m", "specwire_client.audit", "--extractor",
                        server.address, "--features", str(tmp_path / "x"), "--drafter",
                        str(REPO / "models" / "tiny-qwen3-dflash"), "--target_checkpoint",
                        str(TARGET), "--prompt_len",
                        json.dumps([len(t.prompt_ids) for t in trajectories[:8]]), "--replay",
                        str(build_dir() / "services" / "scorer" / "specwire-replay"), "--json",
                        str(tmp_path / "r.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Δτ +0.000 [+0.000, +0.000]: within its interval of 0" in r.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["acceptance"]["delta_tau"] == 0 and report["acceptance"]["prompts"] == 8


@pytest.mark.parametrize("tensors,cases,message", [
    ({"case.0.canonical": torch.zeros(4, 256)}, [{"trajectory": [1, 2, 3, 4], "prompt_len": 2}],
     "case.0.foreign missing"),
    ({"case.0.canonical": torch.zeros(4, 256), "case.0.foreign": torch.zeros(4, 128)},
     [{"trajectory": [1, 2, 3, 4], "prompt_len": 2}],
     "case.0.foreign has shape [4, 128]; the drafter reads [4, 256]"),
    ({"case.0.canonical": torch.zeros(4, 256), "case.0.foreign": torch.zeros(4, 256)},
     [{"trajectory": [1, 2, 3, 4], "prompt_len": 4}], "prompt_len: 4 must lie in [1, 3]"),
    ({"case.0.canonical": torch.zeros(1, 256)}, [], "must be a non-empty JSON list"),
])
def test_replay_features_refuses_bad_cases(tmp_path, tensors, cases, message):
    from extractor_harness import build_dir
    path = tmp_path / "cases.safetensors"
    save_file(tensors, str(path), metadata={"cases": json.dumps(cases)})
    r = subprocess.run([str(build_dir() / "services" / "scorer" / "specwire-replay"), "features",
                        "--drafter", str(REPO / "models" / "tiny-qwen3-dflash"),
                        "--target_checkpoint", str(TARGET), "--cases", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.fixture(scope="module")
def vlm_checkpoint(tmp_path_factory):
    """A Qwen3.5 hybrid packaged as a vision-language model (model.language_model.*, a vision
    tower, MTP tensors), as the tiny parity fixtures make it."""
    import hybrid_fixtures
    model = hybrid_fixtures.random_causal_lm("interval4", 0)
    return hybrid_fixtures.save_vlm(model, tmp_path_factory.mktemp("vlm") / "ckpt")


@pytest.fixture(scope="module")
def vlm_server(server_factory, vlm_checkpoint):
    return server_factory(vlm_checkpoint, dtype="float32")


HYBRID_SEQUENCES = [[(7 * i + 3) % 512 for i in range(n)] for n in (80, 150)]


def test_vision_language_class_sees_the_same_text_features(vlm_server, vlm_checkpoint, tmp_path):
    """The incident class "evaluation loaded the VLM class, training the CausalLM class": with
    transformers 5.23 and text-only input, AutoModel (the VLM class, layers under
    model.language_model) and AutoModelForCausalLM compute the same hidden states bit for bit,
    and both are specwire's canonical ones (what is true here; a different transformers or a
    checkpoint whose language weights differ by packaging would show up as a mismatch)."""
    import transformers
    for cls in (transformers.AutoModel, transformers.AutoModelForCausalLM):
        model = cls.from_pretrained(vlm_checkpoint, dtype=torch.float32).eval()
        d = tmp_path / cls.__name__
        d.mkdir()
        for i, s in enumerate(HYBRID_SEQUENCES):
            capture_hidden_states(model, s, d / f"seq{i}.safetensors")
    from safetensors.torch import load_file
    for i in range(len(HYBRID_SEQUENCES)):
        a = load_file(tmp_path / "AutoModel" / f"seq{i}.safetensors")
        b = load_file(tmp_path / "AutoModelForCausalLM" / f"seq{i}.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("AutoModel", "AutoModelForCausalLM"):
        report = audit_features(vlm_server.address, read_hf(tmp_path / name))
        assert report.ok, (name, report.table())


def test_linear_attention_kernel_rounding_or_drift(vlm_server, vlm_checkpoint, tmp_path,
                                                   monkeypatch):
    """Another chunking of the gated delta rule (what a different kernel does: the same math,
    other rounding) is rounding-level; a kernel whose output is 0.2 % off is drift, named."""
    import transformers
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    original = mq.torch_chunk_gated_delta_rule
    model = transformers.AutoModelForCausalLM.from_pretrained(vlm_checkpoint,
                                                              dtype=torch.float32).eval()

    def capture(tag, rule):
        monkeypatch.setattr(mq, "torch_chunk_gated_delta_rule", rule)
        d = tmp_path / tag
        d.mkdir()
        for i, s in enumerate(HYBRID_SEQUENCES):
            capture_hidden_states(model, s, d / f"seq{i}.safetensors")
        return audit_features(vlm_server.address, read_hf(d))

    def rechunked(*a, **k):
        k["chunk_size"] = 32
        return original(*a, **k)

    def off(*a, **k):
        out, state = original(*a, **k)
        return out * 1.002, state

    same_math = capture("chunk32", rechunked)
    assert same_math.ok, same_math.table()
    assert set(levels(same_math).values()) <= {"identical", "rounding"}
    drift = capture("off", off)
    assert not drift.ok
    got = levels(drift)
    assert got[("hidden_states.0", 0)] == "identical"  # the embedding does not go through it
    assert "drift" in got.values() and "mismatch" not in got.values(), drift.table()
