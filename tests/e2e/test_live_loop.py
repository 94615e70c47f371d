"""The real loop (specwire-score --live) on the committed models, against the greedy replay.

1. Greedy live = replay, step for step: the shipped pair (tiny-qwen3 + tiny-qwen3-dflash) and the
   hybrid target (tiny-qwen3_5, Gated DeltaNet layers, with the same drafter), on the held-out
   prompts: every prompt's trajectory and step lengths equal the replay's, and the scorer's own
   self-check (live.self_check_prompts) reports every checked prompt as matching.
2. At T > 0 the live loop is seeded: the same seed gives the same report, another seed another;
   both rules run, and their results are labelled with the rule.
3. The other families (EAGLE-3's chain, DFlash2's selector path) run the same loop: greedy equals
   their replay on every checked prompt.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from extractor_harness import THREADS, ExtractorServer, build_dir
from shipped_models import DRAFTER, MODELS, PROMPTS

MAX_NEW_TOKENS = 96


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-qwen3_5"])
def target(request, tmp_path_factory):
    server = ExtractorServer(MODELS / request.param, tmp_path_factory.mktemp("extractor"),
                             dtype="float32", metrics=False).start()
    yield request.param, server
    server.stop()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """The shipped target alone (the committed EAGLE-3 and DFlash2 drafters were trained on it)."""
    server = ExtractorServer(MODELS / "tiny-qwen3", tmp_path_factory.mktemp("dense"),
                             dtype="float32", metrics=False).start()
    yield "tiny-qwen3", server
    server.stop()


def score(server: ExtractorServer, target: str, out: Path, *extra: str,
          drafter: Path = DRAFTER) -> dict:
    exe = build_dir() / "services" / "scorer" / "specwire-score"
    if not exe.exists():
        pytest.fail(f"{exe} not built (set SPECWIRE_BUILD_DIR)", pytrace=False)
    res = subprocess.run(
        [str(exe), f"--extractor={server.address}", f"--drafter={drafter}",
         f"--dataset={PROMPTS}", f"--max_new_tokens={MAX_NEW_TOKENS}", "--dtype=float32",
         f"--threads={THREADS}", "--cache_dir=none", f"--target_checkpoint={MODELS / target}",
         "--ddtree=", f"--json_out={out}", "--quiet", *extra],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


def by_prompt(report: dict) -> list[dict]:
    return sorted(report["prompts"], key=lambda p: p["prompt_index"])


def test_greedy_live_equals_the_replay_step_for_step(target, tmp_path):
    name, server = target
    replay = score(server, name, tmp_path / "replay.json")
    live = score(server, name, tmp_path / "live.json", "--live=0", "--live_self_check=1000")
    assert replay["summary"]["loop"] == "replay" and live["summary"]["loop"] == "live"
    r, l = by_prompt(replay), by_prompt(live)
    assert len(r) == len(l) >= 16
    for a, b in zip(r, l):
        i = a["prompt_index"]
        assert a["trajectory_digest"] == b["trajectory_digest"], f"{name} prompt {i}: trajectory"
        assert a["step_lengths"] == b["step_lengths"], (
            f"{name} prompt {i}:\n replay {a['step_lengths']}\n live   {b['step_lengths']}")
        assert a["finish_reason"] == b["finish_reason"]
    s = live["summary"]
    assert s["tau_mean_of_means"] == replay["summary"]["tau_mean_of_means"]
    check = s["live"]
    assert check["self_check_prompts"] == len(l)
    assert check["self_check_matching"] == len(l), check["self_check_mismatches"]
    assert check["verify_calls"] >= s["steps"]  # steps past the completion's end are cut
    print(f"{name}: tau {s['tau_mean_of_means']:.3f} live = replay on {len(l)} prompts, "
          f"{check['verify_calls']} verifications")


def test_sampled_live_loop_is_seeded(dense, tmp_path):
    name, server = dense
    args = ("--live=0.7:0.95:20", "--max_prompts=6")
    a = score(server, name, tmp_path / "a.json", *args, "--live_seed=4")
    b = score(server, name, tmp_path / "b.json", *args, "--live_seed=4")
    c = score(server, name, tmp_path / "c.json", *args, "--live_seed=5")
    d = score(server, name, tmp_path / "d.json", *args, "--live_seed=4",
              "--live_rule=draft_distribution")
    assert [p["step_lengths"] for p in by_prompt(a)] == [p["step_lengths"] for p in by_prompt(b)]
    assert [p["trajectory_digest"] for p in by_prompt(a)] == \
        [p["trajectory_digest"] for p in by_prompt(b)]
    assert [p["trajectory_digest"] for p in by_prompt(a)] != \
        [p["trajectory_digest"] for p in by_prompt(c)]
    for r, rule in ((a, "argmax_draft"), (d, "draft_distribution")):
        live = r["summary"]["live"]
        assert live["rule"] == rule and live["temperature"] == 0.7
        assert live["self_check_prompts"] == 0  # the self-check is for greedy verification
        assert r["summary"]["tau_mean_of_means"] >= 1.0
        print(f"T 0.7 {rule}: tau {r['summary']['tau_mean_of_means']:.3f}")


@pytest.mark.parametrize("drafter", ["tiny-qwen3-eagle3", "tiny-qwen3-dflash2", "tiny-qwen3-mtp"])
def test_other_families_live(dense, drafter, tmp_path):
    """EAGLE-3 (its chain), DFlash2 (its selector's path) and the MTP head (its chain) through the
    live loop: greedy equals
    their replay on every checked prompt; at T > 0 both rules run and are labelled."""
    name, server = dense
    greedy = score(server, name, tmp_path / "g.json", "--max_prompts=6", "--live=0",
                   "--live_self_check=6", drafter=MODELS / drafter)
    check = greedy["summary"]["live"]
    assert check["self_check_matching"] == check["self_check_prompts"] == 6, check
    assert greedy["summary"]["tau_mean_of_means"] > 1.5
    for rule in ("argmax_draft", "draft_distribution"):
        r = score(server, name, tmp_path / f"{rule}.json", "--max_prompts=6", "--live=0.7:0.95:20",
                  f"--live_rule={rule}", drafter=MODELS / drafter)
        assert r["summary"]["live"]["rule"] == rule
        assert 1.0 <= r["summary"]["tau_mean_of_means"] <= r["summary"]["block_size"]
