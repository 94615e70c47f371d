"""Acceptance statistics on the committed trained pair (models/tiny-qwen3 + tiny-qwen3-dflash):

1. Teacher-forced acceptance at T > 0 (specwire-score --temperature): τ_prob and α per position
   equal an independent computation here (transformers target logits, dflash's drafter code path,
   the greedy replay's block schedule), equal a direct Monte-Carlo simulation of the
   teacher-forced rule within its sampling error, and at T = 0 equal greedy τ.
2. Paired comparison (specwire-score --compare): two drafter directories scored on the same
   trajectories, and two report files; mismatched reports are refused.
3. The HTML reports rendered by headless Chromium: intervals and charts on the page, the
   screenshot not blank, no script errors.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from extractor_harness import THREADS
from scorer_harness import scorer_binary

import dflash_fixtures as F
from hf_fixtures import load_hf_model
from shipped_models import DRAFTER, PROMPTS, REPO, TARGET

MAX_NEW_TOKENS = 40
N_PROMPTS = 4
SETTINGS = [(0.0, 1.0, 0), (0.7, 0.9, 50), (1.0, 1.0, 0)]  # (temperature, top_p, top_k)


def run_score(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([str(scorer_binary("specwire-score")), *args, "--dtype=float32",
                          f"--threads={THREADS}", "--cache_dir=none",
                          f"--target_checkpoint={TARGET}", "--quiet"],
                         capture_output=True, text=True, timeout=600)
    if check:
        assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def target():
    return load_hf_model(TARGET, torch.float32)


@pytest.fixture(scope="module")
def drafter():
    return F.load_drafter(DRAFTER)


@pytest.fixture(scope="module")
def trajectories(target) -> list[list[int]]:
    """The first prompts (HF-tokenized) and their greedy completions (stopping at EOS)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line]
    eos = target.generation_config.eos_token_id
    out = []
    for text in texts[:N_PROMPTS]:
        ids = tok.encode(text, add_special_tokens=False).ids
        ref = F.dflash_reference(F.load_drafter(DRAFTER), target, ids, MAX_NEW_TOKENS, [eos])
        out.append((ids, ids + ref[0]))
    return out


@pytest.fixture(scope="module")
def report(extractor, trajectories, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("score")
    tokens = ";".join(",".join(map(str, p)) for p, _ in trajectories)
    temps = ",".join(f"{t}:{p}:{k}" for t, p, k in SETTINGS)
    res = run_score([f"--extractor={extractor.address}", f"--drafter={DRAFTER}",
                     f"--tokens={tokens}", f"--max_new_tokens={MAX_NEW_TOKENS}", "--ddtree=8",
                     f"--temperature={temps}", "--token_window=16",
                     f"--json_out={root / 'report.json'}", f"--html_out={root / 'report.html'}",
                     f"--vllm_synthetic_out={root / 'vllm.json'}"])
    print(res.stdout)
    r = json.loads((root / "report.json").read_text())
    r["_dir"] = str(root)
    r["_stdout"] = res.stdout
    return r


def distribution(logits: np.ndarray, temperature: float, top_p: float, top_k: int) -> np.ndarray:
    """The sampling distribution of one row: temperature, then top-k, then top-p (HF's order)."""
    logits = logits.astype(np.float64)
    if temperature == 0:
        p = np.zeros_like(logits)
        p[int(np.argmax(logits))] = 1
        return p
    z = logits / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.lexsort((np.arange(len(p)), -p))  # most likely first, lower id on ties
    keep = order[:top_k] if 0 < top_k < len(p) else order
    kept = p[keep] / p[keep].sum()
    mass_before = np.concatenate([[0.0], np.cumsum(kept)[:-1]])
    keep = keep[(mass_before < top_p) | (np.arange(len(keep)) == 0)]
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()


def blocks_of(drafter, target, trajectory: list[int], prompt_len: int, step_lengths: list[int]):
    """Per block of the greedy schedule: (drafter logits [m, V], target logits [m, V]) for the
    draft positions inside the trajectory (m = min(len - 1, T - 2 - start))."""
    T, B = len(trajectory), drafter.block_size
    max_length = prompt_len + MAX_NEW_TOKENS
    with torch.inference_mode():
        out = target(torch.tensor([trajectory]), use_cache=False)
    target_logits = out.logits[0].float().numpy()  # row t: the token at t + 1
    features = F.context_features(target, drafter, trajectory)
    steps, start = [], prompt_len
    for produced in step_lengths:
        steps.append({"context_end": start, "anchor": trajectory[start],
                      "len": min(B, max_length - start)})
        start += produced
    drafted = F.dflash_draft_steps(drafter, target, features, steps)
    result = []
    for step, (_, logits) in zip(steps, drafted):
        s, length = step["context_end"], step["len"]
        m = min(length - 1, T - 2 - s)
        if m < 1:
            result.append((np.zeros((0, 1)), np.zeros((0, 1))))
            continue
        result.append((logits[:m].numpy(), target_logits[s:s + m]))
    return result


def alphas(block, setting, rule) -> np.ndarray:
    draft, tgt = block
    out = []
    for k in range(draft.shape[0]):
        p = distribution(tgt[k], *setting)
        if rule == "argmax_draft":
            out.append(p[int(np.argmax(draft[k]))])
        else:
            out.append(np.minimum(p, distribution(draft[k], *setting)).sum())
    return np.array(out)


@pytest.fixture(scope="module")
def reference_blocks(report, trajectories, drafter, target):
    prompts = sorted(report["prompts"], key=lambda p: p["prompt_index"])
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [blocks_of(drafter, target, traj, len(prompt), p["step_lengths"])
                for (prompt, traj), p in zip(trajectories, prompts)]
    finally:
        torch.set_num_threads(saved)


def test_tau_prob_matches_an_independent_computation(report, reference_blocks):
    got = report["summary"]["temperature"]
    assert len(got) == 2 * len(SETTINGS)
    B = report["summary"]["block_size"]
    for entry in got:
        setting = (entry["temperature"], entry["top_p"], entry["top_k"])
        assert entry["teacher_forced"] is True
        means, alpha_sum, alpha_n, blocks = [], np.zeros(B - 1), np.zeros(B - 1), 0
        for response in reference_blocks:
            taus = []
            for block in response:
                a = alphas(block, setting, entry["rule"])
                taus.append(1 + np.cumprod(a).sum())
                alpha_sum[:len(a)] += a
                alpha_n[:len(a)] += 1
            blocks += len(taus)
            if taus:
                means.append(np.mean(taus))
        assert entry["blocks"] == blocks
        assert entry["tau_prob"] == pytest.approx(np.mean(means), abs=1e-4), entry
        want_alpha = np.where(alpha_n > 0, alpha_sum / np.maximum(alpha_n, 1), 0)
        assert entry["alpha"] == pytest.approx(want_alpha.tolist(), abs=1e-4)
        assert entry["alpha_blocks"] == alpha_n.astype(int).tolist()
        lo, hi = entry["tau_prob_ci"]
        assert lo <= entry["tau_prob"] <= hi


def test_tau_prob_at_zero_temperature_is_greedy_tau(report):
    s = report["summary"]
    zero = [e for e in s["temperature"] if e["temperature"] == 0]
    assert {e["rule"] for e in zero} == {"argmax_draft", "draft_distribution"}
    for e in zero:
        assert e["tau_prob"] == pytest.approx(s["tau_mean_of_means"], rel=1e-12)
        assert e["tau_prob_pooled"] == pytest.approx(s["tau_pooled"], rel=1e-12)
    # Sampling at T > 0 accepts less than greedy on the greedy trajectory's own context.
    hot = [e for e in s["temperature"] if e["temperature"] == 1.0]
    assert all(e["tau_prob"] < s["tau_mean_of_means"] for e in hot)


def test_tau_prob_equals_a_monte_carlo_simulation(report, reference_blocks):
    """Draw the draft (argmax, or from q), accept position k with min(1, p/q) while every
    earlier one was accepted; the mean accepted length + 1 is τ_prob up to sampling error."""
    rng = np.random.default_rng(12345)
    n = 4000
    for entry in report["summary"]["temperature"]:
        if entry["temperature"] == 0:
            continue
        setting = (entry["temperature"], entry["top_p"], entry["top_k"])
        means, variances = [], []
        for response in reference_blocks:
            sims = []
            for draft, tgt in response:
                accepted = np.ones(n, dtype=bool)
                length = np.ones(n)
                for k in range(draft.shape[0]):
                    p = distribution(tgt[k], *setting)
                    if entry["rule"] == "argmax_draft":
                        x = np.full(n, int(np.argmax(draft[k])))
                        ratio = p[x]
                    else:
                        q = distribution(draft[k], *setting)
                        x = rng.choice(len(q), size=n, p=q)
                        ratio = np.minimum(1.0, p[x] / q[x])
                    accepted &= rng.random(n) < ratio
                    length += accepted
                sims.append(length)
            if sims:
                per_sim = np.mean(np.stack(sims), axis=0)  # the response's mean block length
                means.append(per_sim.mean())
                variances.append(per_sim.var() / n)
        mc = np.mean(means)
        se = np.sqrt(np.sum(variances)) / len(means)
        assert abs(mc - entry["tau_prob"]) <= 4 * se + 1e-9, (entry["rule"], setting, mc,
                                                              entry["tau_prob"], se)


def test_intervals_windows_and_capacity_in_the_report(report):
    # The report names the target by its contract, canary fingerprint included.
    assert [t["tap"] for t in report["contract"]["canary"]["taps"]][-1] == "final_norm"
    s = report["summary"]
    lo, hi = s["tau_mean_of_means_ci"]
    assert lo <= s["tau_mean_of_means"] <= hi and lo < hi
    assert s["bootstrap_resamples"] == 1000 and s["confidence"] == 0.95
    assert s["ddtree_tau"]["8"]["tau_mean_of_means_ci"] is not None
    # Per-position counts: the conditional rates are accepted / reached, unreached ones null.
    for k, (rate, reached) in enumerate(zip(s["per_position_acceptance"],
                                            s["per_position_reached"])):
        if reached == 0:
            assert rate is None
        else:
            assert rate == pytest.approx(s["num_accepted_tokens_per_pos"][k] / reached)
    # Every step lies in one window; windows cover 16 tokens each.
    assert sum(w["steps"] for w in s["windows"]) == s["steps"]
    assert all(w["last_token"] - w["first_token"] == 15 for w in s["windows"])
    cap = report["capacity"]
    k = cap["recommended_k"]
    speedups = [row["speedup"] for row in cap["draft_lengths"]]
    assert speedups[k - 1] == max(speedups)
    vllm = json.loads((Path(report["_dir"]) / "vllm.json").read_text())
    assert vllm["num_speculative_tokens"] == k
    rates = vllm["synthetic_acceptance_rates"]
    assert rates == sorted(rates, reverse=True)
    assert rates[0] == pytest.approx(s["num_accepted_tokens_per_pos"][0] / s["steps"])
    settings = report["settings"]
    assert settings["max_new_tokens"] == MAX_NEW_TOKENS and settings["prompts"] == N_PROMPTS
    # The headline τ is printed with its interval and settings.
    assert f"[{lo:.3f}, {hi:.3f}]" in report["_stdout"]
    assert f"max_new_tokens {MAX_NEW_TOKENS}, block size 16, dtype float32" in report["_stdout"]


@pytest.fixture(scope="module")
def weaker_drafter(tmp_path_factory, drafter) -> Path:
    """The committed drafter with noise on its weights: a second checkpoint to compare."""
    out = tmp_path_factory.mktemp("weaker")
    model = F.load_drafter(DRAFTER)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02 * p.std().clamp_min(1e-3))
    F.save_drafter(model, out)
    return out


@pytest.fixture(scope="module")
def comparison(extractor, weaker_drafter, trajectories, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("compare")
    tokens = ";".join(",".join(map(str, p)) for p, _ in trajectories)
    res = run_score([f"--extractor={extractor.address}", f"--compare={DRAFTER}",
                     str(weaker_drafter), f"--tokens={tokens}",
                     f"--max_new_tokens={MAX_NEW_TOKENS}", "--ddtree=8", "--token_window=16",
                     f"--json_out={root / 'compare.json'}",
                     f"--html_out={root / 'compare.html'}"])
    print(res.stdout)
    c = json.loads((root / "compare.json").read_text())
    c["_dir"] = str(root)
    return c


def test_compare_two_drafters_on_the_same_trajectories(comparison, report):
    d = comparison["dflash"]
    assert d["prompts"] == N_PROMPTS
    assert d["tau_a"] == pytest.approx(report["summary"]["tau_mean_of_means"], rel=1e-12)
    assert d["delta"] == pytest.approx(d["tau_b"] - d["tau_a"])
    lo, hi = d["delta_ci"]
    assert lo <= d["delta"] <= hi
    assert comparison["delta_convention"] == "B - A"
    assert "8" in comparison["ddtree"]
    assert [p["prompt_index"] for p in comparison["prompts"]] == list(range(N_PROMPTS))


def test_compare_report_files_and_refusals(report, comparison, tmp_path):
    path = Path(report["_dir"]) / "report.json"
    res = run_score([f"--compare={path}", str(path), f"--json_out={tmp_path / 'self.json'}"])
    same = json.loads((tmp_path / "self.json").read_text())["dflash"]
    assert same["delta"] == 0 and same["delta_ci"] == [0, 0] and same["ties"] == N_PROMPTS
    assert "no significant difference" in res.stdout
    # A report at another generation length does not pair.
    other = json.loads(path.read_text())
    other["request"]["max_new_tokens"] = MAX_NEW_TOKENS * 2
    (tmp_path / "other.json").write_text(json.dumps(other))
    res = run_score([f"--compare={path}", str(tmp_path / "other.json")], check=False)
    assert res.returncode == 1 and "FAILED_PRECONDITION" in res.stderr
    assert "max_new_tokens" in res.stderr
    # A changed trajectory does not pair either.
    other = json.loads(path.read_text())
    other["prompts"][2]["trajectory_digest"] = "xxh3-128:" + "0" * 32
    (tmp_path / "other.json").write_text(json.dumps(other))
    res = run_score([f"--compare={path}", str(tmp_path / "other.json")], check=False)
    assert res.returncode == 1 and "prompt 2" in res.stderr
    (tmp_path / "bad.json").write_text("{\"summary\": 3}")
    res = run_score([f"--compare={path}", str(tmp_path / "bad.json")], check=False)
    assert res.returncode == 2 and "bad.json" in res.stderr
    res = run_score([f"--compare={path}"], check=False)
    assert res.returncode == 2 and "--compare A B" in res.stderr


# --- the HTML reports in a real browser ----------------------------------------------------------

def chromium() -> str:
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        exe = shutil.which(name) or (f"/usr/lib/chromium/{name}"
                                     if Path(f"/usr/lib/chromium/{name}").exists() else None)
        if exe:
            return exe
    pytest.fail("headless Chromium not installed (scripts/setup.sh installs "
                "chromium-headless-shell)", pytrace=False)


def png_pixels(path: Path) -> np.ndarray:
    from PIL import Image
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int32)


def render(html: Path, out: Path) -> tuple[np.ndarray, str, str]:
    res = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--window-size=1100,2400",
         f"--screenshot={out}", html.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and out.exists(), res.stderr[-2000:]
    dom = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", html.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return png_pixels(out), res.stderr + dom.stderr, dom.stdout


def assert_not_blank(pixels: np.ndarray):
    colors = {tuple(p) for p in pixels[::7, ::7].reshape(-1, 3)}
    ink = (pixels.sum(axis=2) < 600).mean()
    assert len(colors) > 20, f"{len(colors)} colours: a blank page?"
    assert ink > 0.005, f"{ink:.4f} of the page drawn"


def assert_no_script_errors(log: str):
    bad = [line for line in log.splitlines()
           if "Uncaught" in line or ("CONSOLE" in line and "ERROR" in line)]
    assert not bad, "\n".join(bad)


def test_html_report_in_headless_chromium(report, tmp_path):
    html = Path(report["_dir"]) / "report.html"
    pixels, log, dom = render(html, tmp_path / "report.png")
    assert_not_blank(pixels)
    assert_no_script_errors(log)
    lo, hi = report["summary"]["tau_mean_of_means_ci"]
    assert f"{lo:.4f} – {hi:.4f}" in dom  # the interval is on the page
    for chart in ("per-position-acceptance", "tau-by-token-window", "capacity-speedup"):
        assert f'id="{chart}"' in dom
    assert "Teacher-forced" in dom and "Recommended k" in dom
    # The page lays out below the fold too: the screenshot's lower half is not empty.
    assert_not_blank(pixels[pixels.shape[0] // 2:])


def test_comparison_report_in_headless_chromium(comparison, tmp_path):
    html = Path(comparison["_dir"]) / "compare.html"
    pixels, log, dom = render(html, tmp_path / "compare.png")
    assert_not_blank(pixels)
    assert_no_script_errors(log)
    assert 'id="paired-scatter"' in dom and 'id="paired-delta"' in dom
    assert dom.count('class="point"') == N_PROMPTS
    lo, hi = comparison["dflash"]["delta_ci"]
    assert f"{lo:+.4f} – {hi:+.4f}" in dom


# --- chat templates: prompts prepared under the drafter's template, or refused -----------------

def test_prompts_prepared_under_another_chat_template_are_refused(extractor, tmp_path):
    from specwire_client.chat import ChatTemplate, tokenizer_encoder, write_prepared_dataset
    template = ChatTemplate((REPO / "tests" / "data" / "chat_templates" / "qwen3.jinja")
                            .read_text(), "chat_template.jinja")
    encode = tokenizer_encoder(TARGET / "tokenizer.json")
    chats = [[{"role": "user", "content": t}] for t in ("def f(x):", "import os", "class A:")]
    dataset = tmp_path / "chat.jsonl"
    record = write_prepared_dataset(dataset, chats, template, encode, add_generation_prompt=True,
                                    enable_thinking=False)
    drafter = tmp_path / "drafter"
    shutil.copytree(DRAFTER, drafter)
    trained = template.record(enable_thinking=True)  # trained with thinking on
    (drafter / "specwire_training.json").write_text(json.dumps({"chat_template":
                                                                 trained.to_json()}))
    args = [f"--extractor={extractor.address}", f"--drafter={drafter}", f"--dataset={dataset}",
            "--max_new_tokens=8", "--ddtree=", f"--json_out={tmp_path / 'r.json'}"]
    res = run_score(args, check=False)
    assert res.returncode == 1 and "FAILED_PRECONDITION" in res.stderr, res.stderr
    assert '"enable_thinking":false' in res.stderr and '"enable_thinking":true' in res.stderr
    assert "specwire_training.json" in res.stderr
    # The same record: scored, and the report says which template the prompts were made with.
    (drafter / "specwire_training.json").write_text(json.dumps({"chat_template":
                                                                 record.to_json()}))
    run_score(args)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["chat_template"] == {"digest": record.digest,
                                       "flags": {"enable_thinking": False}}
    assert report["summary"]["responses"] == 3
    # Lines that disagree are refused naming the line.
    lines = dataset.read_text().splitlines()
    other = json.loads(lines[1])
    other["chat_template"]["flags"] = {"enable_thinking": True}
    lines[1] = json.dumps(other)
    dataset.write_text("\n".join(lines) + "\n")
    res = run_score(args, check=False)
    assert res.returncode == 2 and "line 2" in res.stderr, res.stderr
