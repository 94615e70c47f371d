"""What a serving engine measured: speculative-decoding acceptance read from the engine's own
records, in their exact formats.

    vLLM, Prometheus   the counters vllm:spec_decode_num_drafts_total, ..._num_draft_tokens_total,
                       ..._num_accepted_tokens_total and ..._num_accepted_tokens_per_pos_total
                       {position}, read from /metrics text before and after the requests (the
                       difference; "before" may be omitted for a fresh engine); summed over
                       engines, filtered by model_name when several models are served
    vLLM, per request  metrics.speculative_decoding of each completion response
                       (--per-request-spec-decode-metrics summary|detailed): the histogram of
                       accepted drafts per verify step, and with "detailed" the accepted count of
                       every step in order
    SGLang             meta_info of each /generate response: spec_verify_ct,
                       spec_accept_histogram (verify steps that accepted exactly n drafts),
                       spec_accept_token_num, spec_draft_token_num, completion_tokens

All of them give the same numbers: drafts (verify steps), draft tokens, accepted drafts, and
per draft position the drafts accepted there (a draft accepted at position i was accepted at
every position before it, so the per-position counts and the histogram determine each other).
Accepted length AL = 1 + accepted / drafts (the engines' convention: the target's own token
included), pooled over every step. Per-request records also give each request's own mean (the
mean of means z-lab's and SpecForge's benchmarks print) and can be paired with a canonical run.

drive_openai() is the mode that drives the engine itself: it sends the prompts to an
OpenAI-compatible /v1/completions endpoint (token ids in, so no template or tokenizer stands
between the two sides), reads /metrics before and after, and keeps every response.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

VLLM_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
    "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}


class ServedFormatError(ValueError):
    """A served record that is not in the format it claims: names the file, line and field."""


@dataclasses.dataclass
class ServedRequest:
    """One request's acceptance as the engine recorded it."""

    histogram: list[int]  # verify steps that accepted exactly j drafts, j = 0..k
    num_draft_tokens: int
    per_step_accepted: Optional[list[int]] = None  # in order ("detailed" records only)
    completion_tokens: Optional[int] = None

    @property
    def steps(self) -> int:
        return sum(self.histogram)

    @property
    def accepted(self) -> int:
        return sum(j * n for j, n in enumerate(self.histogram))

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else 1.0


@dataclasses.dataclass
class ServedAcceptance:
    """A serving engine's acceptance over a set of requests."""

    engine: str   # "vllm" | "sglang"
    source: str   # "prometheus" | "per-request"
    k: int        # draft tokens per verify step (num_speculative_tokens)
    num_drafts: int
    num_draft_tokens: int
    num_accepted: int
    accepted_per_pos: list[int]  # size k: drafts accepted at position i (0-based)
    requests: Optional[list[ServedRequest]] = None  # per-request sources, in prompt order
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # what was asked for

    @property
    def al_pooled(self) -> float:
        return 1.0 + self.num_accepted / self.num_drafts if self.num_drafts else 1.0

    @property
    def al_mean_of_means(self) -> Optional[float]:
        if not self.requests:
            return None
        reqs = [r for r in self.requests if r.steps]
        return sum(r.mean_acceptance_length for r in reqs) / len(reqs) if reqs else None

    def acceptance_at(self) -> list[float]:
        """Per position i: drafts accepted at i / drafts (vLLM's unconditional rate)."""
        return [c / self.num_drafts if self.num_drafts else 0.0 for c in self.accepted_per_pos]

    def histogram(self) -> list[int]:
        """Verify steps that accepted exactly j drafts, j = 0..k."""
        c = list(self.accepted_per_pos) + [0]
        return [(self.num_drafts if j == 0 else c[j - 1]) - c[j] for j in range(self.k + 1)]

    def to_json(self) -> dict[str, Any]:
        d = {"engine": self.engine, "source": self.source, "k": self.k,
             "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
             "num_accepted_tokens": self.num_accepted,
             "num_accepted_tokens_per_pos": list(self.accepted_per_pos),
             "al_pooled": self.al_pooled, "al_mean_of_means": self.al_mean_of_means,
             "settings": dict(self.settings)}
        if self.requests is not None:
            d["requests"] = len(self.requests)
        return d


def per_pos_from_histogram(histogram: Sequence[int]) -> list[int]:
    """Drafts accepted at position i (0-based) from the histogram of accepted counts."""
    k = len(histogram) - 1
    return [sum(histogram[j] for j in range(i + 1, k + 1)) for i in range(k)]


def from_requests(engine: str, requests: Sequence[ServedRequest],
                  settings: Mapping[str, Any] | None = None) -> ServedAcceptance:
    if not requests:
        raise ServedFormatError("no requests")
    k = max(len(r.histogram) for r in requests) - 1
    hist = [0] * (k + 1)
    for r in requests:
        for j, n in enumerate(r.histogram):
            hist[j] += n
    return ServedAcceptance(engine, "per-request", k, sum(hist),
                            sum(r.num_draft_tokens for r in requests),
                            sum(j * n for j, n in enumerate(hist)), per_pos_from_histogram(hist),
                            list(requests), dict(settings or {}))


# Prometheus text exposition.

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


def _labels(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise ServedFormatError(f"{where}: malformed labels {{{text}}}")
        out[m.group(1)] = (m.group(2).replace("\\\\", "\x00").replace('\\"', '"')
                           .replace("\\n", "\n").replace("\x00", "\\"))
        pos = m.end()
    return out


def parse_prometheus(text: str, source: str = "metrics") -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition: (name, labels, value)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _SAMPLE.match(s)
        if not m:
            raise ServedFormatError(f"{source}:{n}: not a Prometheus sample: {s[:120]!r}")
        try:
            value = float(m.group(4))
        except ValueError:
            raise ServedFormatError(f"{source}:{n}: {m.group(1)}: value {m.group(4)!r} is not "
                                    "a number") from None
        out.append((m.group(1), _labels(m.group(3) or "", f"{source}:{n}"), value))
    return out


def _vllm_counts(text: str, source: str, model_name: Optional[str]) -> dict[str, Any]:
    counts: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": {},
                              "models": set(), "seen": set()}
    for name, labels, value in parse_prometheus(text, source):
        base = name[:-len("_total")] if name.endswith("_total") else None
        key = next((k for k, v in VLLM_COUNTERS.items() if v == base), None)
        if key is None:
            continue
        if model_name is not None and labels.get("model_name") != model_name:
            continue
        if value < 0 or not math.isfinite(value) or value != int(value):
            raise ServedFormatError(f"{source}: {name}{labels}: {value} is not a count")
        counts["models"].add(labels.get("model_name", ""))
        counts["seen"].add(key)
        if key == "per_pos":
            if "position" not in labels or not labels["position"].isdigit():
                raise ServedFormatError(f"{source}: {name}: a sample without a numeric "
                                        "position label")
            p = int(labels["position"])
            counts["per_pos"][p] = counts["per_pos"].get(p, 0) + int(value)
        else:
            counts[key] += int(value)
    if len(counts["models"]) > 1:
        raise ServedFormatError(f"{source}: counters of several models "
                                f"({sorted(counts['models'])}): name one (model_name)")
    return counts


def vllm_from_prometheus(after: str, before: str = "", *, model_name: Optional[str] = None,
                         source: str = "metrics",
                         settings: Mapping[str, Any] | None = None) -> ServedAcceptance:
    """vLLM's spec-decode counters: after − before (before "" : a fresh engine)."""
    a = _vllm_counts(after, f"{source} (after)", model_name)
    missing = [VLLM_COUNTERS[k] + "_total" for k in VLLM_COUNTERS if k not in a["seen"]]
    if missing:
        raise ServedFormatError(f"{source} (after): no {', '.join(missing)} (was the engine "
                                "started with a speculative config, and is this vLLM's /metrics?)")
    b = _vllm_counts(before, f"{source} (before)", model_name) if before else None
    k = max(a["per_pos"]) + 1
    if sorted(a["per_pos"]) != list(range(k)):
        raise ServedFormatError(f"{source} (after): per-position counters for positions "
                                f"{sorted(a['per_pos'])}, not 0..{k - 1}")

    def delta(key: str) -> int:
        d = a[key] - (b[key] if b else 0)
        if d < 0:
            raise ServedFormatError(f"{source}: {VLLM_COUNTERS[key]}_total went down between "
                                    "before and after (the engine restarted?)")
        return d

    per_pos = []
    for p in range(k):
        d = a["per_pos"][p] - (b["per_pos"].get(p, 0) if b else 0)
        if d < 0:
            raise ServedFormatError(f"{source}: {VLLM_COUNTERS['per_pos']}_total"
                                    f"{{position=\"{p}\"}} went down between before and after")
        per_pos.append(d)
    s = ServedAcceptance("vllm", "prometheus", k, delta("drafts"), delta("draft_tokens"),
                         delta("accepted"), per_pos, None, dict(settings or {}))
    if s.num_accepted != sum(per_pos):
        raise ServedFormatError(f"{source}: accepted tokens {s.num_accepted} != the sum of the "
                                f"per-position counts {sum(per_pos)}")
    if any(per_pos[i + 1] > per_pos[i] for i in range(k - 1)) or (per_pos and per_pos[0] >
                                                                  s.num_drafts):
        raise ServedFormatError(f"{source}: per-position counts {per_pos} over {s.num_drafts} "
                                "drafts are not a prefix acceptance (each at most the one before)")
    return s


# Per-request records.

def _int_field(d: Mapping[str, Any], key: str, where: str, required: bool = True) -> Optional[int]:
    v = d.get(key)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ServedFormatError(f"{where}: {key}: expected a count, got {v!r}")
    return v


def _int_list(d: Mapping[str, Any], key: str, where: str) -> Optional[list[int]]:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0
                                      for x in v):
        raise ServedFormatError(f"{where}: {key}: expected a list of counts")
    return list(v)


def vllm_request(record: Mapping[str, Any], where: str) -> ServedRequest:
    """One vLLM completion response (or its metrics.speculative_decoding object)."""
    m = record
    if "metrics" in record or "choices" in record:
        m = (record.get("metrics") or {}).get("speculative_decoding")
        if m is None:
            raise ServedFormatError(f"{where}: metrics.speculative_decoding: absent (start vLLM "
                                    "with --per-request-spec-decode-metrics summary|detailed; "
                                    "n must be 1)")
    if not isinstance(m, Mapping):
        raise ServedFormatError(f"{where}: metrics.speculative_decoding: not an object")
    hist = _int_list(m, "acceptance_histogram", where)
    if not hist:
        raise ServedFormatError(f"{where}: acceptance_histogram: absent or empty")
    k = _int_field(m, "num_spec_tokens", where, required=False)
    if k is not None and len(hist) != k + 1:
        raise ServedFormatError(f"{where}: acceptance_histogram: {len(hist)} entries for "
                                f"num_spec_tokens {k} (expected k + 1)")
    drafted = _int_field(m, "num_draft_tokens", where)
    steps = _int_list(m, "per_step_accepted", where)
    if steps is not None and (any(a >= len(hist) for a in steps) or
                              any(steps.count(j) != hist[j] for j in range(len(hist)))):
        raise ServedFormatError(f"{where}: per_step_accepted disagrees with "
                                "acceptance_histogram")
    completion = None
    usage = record.get("usage") if isinstance(record, Mapping) else None
    if isinstance(usage, Mapping):
        completion = _int_field(usage, "completion_tokens", where + ": usage", required=False)
    return ServedRequest(hist, drafted or 0, steps, completion)


def sglang_request(record: Mapping[str, Any], where: str) -> ServedRequest:
    """One SGLang /generate response (or its meta_info)."""
    m = record.get("meta_info", record)
    if not isinstance(m, Mapping):
        raise ServedFormatError(f"{where}: meta_info: not an object")
    steps = _int_field(m, "spec_verify_ct", where)
    hist = _int_list(m, "spec_accept_histogram", where)
    if hist is None:
        raise ServedFormatError(f"{where}: spec_accept_histogram: absent (a SGLang build that "
                                "records it is needed for per-position acceptance)")
    if sum(hist) != steps:
        raise ServedFormatError(f"{where}: spec_accept_histogram sums to {sum(hist)}, "
                                f"spec_verify_ct is {steps}")
    accepted = _int_field(m, "spec_accept_token_num", where, required=False)
    if accepted is not None and accepted != sum(j * n for j, n in enumerate(hist)):
        raise ServedFormatError(f"{where}: spec_accept_token_num {accepted} disagrees with "
                                "spec_accept_histogram")
    drafted = _int_field(m, "spec_draft_token_num", where, required=False)
    if drafted is None:
        drafted = steps * (len(hist) - 1)
    return ServedRequest(hist, drafted, None,
                         _int_field(m, "completion_tokens", where, required=False))


def read_requests(path: Union[str, Path], engine: str = "auto") -> tuple[str, list[ServedRequest]]:
    """A JSONL file of per-request records (one response per line, in prompt order), or a JSON
    list of them. engine: vllm | sglang | auto (by the fields)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    records: list[tuple[str, Any]] = []
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ServedFormatError(f"{p}: not JSON ({e})") from None
        records = [(f"{p}[{i}]", r) for i, r in enumerate(items)]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"{p}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ServedFormatError(f"{p}:{n}: not JSON ({e.msg})") from None
    if not records:
        raise ServedFormatError(f"{p}: no records")
    out = []
    for where, r in records:
        if not isinstance(r, Mapping):
            raise ServedFormatError(f"{where}: a record must be a JSON object")
        kind = engine
        if kind == "auto":
            kind = "sglang" if "meta_info" in r or "spec_verify_ct" in r else "vllm"
        if kind not in ("vllm", "sglang"):
            raise ServedFormatError(f"engine {engine!r}: vllm, sglang or auto")
        out.append(vllm_request(r, where) if kind == "vllm" else sglang_request(r, where))
        engine = kind if engine == "auto" else engine
    ks = {len(r.histogram) for r in out}
    if len(ks) > 1:
        raise ServedFormatError(f"{p}: requests with different numbers of draft positions "
                                f"({sorted(k - 1 for k in ks)})")
    return engine, out


def read_served(*, metrics_after: Union[str, Path, None] = None,
                metrics_before: Union[str, Path, None] = None,
                requests: Union[str, Path, None] = None, engine: str = "auto",
                model_name: Optional[str] = None,
                settings: Mapping[str, Any] | None = None) -> ServedAcceptance:
    """The served acceptance from files: per-request records when given (they pair with a
    canonical run), else the counters. Both given: they must agree."""
    counters = None
    if metrics_after is not None:
        before = Path(metrics_before).read_text() if metrics_before is not None else ""
        counters = vllm_from_prometheus(Path(metrics_after).read_text(), before,
                                        model_name=model_name, source=str(metrics_after),
                                        settings=settings)
    if requests is None:
        if counters is None:
            raise ServedFormatError("give the engine's counters (metrics) or its per-request "
                                    "records (requests)")
        return counters
    kind, reqs = read_requests(requests, engine)
    served = from_requests(kind, reqs, settings)
    if counters is not None:
        a, b = counters, served
        if (a.num_drafts, a.num_accepted, a.accepted_per_pos) != (b.num_drafts, b.num_accepted,
                                                                  b.accepted_per_pos):
            raise ServedFormatError(
                f"{metrics_after} and {requests} disagree: counters {a.num_drafts} drafts, "
                f"{a.accepted_per_pos} per position; requests {b.num_drafts} drafts, "
                f"{b.accepted_per_pos} (other traffic on the engine between the scrapes?)")
    return served


# The engine driven through its OpenAI-compatible API.

def _http(url: str, body: Optional[dict] = None, timeout: float = 600) -> bytes:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}") \
            from None


def drive_openai(base_url: str, model: str, prompts: Sequence[Sequence[int]], *,
                 max_tokens: int, temperature: float = 0.0, top_p: float = 1.0, top_k: int = -1,
                 seed: Optional[int] = None, ignore_eos: bool = False,
                 metrics_url: Optional[str] = None, out_dir: Union[str, Path, None] = None,
                 timeout: float = 600) -> dict[str, Any]:
    """Sends each prompt (token ids) to BASE_URL/v1/completions one at a time, scraping /metrics
    before and after. Returns {"before", "after", "responses", "settings"}; with out_dir, writes
    metrics_before.prom, metrics_after.prom, responses.jsonl and settings.json there (what
    read_served and `python -m specwire_client.reconcile` read)."""
    base = base_url.rstrip("/")
    murl = metrics_url or base + "/metrics"
    before = _http(murl, timeout=timeout).decode()
    responses = []
    for i, p in enumerate(prompts):
        body: dict[str, Any] = {"model": model, "prompt": [int(t) for t in p],
                                "max_tokens": int(max_tokens), "temperature": float(temperature),
                                "top_p": float(top_p), "n": 1, "ignore_eos": bool(ignore_eos),
                                "return_token_ids": True}
        if top_k > 0:
            body["top_k"] = int(top_k)
        if seed is not None:
            body["seed"] = int(seed) + i
        responses.append(json.loads(_http(base + "/v1/completions", body, timeout)))
    after = _http(murl, timeout=timeout).decode()
    settings = {"model": model, "max_tokens": int(max_tokens), "temperature": float(temperature),
                "top_p": float(top_p), "top_k": int(top_k), "seed": seed,
                "ignore_eos": bool(ignore_eos), "prompts": len(prompts)}
    if out_dir is not None:
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / "metrics_before.prom").write_text(before)
        (d / "metrics_after.prom").write_text(after)
        (d / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in responses))
        (d / "settings.json").write_text(json.dumps(settings, indent=1) + "\n")
        (d / "prompts.json").write_text(json.dumps([list(map(int, p)) for p in prompts]) + "\n")
    return {"before": before, "after": after, "responses": responses, "settings": settings}


def completion_ids(record: Mapping[str, Any]) -> Optional[list[int]]:
    """The completion's token ids in a response, where the engine returned them."""
    choices = record.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        ids = choices[0].get("token_ids")
        if isinstance(ids, list):
            return [int(t) for t in ids]
    out = record.get("output_ids")
    return [int(t) for t in out] if isinstance(out, list) else None
