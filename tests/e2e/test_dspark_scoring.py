"""The committed DSpark drafter (models/tiny-qwen3-dspark: the DFlash drafter's backbone with a
Markov head and a confidence head, SpecForge's layout) scored as users score drafters: through
specwire-score in process and through the scorer service.

1. The report carries, beside τ, the confidence head's predicted acceptance against the observed
   (a calibration table per draft position) and the τ of each --dspark_cutoff's adaptive verify
   length. The table is recomputed here from the report's own per-prompt records, the cutoffs'
   step lengths are checked against their definition (0 never cuts, 1 always does, the tokens
   committed are the same), and the records' accepted drafts are the chain's steps.
2. The scorer service gives the same summary and records as the in-process path (the proto's
   PredictedAcceptanceSummary and PredictedAcceptanceRecord carry them), and refuses bad cutoffs
   naming the field; specwire-score refuses them naming the flag.
3. specwire-replay, with the target in its own process, prints the same calibration table.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import pytest
from extractor_harness import THREADS, ExtractorServer, build_dir
from scorer_harness import ScorerServer

from specwire_client import ExtractorClient
from specwire_client._generated.proto.specwire.v1 import scorer_pb2 as spb
from shipped_models import MODELS, PROMPTS

DRAFTER = MODELS / "tiny-qwen3-dspark"
MAX_NEW_TOKENS = 64
MAX_PROMPTS = 12
CUTOFFS = "0,0.5,1"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """An extractor, a scorer on it, and the held-out prompts as the target's token ids (one
    file for specwire-score's --prompts_file and specwire-replay's --tokens_file)."""
    root = tmp_path_factory.mktemp("dspark")
    extractor = ExtractorServer(MODELS / "tiny-qwen3", tmp_path_factory.mktemp("extractor"),
                                dtype="float32", metrics=False).start()
    scorer = ScorerServer(extractor.address, tmp_path_factory.mktemp("scorer"),
                          tmp_path_factory.mktemp("cache")).start()
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()]
    with ExtractorClient(extractor.address, timeout=60) as client:
        ids = client.tokenize(texts[:MAX_PROMPTS])
    prompts = root / "prompts.json"
    prompts.write_text(json.dumps(ids))
    yield extractor, scorer, prompts
    scorer.stop()
    extractor.stop()


def score(where: list[str], prompts: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    exe = build_dir() / "services" / "scorer" / "specwire-score"
    return subprocess.run(
        [str(exe), *where, f"--drafter={DRAFTER}", f"--prompts_file={prompts}",
         f"--max_new_tokens={MAX_NEW_TOKENS}", "--dtype=float32",
         f"--threads={THREADS}", "--ddtree=", f"--dspark_cutoff={CUTOFFS}", f"--json_out={out}",
         "--quiet", *extra], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def reports(servers, tmp_path_factory):
    extractor, scorer, prompts = servers
    root = tmp_path_factory.mktemp("reports")
    out = {}
    for name, where in (("in_process", [f"--extractor={extractor.address}", "--cache_dir=none",
                                        f"--target_checkpoint={MODELS / 'tiny-qwen3'}"]),
                        ("service", [f"--scorer={scorer.address}"])):
        r = score(where, prompts, root / f"{name}.json")
        assert r.returncode == 0, r.stderr[-3000:]
        out[name] = json.loads((root / f"{name}.json").read_text())
    return out


def recomputed_calibration(report: dict) -> dict:
    reached, accepted, predicted = {}, {}, {}
    for p in report["prompts"]:
        rec = p["predicted_acceptance"]
        for a, c in zip(rec["accepted"], rec["predicted"]):
            for k, ck in enumerate(c, start=1):
                if a < k - 1:
                    break
                reached[k] = reached.get(k, 0) + 1
                predicted[k] = predicted.get(k, 0.0) + ck
                accepted[k] = accepted.get(k, 0) + (a >= k)
    return {k: (reached[k], predicted[k] / reached[k], accepted[k] / reached[k]) for k in reached}


def test_report_carries_the_calibration_table(reports):
    r = reports["in_process"]
    assert r["drafter"]["method"] == "dspark"
    pa = r["summary"]["predicted_acceptance"]
    want = recomputed_calibration(r)
    table = {row["position"]: row for row in pa["calibration"]}
    assert sorted(table) == sorted(want) and len(table) >= 4
    for k, row in table.items():
        blocks, pred, obs = want[k]
        assert row["blocks"] == blocks, k
        assert row["observed"] == pytest.approx(obs, abs=1e-12), k
        # The records are fp32 as the report prints them; the table sums them in fp64.
        assert row["predicted"] == pytest.approx(pred, rel=1e-6), k
        assert row["gap"] == pytest.approx(row["predicted"] - row["observed"], abs=1e-12)
    # A trained confidence head: predictions within 0.25 of the observed where 30+ blocks say.
    assert all(abs(row["gap"]) < 0.25 for row in pa["calibration"] if row["blocks"] >= 30), pa
    print("calibration:", [(k, round(v[1], 3), round(v[2], 3), v[0]) for k, v in want.items()])


def test_records_and_cutoffs_follow_their_definition(reports):
    r = reports["in_process"]
    pa = r["summary"]["predicted_acceptance"]
    assert [c["cutoff"] for c in pa["cutoffs"]] == [0.0, 0.5, 1.0]
    for p in r["prompts"]:
        rec, steps = p["predicted_acceptance"], p["step_lengths"]
        # The records are the chain's steps: a + 1 committed, the last cut at the trajectory's end.
        assert len(rec["accepted"]) == len(steps)
        assert [a + 1 for a in rec["accepted"][:-1]] == steps[:-1]
        assert not steps or rec["accepted"][-1] + 1 >= steps[-1]
        # Step i's block: min(B, max_length − start) positions, the anchor and its drafts.
        start, B = p["prompt_tokens"], r["summary"]["block_size"]
        for s, c in enumerate(rec["predicted"]):
            assert len(c) == min(B, p["prompt_tokens"] + MAX_NEW_TOKENS - start) - 1, (s, start)
            start += steps[s]
        assert all(0.0 <= x <= 1.0 for c in rec["predicted"] for x in c)
        cuts = {c["cutoff"]: c["step_lengths"] for c in rec["cutoffs"]}
        assert cuts[0.0] == steps
        assert all(s == 1 for s in cuts[1.0])
        assert all(sum(v) == sum(steps) for v in cuts.values())
    tau = {c["cutoff"]: c for c in pa["cutoffs"]}
    assert tau[0.0]["tau_mean_of_means"] == pytest.approx(r["summary"]["tau_mean_of_means"])
    assert tau[1.0]["tau_pooled"] == pytest.approx(1.0)
    assert tau[1.0]["tau_pooled"] <= tau[0.5]["tau_pooled"] <= tau[0.0]["tau_pooled"]
    assert tau[0.5]["tau_mean_of_means_ci"] is not None


def test_service_reports_the_same(reports):
    a, b = reports["in_process"], reports["service"]
    pa, pb = a["summary"]["predicted_acceptance"], b["summary"]["predicted_acceptance"]
    assert [r["blocks"] for r in pa["calibration"]] == [r["blocks"] for r in pb["calibration"]]
    for x, y in zip(pa["calibration"], pb["calibration"]):
        # The predictions come from the batched chain replay: fp32 rounding of another batch.
        assert y["predicted"] == pytest.approx(x["predicted"], rel=1e-6)
        assert y["observed"] == x["observed"]
    for x, y in zip(pa["cutoffs"], pb["cutoffs"]):
        assert (x["cutoff"], x["steps"]) == (y["cutoff"], y["steps"])
        assert y["tau_mean_of_means"] == pytest.approx(x["tau_mean_of_means"], rel=1e-12)
        assert y["tau_mean_of_means_ci"] == pytest.approx(x["tau_mean_of_means_ci"], rel=1e-12)
    by_index = {p["prompt_index"]: p for p in a["prompts"]}
    for p in b["prompts"]:
        mine = by_index[p["prompt_index"]]["predicted_acceptance"]
        assert p["predicted_acceptance"]["accepted"] == mine["accepted"]
        assert p["predicted_acceptance"]["cutoffs"] == mine["cutoffs"]
        for u, v in zip(p["predicted_acceptance"]["predicted"], mine["predicted"]):
            assert u == pytest.approx(v, rel=1e-6)  # fp32, another batch


def test_bad_cutoffs_are_refused_by_name(servers, tmp_path):
    _, scorer, prompts = servers
    r = score([f"--scorer={scorer.address}"], prompts, tmp_path / "bad.json",
              "--dspark_cutoff=0.5,1.5")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "--dspark_cutoff" in r.stderr and "1.5" in r.stderr, r.stderr[-2000:]
    request = spb.ScoreRequest(drafter_path=str(DRAFTER), max_new_tokens=8,
                               prompts=[spb.PromptInput(tokens={"ids": [1, 2, 3]})],
                               predicted_acceptance_cutoffs=[0.5, -0.1])
    with pytest.raises(grpc.RpcError) as e:
        list(scorer.stub().Score(request, timeout=60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "predicted_acceptance_cutoffs[1]" in e.value.details(), e.value.details()


def test_replay_prints_the_same_table(servers, reports):
    """specwire-replay (the target in its own process, the same float32 forward) drafts the
    same trajectories and prints the same table and cutoff τ."""
    _, _, prompts = servers
    exe = build_dir() / "services" / "scorer" / "specwire-replay"
    res = subprocess.run(
        [str(exe), "--drafter", str(DRAFTER), "--target_checkpoint", str(MODELS / "tiny-qwen3"),
         "--tokens_file", str(prompts), "--max_new_tokens", str(MAX_NEW_TOKENS), "--ddtree",
         "none", "--dtype", "float32", "--threads", THREADS, "--dspark_cutoff", CUTOFFS],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    replay = json.loads(res.stdout.strip().splitlines()[-1])
    r = reports["in_process"]
    assert [x["step_lengths"] for x in replay["responses"]] == \
        [p["step_lengths"] for p in sorted(r["prompts"], key=lambda p: p["prompt_index"])]
    mine, theirs = r["summary"]["predicted_acceptance"], replay["predicted_acceptance"]
    assert [x["blocks"] for x in mine["calibration"]] == \
        [x["blocks"] for x in theirs["calibration"]]
    for x, y in zip(mine["calibration"], theirs["calibration"]):
        assert y["observed"] == x["observed"]
        assert y["predicted"] == pytest.approx(x["predicted"], rel=1e-6)
    for x, y in zip(mine["cutoffs"], theirs["cutoffs"]):
        assert y["tau_mean_of_means"] == pytest.approx(x["tau_mean_of_means"], rel=1e-12)
