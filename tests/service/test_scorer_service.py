"""The scorer tier: real specwire-extractor and specwire-scorer processes on 127.0.0.1.

A tiny random target (3 layers, hidden 64, vocab 512, with a tokenizer.json) and a DFlash
drafter trained for a few seconds on the target's greedy outputs (tests/parity/dflash_fixtures,
so acceptance lengths spread over 1..B) are scored through the Scorer service, and the numbers
are checked against the offline replay (specwire-replay, the target in-process) step by step.
Also: contract mismatches refused before any work (a drafter for a 64-layer target; a wrong
hidden size), the vLLM-named counters on the metrics endpoint, specwire-score's JSON and HTML
reports through a scorer and in-process, two extractors giving the same report as one, text and
dataset prompts, the target-head cache across scorer processes, and cancellation.

Binaries come from $SPECWIRE_BUILD_DIR (default <repo>/build): specwire-extractor,
specwire-scorer, specwire-score, specwire-replay. Run time: about half a minute on two cores.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import grpc
import pytest
import torch
from extractor_harness import make_tokenizer_json, metric_sum, metric_value, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc
from safetensors.torch import save_file

from specwire_client._generated.proto.specwire.v1 import scorer_pb2 as spb

pytest.importorskip("dflash", reason="the trained drafter comes from dflash's model code")
import dflash_fixtures as F  # noqa: E402  (tests/parity, on sys.path via extractor_harness)
from scorer_harness import THREADS, ScorerServer, scorer_binary  # noqa: E402

BLOCK = 8
PROMPT_LEN = 8
MAX_NEW_TOKENS = 24
DDTREE = [4, 32]
TARGET_LAYER_IDS = [1, 2]  # 2 = L - 1: dflash reads hidden_states[3], the final-norm tap


def write_zlab_drafter(out: Path, *, hidden: int, vocab: int, num_target_layers: int,
                       target_layer_ids: list[int], seed: int = 0) -> Path:
    """A random drafter in z-lab's format (config.json with dflash_config + safetensors):
    loadable, meant to be refused by the contract check."""
    out.mkdir(parents=True, exist_ok=True)
    heads, kv, hd, inter, layers = 4, 2, 16, 2 * hidden, 1
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": vocab,
              "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
              "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, "block_size": BLOCK,
              "num_target_layers": num_target_layers,
              "dflash_config": {"mask_token_id": vocab - 1,
                                "target_layer_ids": target_layer_ids}}
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    t = {"fc.weight": w(hidden, len(target_layer_ids) * hidden),
         "hidden_norm.weight": torch.ones(hidden), "norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        t |= {p + "input_layernorm.weight": torch.ones(hidden),
              p + "post_attention_layernorm.weight": torch.ones(hidden),
              p + "self_attn.q_proj.weight": w(heads * hd, hidden),
              p + "self_attn.k_proj.weight": w(kv * hd, hidden),
              p + "self_attn.v_proj.weight": w(kv * hd, hidden),
              p + "self_attn.o_proj.weight": w(hidden, heads * hd),
              p + "self_attn.q_norm.weight": torch.ones(hd),
              p + "self_attn.k_norm.weight": torch.ones(hd),
              p + "mlp.gate_proj.weight": w(inter, hidden),
              p + "mlp.up_proj.weight": w(inter, hidden),
              p + "mlp.down_proj.weight": w(hidden, inter)}
    save_file(t, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


# --- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    """The target (with a tokenizer), a drafter trained on its greedy outputs, the prompts."""
    root = tmp_path_factory.mktemp("scorer-pair")
    target = F.make_target(root, overrides={"num_hidden_layers": 3})
    make_tokenizer_json(target / "tokenizer.json")
    hf = F.hf_target(target)
    g = torch.Generator().manual_seed(0)
    seen, sequences, drafter = F.seen_pair(hf, PROMPT_LEN, MAX_NEW_TOKENS, BLOCK,
                                           TARGET_LAYER_IDS, g)
    F.train_drafter(drafter, hf, sequences, PROMPT_LEN, steps=100)
    drafter_dir = F.save_drafter(drafter, root / "trained-b8", zlab_rope={})
    unseen = torch.randint(0, 500, (2, 11), generator=g).tolist()
    prompts = seen[:4].tolist() + unseen
    return {"target": target, "drafter": drafter_dir, "prompts": prompts, "root": root,
            "sequences": sequences}


@pytest.fixture(scope="module")
def extractors(server_factory, pair) -> list:
    return [server_factory(pair["target"], dtype="float32") for _ in range(2)]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scorer-cache")


@pytest.fixture(scope="module")
def scorer(extractors, cache_dir, tmp_path_factory):
    """A scorer against the first extractor."""
    s = ScorerServer(extractors[0].address, tmp_path_factory.mktemp("scorer1"), cache_dir).start()
    yield s
    s.stop()


def score_request(pair: dict, **kw) -> spb.ScoreRequest:
    prompts = [spb.PromptInput(tokens={"ids": p}) for p in pair["prompts"]]
    args = dict(drafter_path=str(pair["drafter"]), prompts=prompts,
                max_new_tokens=MAX_NEW_TOKENS, ddtree_budgets=DDTREE)
    args.update(kw)
    return spb.ScoreRequest(**args)


def run_score(server: ScorerServer, request: spb.ScoreRequest) -> list:
    return list(server.stub().Score(request, timeout=120))


@pytest.fixture(scope="module")
def first_job(scorer, pair) -> dict:
    """The reference job: every message of one Score stream (labels set explicitly)."""
    msgs = run_score(scorer, score_request(pair, drafter_label="trained-b8",
                                           dataset_label="unit"))
    results = {m.result.prompt_index: m.result for m in msgs if m.WhichOneof("message") == "result"}
    return {"messages": msgs, "results": results, "summary": msgs[-1].summary}


@pytest.fixture(scope="module")
def offline(pair) -> list[dict]:
    """specwire-replay, one prompt at a time (the scorer sends one prompt per Generate, so both
    run the same single-sequence forward passes), in fp32 on one thread."""
    out = []
    for i, prompt in enumerate(pair["prompts"]):
        tokens = pair["root"] / f"prompt{i}.json"
        tokens.write_text(json.dumps([prompt]))
        res = subprocess.run(
            [str(scorer_binary("specwire-replay")), "--drafter", str(pair["drafter"]),
             "--target_checkpoint", str(pair["target"]), "--tokens_file", str(tokens),
             "--max_new_tokens", str(MAX_NEW_TOKENS), "--ddtree", ",".join(map(str, DDTREE)),
             "--dtype", "float32", "--threads", THREADS],
            capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        out.append(json.loads(res.stdout.strip().splitlines()[-1])["responses"][0])
    return out


# --- the numbers ---------------------------------------------------------------------------------

def test_score_matches_the_offline_replay_step_by_step(first_job, offline, pair):
    msgs = first_job["messages"]
    kinds = [m.WhichOneof("message") for m in msgs]
    n = len(pair["prompts"])
    assert kinds == ["contract", "progress"] + ["result", "progress"] * n + ["summary"]
    c = msgs[0].contract
    assert (c.num_layers, c.hidden_size, c.vocab_size, c.compute_dtype) == (3, 64, 512, "float32")
    assert [m.progress.prompts_done for m in msgs if m.HasField("progress")] == list(range(n + 1))
    assert all(m.progress.prompts_total == n for m in msgs if m.HasField("progress"))

    results = first_job["results"]
    assert sorted(results) == list(range(n))
    for i, ref in enumerate(offline):
        r = results[i]
        assert list(r.step_lengths) == ref["step_lengths"], f"prompt {i}"
        assert {str(b): list(v.lengths) for b, v in r.ddtree_step_lengths.items()} == ref["ddtree"]
        assert (r.prompt_tokens, r.completion_tokens) == (ref["prompt_tokens"],
                                                           ref["completion_tokens"])
        assert r.finish_reason == ref["finish_reason"]
        assert r.tau == pytest.approx(sum(r.step_lengths) / len(r.step_lengths), rel=1e-12)
    # The trained drafter accepts some drafts, so the comparison is not all ones.
    lengths = [v for r in results.values() for v in r.step_lengths]
    assert max(lengths) >= 3 and min(lengths) == 1

    s = first_job["summary"]
    taus = [sum(r["step_lengths"]) / len(r["step_lengths"]) for r in offline]
    steps = sum(len(r["step_lengths"]) for r in offline)
    assert s.block_size == BLOCK and s.responses == n and s.steps == steps
    assert s.tau_mean_of_means == pytest.approx(sum(taus) / n, rel=1e-12)
    tokens = sum(sum(r["step_lengths"]) for r in offline)
    assert s.tau_pooled == pytest.approx(tokens / steps, rel=1e-12)
    assert sum(s.histogram) == steps and len(s.histogram) == BLOCK
    assert s.num_drafts == steps and s.num_draft_tokens == steps * (BLOCK - 1)
    assert s.num_accepted_tokens == sum(v - 1 for r in offline for v in r["step_lengths"])
    assert sorted(s.ddtree_tau) == DDTREE and sorted(s.ddtree_tau_pooled) == DDTREE


def test_contract_mismatch_64_layer_drafter(scorer, pair, tmp_path):
    """A drafter trained for a 64-layer target (Qwen3.6-27B's layer ids) against the 3-layer
    extractor: FAILED_PRECONDITION naming num_target_layers with both values, before any
    message."""
    d = write_zlab_drafter(tmp_path / "qwen36-like", hidden=64, vocab=512, num_target_layers=64,
                           target_layer_ids=[1, 16, 31, 46, 61])
    got = []
    with pytest.raises(grpc.RpcError) as info:
        for m in scorer.stub().Score(score_request(pair, drafter_path=str(d)), timeout=60):
            got.append(m)
    e = info.value
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "num_target_layers: drafter expects 64, extractor serves 3" in e.details()
    assert "target_layer_ids[1]: drafter uses layer 16" in e.details()
    assert got == []


def test_contract_mismatch_hidden_size(scorer, pair, tmp_path):
    d = write_zlab_drafter(tmp_path / "hidden32", hidden=32, vocab=512, num_target_layers=3,
                           target_layer_ids=TARGET_LAYER_IDS)
    with pytest.raises(grpc.RpcError) as info:
        run_score(scorer, score_request(pair, drafter_path=str(d)))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("hidden_size: drafter expects 32 (fc in_features 64 / 2 target layers), "
            "extractor serves 64") in info.value.details()
    assert "num_target_layers" not in info.value.details()


def test_metrics_show_vllm_counters_with_labels(scorer, first_job):
    s = first_job["summary"]
    text = scorer.metrics()
    labels = dict(drafter="trained-b8", dataset="unit", method="dflash")
    assert metric_value(text, "specwire_spec_decode_num_drafts_total", **labels) == s.num_drafts
    assert metric_value(text, "specwire_spec_decode_num_draft_tokens_total",
                        **labels) == s.num_draft_tokens
    assert metric_value(text, "specwire_spec_decode_num_accepted_tokens_total",
                        **labels) == s.num_accepted_tokens
    for k, v in enumerate(s.num_accepted_tokens_per_pos):
        assert metric_value(text, "specwire_spec_decode_num_accepted_tokens_per_pos_total",
                            position=str(k + 1), **labels) == v
    assert metric_value(text, "specwire_spec_decode_mean_acceptance_length", kind="mean_of_means",
                        **labels) == pytest.approx(s.tau_mean_of_means)
    assert metric_value(text, "specwire_spec_decode_mean_acceptance_length", kind="pooled",
                        **labels) == pytest.approx(s.tau_pooled)
    for b in DDTREE:
        assert metric_value(text, "specwire_spec_decode_ddtree_mean_acceptance_length",
                            budget=str(b), kind="mean_of_means",
                            **labels) == pytest.approx(s.ddtree_tau[b])
    assert metric_value(text, "specwire_scorer_prompts_scored_total", **labels) == s.responses
    assert metric_value(text, "specwire_scorer_requests_total", method="Score", code="OK") >= 1
    assert "# TYPE specwire_scorer_request_duration_seconds histogram" in text


def test_health(scorer):
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(scorer.address))
    r = stub.Check(health_pb2.HealthCheckRequest(service="specwire.v1.Scorer"), timeout=10)
    assert r.status == health_pb2.HealthCheckResponse.SERVING


# --- specwire-score ------------------------------------------------------------------------------

def specwire_score(args: list[str]) -> subprocess.CompletedProcess:
    res = subprocess.run([str(scorer_binary("specwire-score")), *args], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res


def test_reports_through_a_scorer_and_in_process_with_two_extractors(
        scorer, extractors, cache_dir, first_job, pair, tmp_path, tmp_path_factory):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(pair["prompts"]))
    common = [f"--drafter={pair['drafter']}", f"--prompts_file={prompts}",
              f"--max_new_tokens={MAX_NEW_TOKENS}", "--ddtree=" + ",".join(map(str, DDTREE))]
    one = specwire_score([f"--scorer={scorer.address}", *common,
                          f"--json_out={tmp_path / 'one.json'}",
                          f"--html_out={tmp_path / 'one.html'}"])
    assert "tau (mean of means)" in one.stdout and "DDTree-32 tau" in one.stdout
    assert "pos  7" in one.stdout
    assert "scored 6/6 prompts" in one.stderr  # plain progress lines: stderr is not a terminal
    # The report names the extractors the scorer used (the "extractors" row of the HTML report).
    report_one = json.loads((tmp_path / "one.json").read_text())
    assert report_one["extractors"] == [scorer.extractors], report_one["extractors"]
    assert scorer.extractors in (tmp_path / "one.html").read_text()

    # A second scorer over both extractors, sharing the first one's target-head cache.
    both = ",".join(e.address for e in extractors)
    two_scorer = ScorerServer(both, tmp_path_factory.mktemp("scorer2"), cache_dir).start()

    def generates() -> list[float]:
        return [metric_value(e.metrics(), "specwire_extractor_requests_total", method="Generate",
                             code="OK") for e in extractors]

    try:
        before = generates()
        specwire_score([f"--scorer={two_scorer.address}", *common,
                        f"--json_out={tmp_path / 'two.json'}"])
        # The job's prompts (one Generate each) were spread over both extractors (a server
        # counts a call once its stream is done, just after the client saw the end).
        deadline = time.monotonic() + 10
        while True:
            moved = [a - b for a, b in zip(generates(), before)]
            if sum(moved) >= len(pair["prompts"]) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sum(moved) == len(pair["prompts"]) and min(moved) >= 1, moved
        assert "target head from the cache" in two_scorer.log()
        assert "fetched" not in two_scorer.log()
    finally:
        two_scorer.stop()
    assert "target head fetched from" in scorer.log()

    # In-process: specwire-score is the scorer, against both extractors, with the target's
    # head read from the local checkpoint.
    specwire_score([f"--extractor={both}", *common, "--dtype=float32", f"--threads={THREADS}",
                    "--cache_dir=none", f"--target_checkpoint={pair['target']}",
                    f"--json_out={tmp_path / 'inproc.json'}"])

    # A dns:/// target: every address of the name (localhost may also resolve to ::1, where
    # nothing listens: that address is left out of the job).
    port = extractors[0].address.rsplit(":", 1)[1]
    specwire_score([f"--extractor=dns:///localhost:{port}", *common, "--dtype=float32",
                    f"--threads={THREADS}", f"--cache_dir={cache_dir}",
                    f"--json_out={tmp_path / 'dns.json'}"])

    reports = {k: json.loads((tmp_path / f"{k}.json").read_text())
               for k in ("one", "two", "inproc", "dns")}
    ref = reports["one"]
    for k in ("two", "inproc", "dns"):
        assert reports[k]["summary"] == ref["summary"], k
        assert reports[k]["prompts"] == ref["prompts"], k
        assert reports[k]["contract"] == ref["contract"], k
    assert reports["inproc"]["extractors"] == [e.address for e in extractors]
    assert reports["dns"]["extractors"] == [extractors[0].address]
    # Every report says both compute dtypes, through the scorer service too, and notes a pair
    # that differs.
    for k, r in reports.items():
        settings = r["settings"]
        assert settings["target_dtype"] == r["contract"]["compute_dtype"] != "", k
        assert settings["drafter_dtype"] == "float32", (k, settings)
        assert r["drafter"]["dtype"] == "float32", (k, r["drafter"])
        differ = settings["target_dtype"] != settings["drafter_dtype"]
        assert bool(settings["dtype_note"]) == differ, (k, settings)
        if differ:
            assert settings["target_dtype"] in settings["dtype_note"], settings
    assert reports["one"]["mode"] == "scorer" and reports["one"]["extractors"] == [
        extractors[0].address]
    assert f"<td class=\"num\">{extractors[0].address}</td>" in (tmp_path / "one.html").read_text()
    assert reports["inproc"]["drafter"]["target_layer_ids"] == TARGET_LAYER_IDS
    # The report holds the gRPC job's numbers, the contract and the drafter's config.
    for p in ref["prompts"]:
        assert p["step_lengths"] == list(first_job["results"][p["prompt_index"]].step_lengths)
    assert ref["summary"]["tau_mean_of_means"] == pytest.approx(
        first_job["summary"].tau_mean_of_means)
    assert ref["contract"]["num_layers"] == 3 and ref["contract"]["weights_digest"]
    assert ref["drafter"]["config"]["dflash_config"]["target_layer_ids"] == TARGET_LAYER_IDS
    assert ref["labels"] == {"drafter": "trained-b8", "dataset": "inline", "method": "dflash"}

    html = (tmp_path / "one.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert html.count("<svg ") == 5
    for chart in ("per-position-acceptance", "tau-histogram", "ddtree-budget-curve",
                  "tau-by-token-window", "capacity-speedup"):
        assert f'id="{chart}"' in html
    assert "<script" not in html and "src=" not in html and "href=" not in html


def test_text_prompts_and_a_dataset(scorer, pair, tmp_path):
    from tokenizers import Tokenizer

    text = "the quick brown fox jumps over the lazy dog"
    dataset = tmp_path / "mixed.jsonl"
    dataset.write_text(json.dumps({"prompt": text}) + "\n\n"
                       + json.dumps({"input_ids": pair["prompts"][0]}) + "\n"
                       + json.dumps({"prompt": "never scored"}) + "\n")
    msgs = run_score(scorer, spb.ScoreRequest(drafter_path=str(pair["drafter"]),
                                              dataset_path=str(dataset), max_prompts=2,
                                              max_new_tokens=8, ddtree_budgets=[4]))
    results = {m.result.prompt_index: m.result for m in msgs if m.HasField("result")}
    assert sorted(results) == [0, 1]
    tok = Tokenizer.from_file(str(pair["target"] / "tokenizer.json"))
    assert results[0].prompt_tokens == len(tok.encode(text, add_special_tokens=False).ids)
    assert results[1].prompt_tokens == PROMPT_LEN
    assert msgs[-1].summary.responses == 2
    assert metric_value(scorer.metrics(), "specwire_scorer_prompts_scored_total",
                        drafter="trained-b8", dataset="mixed", method="dflash") == 2

    with pytest.raises(grpc.RpcError) as info:
        run_score(scorer, spb.ScoreRequest(drafter_path=str(pair["drafter"]),
                                           dataset_path=str(tmp_path / "missing.jsonl")))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "missing.jsonl" in info.value.details()


def test_cancel_frees_the_scorer(scorer, pair):
    """A cancelled job stops at the next prompt, before its end; the scorer then takes the next
    job."""
    def scored() -> float:
        return metric_sum(scorer.metrics(), "specwire_scorer_prompts_scored_total")

    before = scored()
    long = score_request(pair, max_new_tokens=400)
    call = scorer.stub().Score(long, timeout=120)
    first = next(call)
    assert first.HasField("contract")
    call.cancel()
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.CANCELLED

    # The job leaves the worker (nothing running, nothing queued) and its call is counted
    # CANCELLED before the next job is sent; it did not score all its prompts.
    def freed() -> bool:
        m = scorer.metrics()
        return (metric_value(m, "specwire_scorer_jobs_running") == 0
                and metric_value(m, "specwire_scorer_queue_depth") == 0
                and metric_value(m, "specwire_scorer_requests_total", method="Score",
                                 code="CANCELLED") >= 1)

    wait_for(freed, 30, "the cancelled job to leave the scorer's worker")
    assert scored() - before < len(pair["prompts"])
    short = run_score(scorer, score_request(pair, max_new_tokens=4))
    assert short[-1].HasField("summary")
    assert metric_value(scorer.metrics(), "specwire_scorer_requests_total", method="Score",
                        code="CANCELLED") >= 1
    assert scorer.alive()


# --- statistics over the wire --------------------------------------------------------------------

def test_summary_carries_intervals_windows_and_temperature(scorer, pair, first_job):
    s = first_job["summary"]
    assert s.bootstrap_resamples == 1000 and s.confidence == 0.95 and s.token_window == 64
    assert s.HasField("tau_mean_of_means_ci")
    assert s.tau_mean_of_means_ci.lo <= s.tau_mean_of_means <= s.tau_mean_of_means_ci.hi
    assert set(s.ddtree_tau_ci) == set(DDTREE)
    assert list(s.per_position_reached)[0] == s.steps
    assert sum(w.steps for w in s.windows) == s.steps
    # A seed gives the same intervals; another seed, others; 0 resamples, none.
    again = run_score(scorer, score_request(pair, bootstrap_resamples=200, bootstrap_seed=7,
                                            token_window=4,
                                            sampling=[spb.SamplingSetting(temperature=0.8,
                                                                          top_p=0.9, top_k=20)]))
    again2 = run_score(scorer, score_request(pair, bootstrap_resamples=200, bootstrap_seed=7,
                                             token_window=4))
    a, b = again[-1].summary, again2[-1].summary
    assert a.tau_mean_of_means_ci == b.tau_mean_of_means_ci
    assert a.bootstrap_resamples == 200 and a.token_window == 4
    assert all(w.last_token - w.first_token == 3 for w in a.windows)
    assert [(t.rule, round(t.setting.temperature, 3)) for t in a.temperature] == [
        ("argmax_draft", 0.8), ("draft_distribution", 0.8)]
    for t in a.temperature:
        assert 1 <= t.tau_prob <= s.block_size
        assert t.tau_prob_ci.lo <= t.tau_prob <= t.tau_prob_ci.hi
        assert t.blocks == s.steps  # one block per greedy step
    none = run_score(scorer, score_request(pair, bootstrap_resamples=0))[-1].summary
    assert not none.HasField("tau_mean_of_means_ci") and none.tau_mean_of_means == s.tau_mean_of_means
    # Trajectory digests let two results be paired.
    digests = [m.result.trajectory_digest for m in again if m.HasField("result")]
    assert all(d.startswith("xxh3-128:") for d in digests) and len(set(digests)) == len(digests)


def test_results_carry_the_completion(pair, first_job):
    """PromptResult.completion_token_ids: what the target answered, one id per completion token,
    hashing with the prompt to the trajectory digest; transformers' greedy generate gives the
    same tokens (the prompts the drafter was trained on run to max_new_tokens)."""
    import numpy as np
    import xxhash
    for i, r in first_job["results"].items():
        got = list(r.completion_token_ids)
        assert len(got) == r.completion_tokens > 0, f"prompt {i}"
        whole = np.asarray(pair["prompts"][i] + got, dtype="<i8").tobytes()
        assert r.trajectory_digest == "xxh3-128:" + xxhash.xxh3_128_hexdigest(whole)
        if i < 4 and r.finish_reason == "max_new_tokens":
            assert got == pair["sequences"][i][len(pair["prompts"][i]):], f"prompt {i}"


def test_live_jobs_through_the_scorer(scorer, pair, first_job):
    """ScoreRequest.live: greedy live results equal the replay's prompt by prompt and the
    scorer's self-check says so; a sampled live job reports its setting and rule."""
    msgs = run_score(scorer, score_request(pair, live=spb.LiveLoop(self_check_prompts=100)))
    results = {m.result.prompt_index: m.result for m in msgs if m.HasField("result")}
    s = msgs[-1].summary
    assert s.loop == "live" and s.live.rule == "argmax_draft"
    for i, ref in first_job["results"].items():
        assert list(results[i].step_lengths) == list(ref.step_lengths), f"prompt {i}"
        assert results[i].trajectory_digest == ref.trajectory_digest
        assert results[i].completion_token_ids == ref.completion_token_ids
    assert not results[0].ddtree_step_lengths  # the live loop grows no trees
    assert s.live.self_check_prompts == len(results) == s.live.self_check_matching
    assert s.tau_mean_of_means == first_job["summary"].tau_mean_of_means
    sampled = run_score(scorer, score_request(pair, live=spb.LiveLoop(
        sampling=spb.SamplingSetting(temperature=0.9, top_k=50), rule="draft_distribution",
        seed=3)))[-1].summary
    assert sampled.loop == "live" and sampled.live.rule == "draft_distribution"
    assert sampled.live.sampling.temperature == 0.9 and sampled.live.seed == 3
    assert sampled.live.self_check_prompts == 0 and sampled.live.verify_calls >= sampled.steps
    assert 1 <= sampled.tau_mean_of_means <= BLOCK


@pytest.mark.parametrize("field,kw", [
    ("live.rule", dict(live=spb.LiveLoop(rule="greedy"))),
    ("live.sampling.temperature", dict(live=spb.LiveLoop(
        sampling=spb.SamplingSetting(temperature=-2)))),
    ("live.sampling.top_p", dict(live=spb.LiveLoop(
        sampling=spb.SamplingSetting(temperature=1, top_p=3)))),
    ("sampling: teacher-forced", dict(live=spb.LiveLoop(),
                                      sampling=[spb.SamplingSetting(temperature=1)])),
])
def test_bad_live_settings_are_refused(scorer, pair, field, kw):
    with pytest.raises(grpc.RpcError) as info:
        run_score(scorer, score_request(pair, **kw))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()


@pytest.mark.parametrize("field,kw", [
    ("bootstrap_resamples", dict(bootstrap_resamples=200001)),
    ("sampling[0].temperature", dict(sampling=[spb.SamplingSetting(temperature=-1)])),
    ("sampling[0].temperature", dict(sampling=[spb.SamplingSetting(temperature=float("nan"))])),
    ("sampling[1].top_p", dict(sampling=[spb.SamplingSetting(temperature=1),
                                         spb.SamplingSetting(temperature=1, top_p=1.5)])),
    ("sampling:", dict(sampling=[spb.SamplingSetting(temperature=1)] * 9)),
    ("token_window", dict(token_window=2000000)),
])
def test_bad_statistics_settings_are_refused(scorer, pair, field, kw):
    with pytest.raises(grpc.RpcError) as info:
        run_score(scorer, score_request(pair, **kw))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()
