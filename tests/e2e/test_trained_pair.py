"""The committed trained pair end to end: models/tiny-qwen3 (target) + models/tiny-qwen3-dflash
(DFlash drafter, B=16) on the held-out prompts of models/heldout_prompts.jsonl.

1. Tokenizer: the C++ tokenizer (specwire-tokenize) encodes the prompts and held-out corpus
   text exactly as Hugging Face `tokenizers` does with the committed tokenizer.json.
2. Scoring: specwire-score (in-process scorer) on the JSONL prompts against a started
   specwire-extractor (which tokenizes them) gives, for every prompt, the same prompt and
   completion lengths and the same acceptance length at every step as dflash's own loop
   (dflash_generate, transformers target, HF-tokenized prompts); the trained drafter reaches τ >= 2.0 (mean of per-response means, greedy, B=16).
3. Hybrid: the committed tiny-qwen3_5 (Gated DeltaNet + gated attention) through the extractor:
   hidden states of every layer within 1e-5 (relative, fp32) of transformers and the same
   greedy tokens.
4. training/train_drafter.py runs against the extractor (a few steps) and saves a drafter in
   dflash's format.

Everything runs in float32 (the bf16 checkpoints upcast exactly on both sides). Run time: about
half a minute on two cores.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from extractor_harness import THREADS, ExtractorServer, build_dir
from scorer_harness import scorer_binary
from tokenizers import Tokenizer

import dflash_fixtures as F
from hf_fixtures import load_hf_model, rel_err
from shipped_models import DRAFTER, HYBRID, MODELS, PROMPTS, REPO, TARGET

DRAFTER2 = MODELS / "tiny-qwen3-dflash2"
MAX_NEW_TOKENS = 96
DDTREE = 8
TAU_GOAL = 2.0


@pytest.fixture(scope="module")
def hf_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TARGET / "tokenizer.json"))


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line]
    assert 16 <= len(texts) <= 32
    return [e.ids for e in hf_tokenizer.encode_batch(texts, add_special_tokens=False)]


def test_cpp_tokenizer_matches_hf(hf_tokenizer):
    sys.path.insert(0, str(REPO / "training"))
    import corpus
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line]
    for name in corpus.split(heldout=True):  # held-out sources in pieces of up to 2,000 chars
        text = corpus.read(name)[:8000]
        texts += [text[i:i + 2000] for i in range(0, len(text), 2000)]
    exe = build_dir() / "services" / "extractor" / "specwire-tokenize"
    if not exe.exists():
        pytest.fail(f"{exe} not built (set SPECWIRE_BUILD_DIR)", pytrace=False)
    stdin = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    res = subprocess.run([str(exe), "--tokenizer", str(TARGET / "tokenizer.json")], input=stdin,
                         capture_output=True, text=True, encoding="utf-8", timeout=120)
    assert res.returncode == 0, res.stderr
    ours = [json.loads(line)["ids"] for line in res.stdout.splitlines() if line]
    want = [e.ids for e in hf_tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert len(ours) == len(want)
    bad = [i for i, (o, w) in enumerate(zip(ours, want)) if o != w]
    assert not bad, f"{len(bad)} of {len(texts)} texts encode differently, first: {texts[bad[0]]!r}"
    mask = hf_tokenizer.encode("x<|MASK|>y", add_special_tokens=False).ids
    assert hf_tokenizer.token_to_id("<|MASK|>") in mask


@pytest.fixture(scope="module")
def report(extractor, tmp_path_factory) -> dict:
    """specwire-score in-process on the JSONL prompt set as the demo runs it: text prompts,
    tokenized by the extractor."""
    root = tmp_path_factory.mktemp("score")
    res = subprocess.run(
        [str(scorer_binary("specwire-score")), f"--extractor={extractor.address}",
         f"--drafter={DRAFTER}", f"--dataset={PROMPTS}",
         f"--max_new_tokens={MAX_NEW_TOKENS}", f"--ddtree={DDTREE}", "--dtype=float32",
         f"--threads={THREADS}", "--cache_dir=none", f"--target_checkpoint={TARGET}",
         f"--json_out={root / 'report.json'}", "--quiet"],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    print(res.stdout)
    return json.loads((root / "report.json").read_text())


def test_scoring_matches_dflash_loop_and_reaches_tau(report, prompts):
    drafter = F.load_drafter(DRAFTER)
    target = load_hf_model(TARGET, torch.float32)
    eos = target.generation_config.eos_token_id
    assert drafter.block_size == 16 and report["summary"]["block_size"] == 16
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = [F.dflash_reference(drafter, target, p, MAX_NEW_TOKENS, [eos]) for p in prompts]
    finally:
        torch.set_num_threads(saved)
    ours = sorted(report["prompts"], key=lambda p: p["prompt_index"])
    assert len(ours) == len(prompts)
    for i, (got, (completion, lengths)) in enumerate(zip(ours, ref)):
        assert got["prompt_tokens"] == len(prompts[i]), f"prompt {i}: tokenized differently"
        assert got["step_lengths"] == lengths, (
            f"prompt {i}: step lengths differ\n ours   {got['step_lengths']}\n dflash {lengths}")
        assert got["completion_tokens"] == len(completion), f"prompt {i}"
    tau = float(np.mean([np.mean(lengths) for _, lengths in ref]))
    summary = report["summary"]
    assert summary["tau_mean_of_means"] == pytest.approx(tau, rel=1e-12)
    print(f"tau {tau:.3f} (pooled {summary['tau_pooled']:.3f}) over {summary['steps']} steps, "
          f"DDTree-{DDTREE} {summary['ddtree_tau']}")
    assert tau >= TAU_GOAL


def test_dflash2_scoring_matches_dflash_loop(extractor, prompts, tmp_path):
    """The committed DFlash2 drafter (z-lab's DFlash2DraftModel format): specwire-score's step
    lengths equal dflash's own loop with its candidate selector, prompt by prompt."""
    from dflash.model import DFlash2DraftModel
    n = 8  # prompts: dflash's loop walks the selector in Python
    tokens = tmp_path / "prompts.json"
    tokens.write_text(json.dumps(prompts[:n]))
    res = subprocess.run(
        [str(scorer_binary("specwire-score")), f"--extractor={extractor.address}",
         f"--drafter={DRAFTER2}", f"--prompts_file={tokens}",
         f"--max_new_tokens={MAX_NEW_TOKENS}", "--dtype=float32", f"--threads={THREADS}",
         "--cache_dir=none", f"--target_checkpoint={TARGET}",
         f"--json_out={tmp_path / 'report.json'}", "--quiet"],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["labels"]["method"] == "dflash2"
    drafter = DFlash2DraftModel.from_pretrained(DRAFTER2, dtype=torch.float32).eval()
    target = load_hf_model(TARGET, torch.float32)
    eos = target.generation_config.eos_token_id
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = [F.dflash_reference(drafter, target, p, MAX_NEW_TOKENS, [eos]) for p in prompts[:n]]
    finally:
        torch.set_num_threads(saved)
    ours = sorted(report["prompts"], key=lambda p: p["prompt_index"])
    for i, (got, (completion, lengths)) in enumerate(zip(ours, ref)):
        assert got["step_lengths"] == lengths, (
            f"prompt {i}: step lengths differ\n ours   {got['step_lengths']}\n dflash {lengths}")
    assert report["summary"]["tau_mean_of_means"] >= TAU_GOAL


@pytest.fixture(scope="module")
def hybrid_extractor(tmp_path_factory):
    server = ExtractorServer(HYBRID, tmp_path_factory.mktemp("hybrid"), dtype="float32",
                             metrics=False).start()
    yield server
    server.stop()


def test_hybrid_states_and_greedy_match_transformers(hybrid_extractor, prompts):
    from specwire_client import ExtractorClient
    hf = load_hf_model(HYBRID, torch.float32)
    layers = hf.config.num_hidden_layers
    assert "linear_attention" in hf.config.layer_types
    assert "full_attention" in hf.config.layer_types
    seqs = prompts[:4]
    with ExtractorClient(hybrid_extractor.address, timeout=120) as client:
        states = client.extract(seqs, layer_ids=list(range(layers)), final_norm=True,
                                dtype="fp32")
        greedy = client.generate(seqs[:2], 24, ignore_model_eos=True)
    with torch.no_grad():
        for seq, got in zip(seqs, states):
            out = hf(torch.tensor([seq]), output_hidden_states=True, use_cache=False)
            for k in range(layers - 1):  # layer k = hidden_states[k + 1]
                err = rel_err(got[f"layer.{k}"], out.hidden_states[k + 1][0])
                assert err <= 1e-5, f"layer {k}: relative error {err:.2e}"
            err = rel_err(got["final_norm"], out.hidden_states[layers][0])
            assert err <= 1e-5, f"final norm: relative error {err:.2e}"
        for seq, gen in zip(seqs, greedy):  # the recurrent decode path (conv + delta states)
            ids = torch.tensor([seq])
            want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=24, min_new_tokens=24, eos_token_id=None,
                               pad_token_id=0)[0, len(seq):].tolist()
            assert gen.completion_ids == want


def test_train_drafter_script_against_the_extractor(extractor, tmp_path):
    """training/train_drafter.py, the example pipeline, end to end in miniature against a running
    extractor: Generate, FeatureDataset, a few DFlash steps, a drafter dflash can load."""
    out = tmp_path / "drafter"
    res = subprocess.run(
        [sys.executable, str(REPO / "training" / "train_drafter.py"),
         f"--extractor={extractor.address}", f"--out={out}", "--prompts=8", "--eval-prompts=4",
         "--max-new-tokens=16", "--steps=3", "--batch=4", "--anchors-per-seq=4", "--threads=1",
         "--log-every=1"],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    log = json.loads((out / "train_log.json").read_text())
    assert [c["step"] for c in log["loss_curve"]] == [0, 1, 2]
    assert log["feature_states"] == ["layer.1", "final_norm"]  # id 3 = L-1: the final-norm tap
    drafter = F.load_drafter(out)
    committed = F.load_drafter(DRAFTER)
    assert drafter.mask_token_id == committed.mask_token_id == 2047
    assert drafter.target_layer_ids == committed.target_layer_ids == [1, 3]
    assert drafter.block_size == 16


def test_train_drafter_script_under_torchrun(extractor, tmp_path):
    """The same pipeline data-parallel: torchrun with 2 ranks (gloo, DDP) x 2 DataLoader workers
    per rank, fed by one extractor; every training sequence is read by exactly one rank."""
    from extractor_harness import free_port
    out = tmp_path / "drafter"
    torchrun = Path(sys.executable).parent / "torchrun"
    env = dict(__import__("os").environ, OMP_NUM_THREADS="1")
    res = subprocess.run(
        [str(torchrun), "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={free_port()}", str(REPO / "training" / "train_drafter.py"),
         f"--extractor={extractor.address}", f"--out={out}", "--prompts=12", "--eval-prompts=4",
         "--max-new-tokens=16", "--steps=3", "--batch=2", "--anchors-per-seq=4", "--threads=1",
         "--workers=2", "--log-every=1"],
        capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    log = json.loads((out / "train_log.json").read_text())
    assert log["world_size"] == 2 and log["workers_per_rank"] == 2
    assert log["feature_sample_indices"] == list(range(12))  # each sequence once, over the ranks
    assert log["rank_sequences"] == [6, 6]
    assert [c["step"] for c in log["loss_curve"]] == [0, 1, 2]
    assert F.load_drafter(out).block_size == 16
