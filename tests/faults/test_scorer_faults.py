"""The scorer under faults: an extractor SIGKILLed while a job runs (restarted on the same port,
or a second replica), the scorer itself killed and restarted in the middle of a job (results
journal, resubmission with the job_id, nothing counted twice), and cancellations and deadlines
that must release the extractor's work at once.

A tiny random target (3 layers, hidden 64) and a DFlash drafter trained for a few seconds on its
greedy outputs (so step lengths spread over 1..B and "the same report" means something).
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path

import grpc
import pytest
import torch
from faults_harness import metric_value, scorer_binary, wait_for

from specwire_client._generated.proto.specwire.v1 import scorer_pb2 as spb
from specwire_client._generated.proto.specwire.v1 import scorer_pb2_grpc as spb_grpc

pytest.importorskip("dflash", reason="the trained drafter comes from dflash's model code")
import dflash_fixtures as F  # noqa: E402  (tests/parity, on sys.path through the harness)

BLOCK = 8
PROMPT_LEN = 8
MAX_NEW_TOKENS = 40
N_PROMPTS = 8
TARGET_LAYER_IDS = [1, 2]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("faults-pair")
    target = F.make_target(root, overrides={"num_hidden_layers": 3})
    hf = F.hf_target(target)
    g = torch.Generator().manual_seed(0)
    seen = torch.randint(0, 500, (6, PROMPT_LEN), generator=g)
    sequences = F.hf_trajectories(hf, seen, 24)
    cfg = F.drafter_config(hf.config, block_size=BLOCK, target_layer_ids=TARGET_LAYER_IDS,
                           layer_types=["full_attention"], sliding_window=12)
    drafter = F.new_drafter(cfg, seed=1, perturb=False)
    F.train_drafter(drafter, hf, sequences, PROMPT_LEN, steps=60)
    drafter_dir = F.save_drafter(drafter, root / "drafter-b8", zlab_rope={})
    prompts = seen.tolist() + torch.randint(0, 500, (N_PROMPTS - 6, 11), generator=g).tolist()
    return {"target": target, "drafter": drafter_dir, "prompts": prompts, "root": root}


@pytest.fixture(scope="module")
def extractor(extractor_factory, pair):
    return extractor_factory(pair["target"])


def request(pair: dict, **kw) -> spb.ScoreRequest:
    args = dict(drafter_path=str(pair["drafter"]),
                prompts=[spb.PromptInput(tokens={"ids": p}) for p in pair["prompts"]],
                max_new_tokens=MAX_NEW_TOKENS, ddtree_budgets=[4])
    args.update(kw)
    return spb.ScoreRequest(**args)


def stub(scorer) -> spb_grpc.ScorerStub:
    return spb_grpc.ScorerStub(grpc.insecure_channel(scorer.address))


def results_of(msgs: list) -> dict[int, list[int]]:
    return {m.result.prompt_index: list(m.result.step_lengths) for m in msgs
            if m.HasField("result")}


def summary_fields(s) -> tuple:
    return (s.responses, s.steps, s.tau_mean_of_means, s.tau_pooled, list(s.histogram),
            list(s.num_accepted_tokens_per_pos), dict(s.ddtree_tau))


@pytest.fixture(scope="module")
def reference(scorer_factory, extractor, pair) -> dict:
    """The uninterrupted job."""
    scorer = scorer_factory(extractor.address)
    msgs = list(stub(scorer).Score(request(pair), timeout=120))
    scorer.stop()
    results = results_of(msgs)
    assert sorted(results) == list(range(N_PROMPTS))
    assert max(v for r in results.values() for v in r) >= 2  # not all ones
    return {"results": results, "summary": summary_fields(msgs[-1].summary),
            "summary_msg": msgs[-1].summary}


# --- the extractor goes away ---------------------------------------------------------------------

def test_scorer_retries_when_the_extractor_is_killed_and_restarted(
        scorer_factory, extractor_factory, pair, reference):
    ext = extractor_factory(pair["target"])
    # One Generate in flight (the default keeps several, which would all be done before the kill
    # on this small job): the kill then lands on a prompt still to fetch.
    scorer = scorer_factory(ext.address, args=("--generates_per_extractor=1",))
    msgs = []
    restarted = threading.Event()
    for m in stub(scorer).Score(request(pair), timeout=120):
        msgs.append(m)
        if m.HasField("result") and len(results_of(msgs)) == 2 and not ext.signalled:
            # The fetcher is a prompt ahead: its Generate is in flight or about to start.
            ext.kill()

            def restart() -> None:
                # Back once the scorer has retried into the closed port: a prompt's second (or
                # later) attempt has failed too.
                wait_for(lambda: re.search(r"\(attempt [2-9]\d* of \d+ there\), retrying",
                                           scorer.log()), 60,
                         "a retry of the scorer to fail on the closed port")
                ext.start()
                restarted.set()
            threading.Thread(target=restart, daemon=True).start()
    assert restarted.is_set()
    assert "retrying" in scorer.log() and "UNAVAILABLE" in scorer.log()
    assert results_of(msgs) == reference["results"]
    assert summary_fields(msgs[-1].summary) == reference["summary"]


def test_in_process_score_survives_losing_one_of_two_extractors(
        extractor_factory, pair, reference, tmp_path):
    a = extractor_factory(pair["target"])
    b = extractor_factory(pair["target"])
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(pair["prompts"]))
    cmd = [str(scorer_binary("specwire-score")), f"--extractor={a.address},{b.address}",
           f"--drafter={pair['drafter']}", f"--prompts_file={prompts}",
           f"--max_new_tokens={MAX_NEW_TOKENS}", "--ddtree=4", "--dtype=float32", "--threads=1",
           f"--target_checkpoint={pair['target']}", "--cache_dir=none",
           # One Generate in flight per extractor: A still has prompts to serve when it goes.
           "--generates_per_extractor=1", f"--json_out={tmp_path / 'r.json'}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A has served a Generate: the job runs on both; A goes away for good.
    wait_for(lambda: metric_value(a.metrics(), "specwire_extractor_requests_total",
                                  method="Generate", code="OK") >= 1 or proc.poll() is not None,
             60, "extractor A to serve a prompt")
    a.kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"Generate on {a.address} failed" in err and "retrying" in err
    report = json.loads((tmp_path / "r.json").read_text())
    got = {p["prompt_index"]: p["step_lengths"] for p in report["prompts"]}
    assert got == reference["results"]
    ref = reference["summary_msg"]
    assert report["summary"]["tau_mean_of_means"] == pytest.approx(ref.tau_mean_of_means,
                                                                   rel=1e-12)
    assert report["summary"]["steps"] == ref.steps


def test_non_retryable_extractor_error_fails_at_once(scorer_factory, extractor, pair):
    """INVALID_ARGUMENT from the extractor (a prompt token outside its limits) is not retried."""
    scorer = scorer_factory(extractor.address, args=("--max_new_tokens_limit=200000",))
    with pytest.raises(grpc.RpcError) as info:
        list(stub(scorer).Score(request(pair, max_new_tokens=150000), timeout=60))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_new_tokens" in info.value.details()
    assert "retrying" not in scorer.log()


def test_retry_budget_ends_with_a_clear_error(scorer_factory, extractor_factory, pair):
    ext = extractor_factory(pair["target"])
    scorer = scorer_factory(ext.address, args=("--extractor_attempts=3",))
    call = stub(scorer).Score(request(pair), timeout=120)
    with pytest.raises(grpc.RpcError) as info:
        for m in call:
            if m.HasField("contract"):
                ext.kill()  # for good
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "failed 3 times, the retry budget" in info.value.details()


# --- the scorer goes away ------------------------------------------------------------------------

def journal_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_scorer_restart_resumes_the_job_from_its_results_journal(
        scorer_factory, extractor, pair, reference, tmp_path):
    results_dir = tmp_path / "results"
    # One Generate at a time: the job is still running when the scorer is killed.
    scorer = scorer_factory(extractor.address, results_dir=results_dir,
                            args=("--generates_per_extractor=1",))
    journal = results_dir / "job-a.jsonl"
    msgs = []
    with pytest.raises(grpc.RpcError) as info:
        for m in stub(scorer).Score(request(pair, job_id="job-a"), timeout=120):
            msgs.append(m)
            if len(results_of(msgs)) == 3:
                scorer.kill()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    kept = journal_lines(journal)
    assert len(kept) >= 3 and len({j["prompt_index"] for j in kept}) == len(kept)
    # A crash in the middle of a write leaves a torn last line: it is ignored and cut off.
    with open(journal, "a") as f:
        f.write('{"key": "torn", "prompt_ind')

    scorer.start()  # same port, same --results_dir
    msgs = list(stub(scorer).Score(request(pair, job_id="job-a"), timeout=120))
    results = results_of(msgs)
    assert results == reference["results"]
    assert summary_fields(msgs[-1].summary) == reference["summary"]
    # The kept prompts come back first, the rest are scored; each is in the journal once.
    first = [m.result.prompt_index for m in msgs if m.HasField("result")][:len(kept)]
    assert sorted(first) == sorted(j["prompt_index"] for j in kept)
    assert sorted(j["prompt_index"] for j in journal_lines(journal)) == list(range(N_PROMPTS))
    assert f"{len(kept)} of {N_PROMPTS} prompts already scored" in scorer.log()
    # Only the prompts scored by this process are counted by it.
    labels = dict(drafter="drafter-b8", dataset="inline", method="dflash")
    text = scorer.metrics()
    assert metric_value(text, "specwire_scorer_prompts_scored_total",
                        **labels) == N_PROMPTS - len(kept)
    drafts = metric_value(text, "specwire_spec_decode_num_drafts_total", **labels)
    kept_steps = sum(len(j["step_lengths"]) for j in kept)
    assert drafts == reference["summary_msg"].steps - kept_steps

    # The same job once more: everything from the journal, nothing counted again.
    again = list(stub(scorer).Score(request(pair, job_id="job-a"), timeout=120))
    assert results_of(again) == reference["results"]
    assert summary_fields(again[-1].summary) == reference["summary"]
    text = scorer.metrics()
    assert metric_value(text, "specwire_scorer_prompts_scored_total",
                        **labels) == N_PROMPTS - len(kept)
    assert metric_value(text, "specwire_spec_decode_num_drafts_total", **labels) == drafts

    # A changed spec under the same id never reuses the kept results.
    changed = list(stub(scorer).Score(request(pair, job_id="job-a", max_new_tokens=12),
                                      timeout=120))
    assert changed[-1].summary.responses == N_PROMPTS
    assert metric_value(scorer.metrics(), "specwire_scorer_prompts_scored_total",
                        **labels) == 2 * N_PROMPTS - len(kept)


def test_job_id_is_validated(scorer_factory, extractor, pair, tmp_path):
    scorer = scorer_factory(extractor.address, results_dir=tmp_path / "r")
    with pytest.raises(grpc.RpcError) as info:
        list(stub(scorer).Score(request(pair, job_id="../escape"), timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "job_id" in info.value.details()


def test_specwire_score_resubmits_when_the_scorer_restarts(
        scorer_factory, extractor, pair, reference, tmp_path):
    results_dir = tmp_path / "results"
    # One Generate at a time, so that the job is still running when the scorer is killed.
    scorer = scorer_factory(extractor.address, results_dir=results_dir,
                            args=("--generates_per_extractor=1",))
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(pair["prompts"]))
    cmd = [str(scorer_binary("specwire-score")), f"--scorer={scorer.address}",
           f"--drafter={pair['drafter']}", f"--prompts_file={prompts}",
           f"--max_new_tokens={MAX_NEW_TOKENS}", "--ddtree=4", "--job_id=cli-job",
           "--scorer_attempts=20", f"--json_out={tmp_path / 'r.json'}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = results_dir / "cli-job.jsonl"
    wait_for(lambda: len(journal_lines(journal)) >= 2 or proc.poll() is not None, 60,
             "two prompts in the journal")
    scorer.kill()
    scorer.start()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "submitting job cli-job again" in err
    assert "prompts already scored" in scorer.log()
    report = json.loads((tmp_path / "r.json").read_text())
    assert {p["prompt_index"]: p["step_lengths"] for p in report["prompts"]} == \
        reference["results"]
    assert report["summary"]["steps"] == reference["summary_msg"].steps


def test_in_process_resume_file(extractor, pair, reference, tmp_path):
    """specwire-score in-process, SIGKILLed after two prompts, run again with --resume_file."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(pair["prompts"]))
    resume = tmp_path / "resume.jsonl"
    cmd = [str(scorer_binary("specwire-score")), f"--extractor={extractor.address}",
           f"--drafter={pair['drafter']}", f"--prompts_file={prompts}",
           f"--max_new_tokens={MAX_NEW_TOKENS}", "--ddtree=4", "--dtype=float32", "--threads=1",
           f"--target_checkpoint={pair['target']}", "--cache_dir=none",
           f"--resume_file={resume}", f"--json_out={tmp_path / 'r.json'}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: len(journal_lines(resume)) >= 2 or proc.poll() is not None, 60,
             "two prompts in the resume file")
    proc.kill()
    proc.wait(timeout=10)
    kept = len(journal_lines(resume))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    if kept < N_PROMPTS:
        assert f"{kept} of {N_PROMPTS} prompts already scored" in res.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert {p["prompt_index"]: p["step_lengths"] for p in report["prompts"]} == \
        reference["results"]
    assert len(journal_lines(resume)) == N_PROMPTS


# --- cancellation and deadlines ------------------------------------------------------------------

def long_request(pair: dict) -> spb.ScoreRequest:
    # The tiny target has no end-of-sequence token: 50000 tokens run for a minute or more.
    return request(pair, max_new_tokens=50000, prompts=[spb.PromptInput(tokens={"ids": [1, 2]})])


def generate_code_count(ext, code: str) -> float:
    return metric_value(ext.metrics(), "specwire_extractor_requests_total", method="Generate",
                        code=code)


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_scorer_cancel_and_deadline_cancel_the_extractor_call(
        scorer_factory, extractor_factory, pair, how):
    """The scorer cancels its Generate in flight (it does not wait for the completion): the
    extractor counts it CANCELLED, its stream gauge returns to 0, and the next job runs."""
    ext = extractor_factory(pair["target"])
    scorer = scorer_factory(ext.address, args=("--max_new_tokens_limit=100000",))
    # A short job first: the target head is fetched and cached, so the long job's Generate
    # starts at once (well inside the deadline below).
    assert list(stub(scorer).Score(request(pair, max_new_tokens=4), timeout=60))[-1].HasField(
        "summary")
    if how == "cancel":
        call = stub(scorer).Score(long_request(pair), timeout=120)
        assert next(call).HasField("contract")
        wait_for(lambda: metric_value(ext.metrics(), "specwire_extractor_active_streams") == 1,
                 30, "the Generate to be in flight")
        call.cancel()
        code = grpc.StatusCode.CANCELLED
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    else:
        with pytest.raises(grpc.RpcError) as info:
            list(stub(scorer).Score(long_request(pair), timeout=2))
        code = grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.code() == code
    wait_for(lambda: generate_code_count(ext, "CANCELLED") == 1, 30,
             "the extractor to see its Generate cancelled")
    wait_for(lambda: metric_value(ext.metrics(), "specwire_extractor_active_streams") == 0
             and metric_value(ext.metrics(), "specwire_extractor_queue_depth") == 0, 10,
             "the extractor's gauges to return to 0")
    wait_for(lambda: metric_value(scorer.metrics(), "specwire_scorer_jobs_running") == 0, 10,
             "the scorer's job to end")
    assert generate_code_count(ext, "OK") == N_PROMPTS  # the short job; the long one never ended
    short = list(stub(scorer).Score(request(pair, max_new_tokens=4), timeout=60))
    assert short[-1].HasField("summary")
    assert metric_value(scorer.metrics(), "specwire_scorer_queue_depth") == 0


def test_scorer_health_is_not_serving_while_its_queue_is_full(scorer_factory, extractor, pair):
    """--max_queue=1: one long job runs and one waits, so a third would be refused: health says
    NOT_SERVING for the server and the Scorer service; SERVING again once the waiting job is
    cancelled and the queue has room."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    scorer = scorer_factory(extractor.address,
                            args=("--max_queue=1", "--max_new_tokens_limit=100000"))
    serving = health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(scorer.address) as ch:
        def status(service: str) -> int:
            return health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=10).status

        assert status("") == serving and status("specwire.v1.Scorer") == serving
        running = stub(scorer).Score(long_request(pair), timeout=120)
        assert next(running).HasField("contract")  # the worker has taken it: the queue is empty
        queued = stub(scorer).Score(long_request(pair), timeout=120)
        for service in ("", "specwire.v1.Scorer"):
            wait_for(lambda: status(service) == health_pb2.HealthCheckResponse.NOT_SERVING, 30,
                     f"health of {service!r} to say NOT_SERVING")
        queued.cancel()
        for service in ("", "specwire.v1.Scorer"):
            wait_for(lambda: status(service) == serving, 30,
                     f"health of {service!r} to say SERVING again")
        running.cancel()
