"""EAGLE-3 drafters through the Scorer service: a real specwire-extractor (a tiny random 3-layer
Qwen3 target with a tokenizer) and specwire-scorer on 127.0.0.1.

A speculators EAGLE-3 drafter is trained for a few seconds on the target's greedy trajectories
(tests/parity/eagle3_reference.py, speculators' own model class in the trainers' environment),
with auxiliary layers [1, 2, 3] in speculators' convention: index 3 is the last layer's output
before the final norm, which the extractor serves as layer 2 (not its final-norm tap). The same
weights are also written in SpecForge's layout (midlayer.*, eagle_config ids [0, 1, 2]). Each is
scored through the scorer: the method label is eagle3, and every prompt's chain step lengths
equal the offline chain replay (specwire-replay replay, the target in-process) and, for
the speculators drafter, the replay written on the reference model; the job's tree budgets are
EAGLE's top-k tree, each equal to the offline tree replay. Drafters whose layer ids lie
beyond the target, in either convention, or whose vocabulary differs, are refused with
FAILED_PRECONDITION before any work. About 40 s on two cores."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch
from extractor_harness import make_tokenizer_json
from safetensors.torch import load_file, save_file

from specwire_client._generated.proto.specwire.v1 import scorer_pb2 as spb

import dflash_fixtures as F  # noqa: E402  (tests/parity, on sys.path via extractor_harness)
from scorer_harness import THREADS, ScorerServer, scorer_binary  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ORACLES = REPO / ".venv" / "trainer-oracles"
PROMPT_LEN = 8
MAX_NEW_TOKENS = 24
BLOCK = 5  # speculative_tokens 4
AUX_IDS = [1, 2, 3]


def to_specforge(src: Path, dst: Path) -> Path:
    """The speculators checkpoint's weights in SpecForge's layout (one Llama midlayer, top-level
    LlamaConfig, 0-based layer-output ids, d2t / t2d always present)."""
    cfg = json.loads((src / "config.json").read_text())
    tl = cfg["transformer_layer_config"]
    out = {k: tl[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                              "num_attention_heads", "num_key_value_heads", "head_dim",
                              "rms_norm_eps", "max_position_embeddings", "rope_parameters",
                              "hidden_act")}
    out.update(model_type="llama", architectures=["LlamaForCausalLMEagle3"],
               num_hidden_layers=1, draft_vocab_size=cfg["draft_vocab_size"],
               eagle_config={"eagle_aux_hidden_state_layer_ids":
                             [i - 1 for i in cfg["eagle_aux_hidden_state_layer_ids"]]},
               tie_word_embeddings=False)
    t = load_file(str(src / "model.safetensors"))
    t = {k.replace("layers.0.", "midlayer."): v for k, v in t.items()}
    V, Vd = out["vocab_size"], out["draft_vocab_size"]
    t.setdefault("d2t", torch.zeros(Vd, dtype=torch.int64))
    t.setdefault("t2d", torch.ones(V, dtype=torch.bool))
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(out))
    save_file(t, str(dst / "model.safetensors"))
    return dst


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    if not (ORACLES / "speculators").is_dir():
        pytest.fail("speculators is not in .venv/trainer-oracles (scripts/setup.sh)",
                    pytrace=False)
    root = tmp_path_factory.mktemp("eagle3-pair")
    target = F.make_target(root, overrides={"num_hidden_layers": 3})
    make_tokenizer_json(target / "tokenizer.json")
    hf = F.hf_target(target)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 500, (6, PROMPT_LEN), generator=g)
    trajs = F.hf_trajectories(hf, prompts, MAX_NEW_TOKENS)
    # The auxiliary states as vLLM captures them: HF hidden_states[i] for i < L, and the last
    # layer's output before the norm for i = L (transformers' hidden_states[L] is normed).
    last = {}
    hook = hf.model.layers[-1].register_forward_hook(
        lambda mod, a, o: last.update(h=(o[0] if isinstance(o, tuple) else o)))
    with torch.no_grad():
        hs = list(hf(torch.tensor(trajs), output_hidden_states=True).hidden_states)
    hook.remove()
    hs[len(hs) - 1] = last["h"]
    data = {}
    for i, t in enumerate(trajs):
        data[f"traj.{i}"] = torch.tensor(t, dtype=torch.int64)
        data[f"aux.{i}"] = torch.cat([hs[k][i] for k in AUX_IDS], -1).contiguous()
    save_file(data, str(root / "data.safetensors"))
    spec = root / "train.json"
    drafter = root / "eagle3-speculators"
    spec.write_text(json.dumps({
        "data": str(root / "data.safetensors"), "target": str(target), "out": str(drafter),
        "prompt_len": PROMPT_LEN, "max_new_tokens": MAX_NEW_TOKENS, "block": BLOCK,
        "train_steps": 120, "aux_ids": AUX_IDS, "draft_vocab": 300,
        "norm_before_residual": False}))
    env = dict(os.environ, PYTHONPATH=str(ORACLES), TORCHDYNAMO_DISABLE="1")
    r = subprocess.run([sys.executable, str(REPO / "tests" / "parity" / "eagle3_reference.py"),
                        "replay", str(spec)], capture_output=True, text=True, timeout=900,
                       env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    reference = json.loads(r.stdout.strip().splitlines()[-1])["step_lengths"]
    return {"target": target, "root": root, "prompts": [t[:PROMPT_LEN] for t in trajs],
            "trajectories": trajs, "reference": reference,
            "drafters": {"speculators": drafter,
                         "specforge": to_specforge(drafter, root / "eagle3-specforge")}}


@pytest.fixture(scope="module")
def scorer(server_factory, pair, tmp_path_factory):
    ext = server_factory(pair["target"], dtype="float32")
    s = ScorerServer(ext.address, tmp_path_factory.mktemp("scorer"),
                     tmp_path_factory.mktemp("cache")).start()
    yield s
    s.stop()


def offline(pair: dict, drafter: Path, tree: str = "") -> tuple[int, list[list[int]]]:
    """The offline replay's step lengths: the chain, or with tree="depth,top_k,total" EAGLE's
    top-k tree (checked against the reference model in tests/parity/test_eagle3_parity.py)."""
    prompts = pair["root"] / "prompts.json"
    prompts.write_text(json.dumps(pair["prompts"]))
    r = subprocess.run([str(scorer_binary("specwire-replay")), "replay",
                        f"--drafter={drafter}", f"--target_checkpoint={pair['target']}",
                        f"--tokens_file={prompts}", f"--max_new_tokens={MAX_NEW_TOKENS}",
                        f"--threads={THREADS}"] + ([f"--tree={tree}"] if tree else []),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["block_size"], [resp["step_lengths"] for resp in out["responses"]]


def score(scorer: ScorerServer, pair: dict, drafter: Path, budgets=(8,), **tree) -> list:
    request = spb.ScoreRequest(
        drafter_path=str(drafter), max_new_tokens=MAX_NEW_TOKENS, ddtree_budgets=list(budgets),
        prompts=[spb.PromptInput(tokens={"ids": p}) for p in pair["prompts"]], **tree)
    return list(scorer.stub().Score(request, timeout=300))


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_eagle3_scores_through_the_service(scorer, pair, fmt):
    drafter = pair["drafters"][fmt]
    msgs = score(scorer, pair, drafter)
    results = {m.result.prompt_index: m.result for m in msgs if m.HasField("result")}
    summary = msgs[-1].summary
    block, want = offline(pair, drafter)
    got = [list(results[i].step_lengths) for i in range(len(pair["prompts"]))]
    assert got == want
    if fmt == "speculators":
        assert got == pair["reference"] and block == BLOCK  # speculative_tokens 4
    else:
        assert block == 6  # SpecForge declares no chain length: the default of 5 drafts
    flat = [a for s in got for a in s]
    assert max(flat) >= 3 and min(flat) == 1, flat
    assert summary.block_size == block
    # The job's budget is EAGLE's top-k tree (DDTree reads a DFlash block's marginals): by
    # default as deep as the chain, top-k 8, 8 nodes, prompt by prompt the offline tree replay.
    assert summary.tree_method == "eagle"
    assert (summary.tree_depth, summary.tree_top_k) == (block - 1, 8)
    assert list(summary.ddtree_tau) == [8]
    _, tree = offline(pair, drafter, f"{block - 1},8,8")
    assert [list(results[i].ddtree_step_lengths[8].lengths)
            for i in range(len(pair["prompts"]))] == tree


def test_eagle_tree_settings_through_the_service(scorer, pair):
    """Several budgets with a job's own depth and top-k: each budget's step lengths equal the
    offline replay of that tree."""
    drafter = pair["drafters"]["speculators"]
    msgs = score(scorer, pair, drafter, budgets=(3, 12), tree_depth=3, tree_top_k=3)
    results = {m.result.prompt_index: m.result for m in msgs if m.HasField("result")}
    summary = msgs[-1].summary
    assert (summary.tree_method, summary.tree_depth, summary.tree_top_k) == ("eagle", 3, 3)
    for budget in (3, 12):
        _, want = offline(pair, drafter, f"3,3,{budget}")
        got = [list(results[i].ddtree_step_lengths[budget].lengths)
               for i in range(len(pair["prompts"]))]
        assert got == want, budget
        assert max(a for s in got for a in s) <= 4  # depth 3: at most 3 drafts + the bonus
    # Deeper than the drafter's chain (4 drafts): refused before any work, naming the field.
    with pytest.raises(grpc.RpcError) as e:
        score(scorer, pair, drafter, tree_depth=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "tree_depth: 5" in e.value.details() and "chain of 4 drafts" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        score(scorer, pair, drafter, tree_top_k=65)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tree_top_k: 65" in e.value.details()


def test_eagle3_method_label_in_the_metrics(scorer, pair):
    score(scorer, pair, pair["drafters"]["speculators"])
    text = subprocess.run(["curl", "-s", f"http://127.0.0.1:{scorer.metrics_port}/metrics"],
                          capture_output=True, text=True, timeout=30).stdout
    lines = [l for l in text.splitlines()
             if l.startswith("specwire_spec_decode_num_drafts_total{")]
    assert any('method="eagle3"' in l for l in lines), lines


def write_broken(pair: dict, fmt: str, tag: str, edit) -> Path:
    src = pair["drafters"][fmt]
    dst = pair["root"] / f"broken-{fmt}-{tag}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("fmt,tag,edit,words", [
    ("speculators", "index-past-the-target",
     lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 4]),
     ["eagle_aux_hidden_state_layer_ids", "hidden-state indices", "[1, 3]"]),
    ("speculators", "embedding-index",
     lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 2, 3]),
     ["eagle_aux_hidden_state_layer_ids", "embedding output"]),
    ("specforge", "id-past-the-target",
     lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 1, 3]),
     ["eagle_config.eagle_aux_hidden_state_layer_ids", "layer-output ids", "[0, 2]"]),
])
def test_layer_ids_beyond_the_target_are_refused_before_any_work(scorer, pair, fmt, tag, edit,
                                                                 words):
    drafter = write_broken(pair, fmt, tag, edit)
    with pytest.raises(grpc.RpcError) as e:
        score(scorer, pair, drafter)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    for w in words:
        assert w in e.value.details(), (w, e.value.details())


@pytest.mark.parametrize("declared", ["dflash3", "medusa", 7])
def test_an_unknown_speculators_family_is_refused_by_its_declaration(scorer, pair, declared):
    drafter = write_broken(pair, "speculators", f"family-{declared}",
                           lambda c: c.update(speculators_model_type=declared))
    with pytest.raises(grpc.RpcError) as e:
        score(scorer, pair, drafter)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "speculators_model_type" in e.value.details()
    assert "config.json" in e.value.details()
