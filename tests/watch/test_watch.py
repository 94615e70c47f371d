"""Continuous evaluation: a real specwire-extractor, a specwire-scorer watching a directory with
two eval sets, a real Prometheus server scraping it every second, and the push-mode client.

The tiny trained target (models/tiny-qwen3) and one DFlash drafter trained against it in stages:
its checkpoints after 4, 20 and 80 training steps are written into the watched directory one
after another, each file in pieces as a trainer writes it. Checked:
  - each checkpoint is scored exactly once per eval set (results database, the scorer's
    counters and log), the baseline drafter once, as run "baseline";
  - a stalled half-written checkpoint, a corrupt safetensors file and a drafter for another
    target are recorded as failed with an error naming the file or field, and the watcher goes
    on (the half-written one is scored once its writer finishes it);
  - Prometheus holds the τ-by-step series with the three steps, every PromQL of
    deploy/grafana/dashboards/specwire-training.json returns data, and the alert rules load
    (promtool checks and unit-tests them);
  - push mode (ScorerClient.submit_checkpoint, from a directory and from a state dict) returns
    the numbers watch mode recorded for the same checkpoint, answers a repeated (run, step) from
    the database, and refuses a wrong digest and an upload over the size limit;
  - a restarted scorer re-exports every result and scores nothing again.

Binaries from $SPECWIRE_BUILD_DIR; `prometheus` and `promtool` from Debian's prometheus package.
Run time: about a minute on two cores.
"""
from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import grpc
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
from extractor_harness import (REPO, ExtractorServer, build_dir, free_port,  # noqa: E402
                               metric_value)
from processes import kill_process, stop_process  # noqa: E402

pytest.importorskip("dflash", reason="the drafter comes from dflash's model code")
import dflash_fixtures as F  # noqa: E402  (tests/parity, on sys.path via extractor_harness)

from specwire_client import ScorerClient, ScorerError  # noqa: E402
from specwire_client._generated.proto.specwire.v1 import scorer_pb2 as spb  # noqa: E402
from specwire_client._generated.proto.specwire.v1 import scorer_pb2_grpc as spb_grpc  # noqa: E402

BLOCK = 8
PROMPT_LEN = 8
MAX_NEW_TOKENS = 24
TARGET_LAYER_IDS = [1, 2]
POLL = 0.25
STAGES = [4, 16, 60]  # training steps added before each checkpoint: steps 4, 20, 80
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "specwire-training.json"
RULES = REPO / "deploy" / "prometheus" / "rules" / "training.yml"


def wait_for(pred, timeout: float, what: str, *, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout} s waiting for {what}"
                + (f"\n--- scorer log ---\n{log()[-4000:]}" if log else ""), pytrace=False)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` not found: install Debian's prometheus package "
                    "(scripts/setup.sh does)", pytrace=False)
    return path


class WatchingScorer:
    """A specwire-scorer with continuous evaluation on, stopped by PID."""

    def __init__(self, root: Path, extractor: str, args: list[str]) -> None:
        self.root = root
        self.extractor = extractor
        self.args = args
        self.metrics_port = free_port()
        self.port = 0
        self.starts = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WatchingScorer":
        exe = build_dir() / "services" / "scorer" / "specwire-scorer"
        if not exe.exists():
            pytest.fail(f"{exe} not built", pytrace=False)
        self.starts += 1
        self.log_path = self.root / f"scorer-{self.starts}.log"
        cmd = [str(exe), f"--extractor={self.extractor}", "--listen=127.0.0.1:0",
               f"--metrics_listen=127.0.0.1:{self.metrics_port}", "--dtype=float32",
               "--threads=1", *self.args]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        m = wait_for(lambda: re.search(r"serving .* on port (\d+)", self.log())
                     or (self.proc.poll() is not None and "exited"), 60, "the scorer to start",
                     log=self.log)
        if m == "exited":
            pytest.fail(f"the scorer exited:\n{self.log()}", pytrace=False)
        self.port = int(m.group(1))
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as r:
            return r.read().decode()

    def kill(self) -> None:
        """SIGKILL by PID (a crash), and reap."""
        if self.proc is not None:
            kill_process(self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 20)


def db_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(
            "SELECT * FROM checkpoint_results ORDER BY run, step, dataset")]
    except sqlite3.OperationalError:  # the schema is being created
        return []
    finally:
        con.close()


def write_like_a_trainer(src: Path, dst: Path, pieces: int = 4) -> None:
    """config.json, then each safetensors file in `pieces` appends with short pauses."""
    dst.mkdir(parents=True)
    shutil.copyfile(src / "config.json", dst / "config.json")
    for f in sorted(src.glob("*.safetensors")):
        data = f.read_bytes()
        n = len(data)
        with open(dst / f.name, "wb") as out:
            for i in range(pieces):
                out.write(data[i * n // pieces:(i + 1) * n // pieces])
                out.flush()
                time.sleep(0.02)


def test_training_dashboard_is_well_formed():
    """Unique panel ids, the provisioned datasource, and only metrics the scorer exports."""
    dash = json.loads(DASHBOARD.read_text())
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    exported = set()
    for src in ("eval/training_metrics.cc", "metrics.cc"):
        exported |= set(re.findall(r'Family\(\*registry_,\s*"(specwire_\w+)"',
                                   (REPO / "services" / "scorer" / src).read_text()))
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "specwire-prometheus", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "specwire-prometheus", p["title"]
            for name in re.findall(r"\b(specwire_\w+)", t["expr"]):
                assert name in exported, f"{name} is not exported: {t['expr']}"
    titles = " | ".join(p["title"] for p in dash["panels"])
    for needed in ("τ vs training step", "DDTree-8", "Per-position acceptance, latest"):
        assert needed in titles


# --- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("watch")
    # One thread: the machine's other core runs the servers (and small GEMMs gain nothing).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # The committed tiny trained target (models/tiny-qwen3, with its tokenizer); the drafter is
    # trained here in stages against it.
    target = Path(shutil.copytree(REPO / "models" / "tiny-qwen3", root / "tiny-qwen3"))
    hf = F.hf_target(target)
    g = torch.Generator().manual_seed(0)
    seen, sequences, drafter = F.seen_pair(hf, PROMPT_LEN, MAX_NEW_TOKENS, BLOCK,
                                           TARGET_LAYER_IDS, g)
    staged, step = {}, 0
    for n in STAGES:
        F.train_drafter(drafter, hf, sequences, PROMPT_LEN, steps=n, seed=step)
        step += n
        staged[step] = F.save_drafter(drafter, root / "staging" / f"s{step}", zlab_rope={})
    torch.set_num_threads(threads)
    unseen = torch.randint(0, 500, (3, 10), generator=g).tolist()
    sets = root / "sets"
    sets.mkdir()
    (sets / "chat.jsonl").write_text(
        "".join(json.dumps({"input_ids": p}) + "\n" for p in seen[:3].tolist()))
    (sets / "code.jsonl").write_text(
        "".join(json.dumps({"input_ids": p}) + "\n" for p in unseen))
    ext = ExtractorServer(target, root, dtype="float32", metrics=False,
                          args=("--max_batch_tokens=1",)).start()
    watch = root / "ckpts"
    args = [f"--cache_dir={root / 'cache'}",
            f"--eval_sets=chat={sets / 'chat.jsonl'},{sets / 'code.jsonl'}",
            f"--eval_db={root / 'eval.sqlite'}", f"--watch_dir={watch}", "--watch_run=r1",
            f"--watch_poll_seconds={POLL}", f"--eval_max_new_tokens={MAX_NEW_TOKENS}",
            "--eval_ddtree=4,8", f"--baseline_drafter={staged[max(staged)]}",
            f"--upload_dir={root / 'uploads'}", "--max_upload_bytes=20000000"]
    scorer = WatchingScorer(root, ext.address, args)
    try:
        scorer.start()
        yield {"root": root, "staged": staged, "watch": watch, "db": root / "eval.sqlite",
               "scorer": scorer, "extractor": ext}
    finally:
        scorer.stop()
        ext.stop()


def recorded(setup, run: str, step: int) -> dict:
    return {r["dataset"]: r for r in db_rows(setup["db"]) if r["run"] == run and r["step"] == step}


# --- tests ---------------------------------------------------------------------------------------

def test_three_checkpoints_scored_exactly_once(setup):
    scorer, watch = setup["scorer"], setup["watch"]
    wait_for(lambda: len(recorded(setup, "baseline", 0)) == 2, 60, "the baseline drafter",
             log=scorer.log)
    for step, src in setup["staged"].items():
        write_like_a_trainer(src, watch / f"checkpoint-{step}")
        rows = wait_for(lambda: len(r := recorded(setup, "r1", step)) == 2 and r, 60,
                        f"checkpoint-{step} to be scored", log=scorer.log)
        assert all(r["status"] == "ok" for r in rows.values()), rows
    # A few more scans: nothing is scored again.
    polls = metric_value(scorer.metrics(), "specwire_watch_polls_total")
    wait_for(lambda: metric_value(scorer.metrics(), "specwire_watch_polls_total") >= polls + 3, 30,
             "three more scans")
    m = scorer.metrics()
    taus = {}
    for dataset in ("chat", "code"):
        assert metric_value(m, "specwire_checkpoint_evaluations_total", run="r1",
                            dataset=dataset, status="ok") == 3
        assert metric_value(m, "specwire_checkpoint_evaluations_total", run="baseline",
                            dataset=dataset, status="ok") == 1
        for step in setup["staged"]:
            assert len(re.findall(rf"scoring run r1 step {step} \(.*\) on eval set {dataset}\n",
                                  scorer.log())) == 1
            row = recorded(setup, "r1", step)[dataset]
            summary = json.loads(row["summary"])
            assert row["tau"] == pytest.approx(summary["tau"])
            assert metric_value(m, "specwire_checkpoint_tau", run="r1", step=str(step),
                                dataset=dataset, kind="mean_of_means") == pytest.approx(row["tau"])
            assert row["checkpoint_digest"].startswith("xxh3-128:")
            assert set(json.loads(row["ddtree_tau"])) == {"4", "8"}
            assert len(json.loads(row["per_position_acceptance"])) == BLOCK - 1
            taus.setdefault(dataset, []).append(round(row["tau"], 3))
    assert metric_value(m, "specwire_checkpoint_latest_step", run="r1") == max(setup["staged"])
    print(f"\nτ by step {list(setup['staged'])}: {taus}")
    # Training on the chat prompts' trajectories makes the drafter better there.
    assert taus["chat"][-1] > taus["chat"][0]


def test_bad_checkpoints_recorded_failed_and_watcher_goes_on(setup):
    scorer, watch, staged = setup["scorer"], setup["watch"], setup["staged"]
    good = staged[max(staged)]
    st = next(good.glob("*.safetensors"))
    # Half-written, then the writer stalls.
    half = watch / "checkpoint-500"
    half.mkdir()
    shutil.copyfile(good / "config.json", half / "config.json")
    data = st.read_bytes()
    (half / st.name).write_bytes(data[:len(data) // 2])
    # Corrupt: the header is garbage.
    bad = watch / "checkpoint-600"
    shutil.copytree(good, bad)
    raw = bytearray((bad / st.name).read_bytes())
    raw[8:40] = b"#" * 32
    (bad / st.name).write_bytes(bytes(raw))
    # A drafter for another target (64 layers).
    wrong = watch / "checkpoint-700"
    shutil.copytree(good, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["num_target_layers"] = 64
    (wrong / "config.json").write_text(json.dumps(cfg))
    rows = wait_for(lambda: all(len(recorded(setup, "r1", s)) == 2 for s in (500, 600, 700))
                    and {s: recorded(setup, "r1", s) for s in (500, 600, 700)}, 60,
                    "the bad checkpoints to be recorded", log=scorer.log)
    for s, rs in rows.items():
        for r in rs.values():
            assert r["status"] == "failed", r
    assert "DATA_LOSS" in rows[500]["chat"]["error"] and st.name in rows[500]["chat"]["error"]
    assert "INVALID_ARGUMENT" in rows[600]["code"]["error"]
    assert st.name in rows[600]["code"]["error"]
    assert "FAILED_PRECONDITION" in rows[700]["chat"]["error"]
    assert "num_target_layers" in rows[700]["chat"]["error"]
    m = scorer.metrics()
    assert metric_value(m, "specwire_checkpoint_failed", run="r1", step="700", dataset="chat") == 1
    # The watcher goes on: the stalled writer finishes, and a new checkpoint comes.
    (half / st.name).write_bytes(data)
    write_like_a_trainer(staged[min(staged)], watch / "step_800")
    for s in (500, 800):
        wait_for(lambda: (r := recorded(setup, "r1", s)) and len(r) == 2
                 and all(x["status"] == "ok" for x in r.values()), 60,
                 f"step {s} to be scored", log=scorer.log)
    # Same files, same numbers.
    assert recorded(setup, "r1", 500)["chat"]["summary"] == \
        recorded(setup, "r1", max(staged))["chat"]["summary"]
    assert recorded(setup, "r1", 800)["code"]["summary"] == \
        recorded(setup, "r1", min(staged))["code"]["summary"]


def test_prometheus_holds_the_series_and_every_dashboard_query_answers(setup, tmp_path):
    scorer = setup["scorer"]
    subprocess.run([tool("promtool"), "check", "rules", str(RULES)], check=True,
                   capture_output=True)
    subprocess.run([tool("promtool"), "test", "rules", "training_rules_test.yml"], check=True,
                   capture_output=True, cwd=Path(__file__).parent)
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{RULES}"]
scrape_configs:
  - job_name: specwire-scorer
    static_configs: [{{targets: ["127.0.0.1:{scorer.metrics_port}"]}}]
""")
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([tool("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    steps = "|".join(str(s) for s in setup["staged"])

    def query(q: str) -> list:
        url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.loads(r.read())
        except OSError:
            return []
        assert body["status"] == "success", body
        return body["data"]["result"]

    try:
        series = wait_for(
            lambda: len(r := query('specwire_checkpoint_tau{run="r1", kind="mean_of_means", '
                                   f'step=~"{steps}"}}')) == 6 and r,
            60, "Prometheus to scrape the τ series",
            log=lambda: (tmp_path / "prometheus.log").read_text())
        got = {(s["metric"]["dataset"], int(s["metric"]["step"])): float(s["value"][1])
               for s in series}
        for (dataset, step), tau in got.items():
            assert tau == pytest.approx(recorded(setup, "r1", step)[dataset]["tau"])
        assert sorted({k[1] for k in got}) == sorted(setup["staged"])
        # Every query of the training dashboard returns data (variables: run r1, all eval sets).
        dash = json.loads(DASHBOARD.read_text())
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        assert len(exprs) >= 8
        empty = []
        for e in exprs:
            q = e.replace("$run", "r1").replace("$dataset", ".*")
            if not wait_for(lambda: query(q) or None, 15, f"data for {q}"):
                empty.append(q)
        assert not empty
        with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=5) as r:
            groups = json.loads(r.read())["data"]["groups"]
        assert any(rule["name"] == "SpecwireDrafterTauRegressed"
                   for g in groups for rule in g["rules"])
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def test_push_mode_returns_the_watch_numbers(setup):
    scorer, staged = setup["scorer"], setup["staged"]
    step = sorted(staged)[1]
    watched = recorded(setup, "r1", step)
    with ScorerClient(scorer.address, timeout=120) as client:
        pushed = client.submit_checkpoint(run="push", step=step, path=staged[step])
        assert set(pushed.scores) == {"chat", "code"}
        for dataset, s in pushed.scores.items():
            w = json.loads(watched[dataset]["summary"])
            assert s.status == "ok" and not s.from_database
            assert s.tau == w["tau"] and s.tau_pooled == w["tau_pooled"]
            assert s.per_position_acceptance == w["per_position_acceptance"]
            assert s.ddtree_tau == {int(k): v["tau"] for k, v in w["ddtree"].items()}
        assert pushed.checkpoint_digest == watched["chat"]["checkpoint_digest"]
        # From a training loop's state dict: the same numbers.
        from safetensors.torch import load_file
        sd = load_file(str(next(staged[step].glob("*.safetensors"))))
        config = json.loads((staged[step] / "config.json").read_text())
        from_sd = client.submit_checkpoint(run="push-sd", step=step, state_dict=sd, config=config)
        assert from_sd.tau == pushed.tau
        # Again: answered from the database.
        again = client.submit_checkpoint(run="push", step=step, path=staged[step])
        assert all(s.from_database for s in again.scores.values())
        assert again.tau == pushed.tau
        # Other weights under a recorded (run, step): refused.
        with pytest.raises(ScorerError) as e:
            client.submit_checkpoint(run="push", step=step, path=staged[max(staged)])
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(ScorerError) as e:
            client.submit_checkpoint(run="../x", step=1, path=staged[step])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "header.run" in str(e.value)
    rows = db_rows(setup["db"])
    assert {r["source"] for r in rows if r["run"] == "push"} == {"push"}

    stub = spb_grpc.CheckpointScorerStub(grpc.insecure_channel(scorer.address))
    cfg = (staged[step] / "config.json").read_bytes()

    def upload(files, chunks):
        header = spb.DrafterUploadHeader(run="raw", step=1)
        for name, size, digest in files:
            header.files.add(name=name, size=size, digest=digest)
        msgs = [spb.DrafterUpload(header=header)] + [
            spb.DrafterUpload(chunk=spb.FileChunk(name=n, offset=o, data=d)) for n, o, d in chunks]
        with pytest.raises(grpc.RpcError) as e:
            stub.SubmitDrafter(iter(msgs), timeout=60)
        return e.value

    import xxhash
    digest = "xxh3-128:" + xxhash.xxh3_128_hexdigest(cfg)
    # Over --max_upload_bytes: refused from the header, before any byte.
    err = upload([("config.json", len(cfg), digest), ("model.safetensors", 10**9, digest)], [])
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_upload_bytes" in err.details()
    # A file whose bytes do not match its digest.
    err = upload([("config.json", len(cfg), digest), ("model.safetensors", 4, digest)],
                 [("config.json", 0, cfg), ("model.safetensors", 0, b"abcd")])
    assert err.code() == grpc.StatusCode.DATA_LOSS and "model.safetensors" in err.details()
    # A path in a file name.
    err = upload([("../config.json", len(cfg), digest)], [])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "header.files.name" in err.details()
    # The refused uploads' partial files are removed when their calls end.
    wait_for(lambda: not any(p.name.startswith(".partial")
                             for p in (setup["root"] / "uploads").iterdir()),
             10, "the partial uploads to be removed")


def test_cli_watch_scores_in_process_and_resumes(setup, tmp_path):
    """specwire-score --watch_dir: the same evaluation without a service, stopping after N
    scans."""
    staged, root = setup["staged"], setup["root"]
    step = sorted(staged)[1]
    watch = tmp_path / "cli-run"
    shutil.copytree(staged[step], watch / f"checkpoint-{step}")
    db = tmp_path / "cli.sqlite"
    exe = build_dir() / "services" / "scorer" / "specwire-score"
    # The service's eval flags, spelled the same (services/scorer/eval_flags.h).
    cmd = [str(exe), f"--watch_dir={watch}", f"--extractor={setup['extractor'].address}",
           f"--eval_sets=chat={root / 'sets' / 'chat.jsonl'},{root / 'sets' / 'code.jsonl'}",
           f"--eval_db={db}", f"--eval_max_new_tokens={MAX_NEW_TOKENS}", "--eval_ddtree=4,8",
           "--watch_poll_seconds=0.1", "--watch_scans=3", "--threads=1",
           f"--cache_dir={root / 'cache'}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    rows = {r["dataset"]: r for r in db_rows(db)}
    assert set(rows) == {"chat", "code"} and all(r["run"] == "cli-run" for r in rows.values())
    # The same checkpoint, the same numbers as the service's watch mode.
    for dataset, r in rows.items():
        assert r["status"] == "ok" and r["step"] == step
        assert r["summary"] == recorded(setup, "r1", step)[dataset]["summary"]
    assert re.search(rf"cli-run\s+{step}\s+chat\s+ok", first.stdout), first.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "scoring run" not in again.stderr
    assert db_rows(db) == list(rows.values())


def test_restart_rescores_nothing(setup):
    scorer = setup["scorer"]
    before = db_rows(setup["db"])
    scorer.stop()
    scorer.start()
    wait_for(lambda: metric_value(scorer.metrics(), "specwire_watch_polls_total") >= 4, 60,
             "four scans after the restart", log=scorer.log)
    m = scorer.metrics()
    assert "specwire_checkpoint_evaluations_total{" not in m
    assert "scoring run" not in scorer.log()
    after = db_rows(setup["db"])
    assert after == before
    # Every result is served again from the database.
    for r in after:
        if r["status"] == "ok":
            assert metric_value(m, "specwire_checkpoint_tau", run=r["run"], step=str(r["step"]),
                                dataset=r["dataset"], kind="mean_of_means") == \
                pytest.approx(r["tau"])
    assert metric_value(m, "specwire_checkpoint_latest_step", run="r1") == 800


def test_crash_mid_scoring_loses_nothing_recorded(setup):
    """SIGKILL while a checkpoint is being scored: what was recorded stays, the checkpoint is
    scored after the restart, and no recorded key is scored again."""
    scorer, staged = setup["scorer"], setup["staged"]
    write_like_a_trainer(staged[sorted(staged)[1]], setup["watch"] / "checkpoint-900")
    wait_for(lambda: "scoring run r1 step 900 " in scorer.log(), 60,
             "the scoring of checkpoint-900 to start", log=scorer.log)
    scorer.kill()
    before = [r for r in db_rows(setup["db"])]
    done_before = {r["dataset"] for r in before if r["run"] == "r1" and r["step"] == 900}
    scorer.start()
    rows = wait_for(lambda: len(r := recorded(setup, "r1", 900)) == 2 and r, 60,
                    "checkpoint-900 to be scored after the restart", log=scorer.log)
    assert all(r["status"] == "ok" for r in rows.values())
    assert rows["chat"]["summary"] == recorded(setup, "r1", sorted(staged)[1])["chat"]["summary"]
    after = db_rows(setup["db"])
    assert [r for r in after if (r["run"], r["step"]) != ("r1", 900)] == \
        [r for r in before if (r["run"], r["step"]) != ("r1", 900)]
    scored = re.findall(r"scoring run (\S+) step (\d+) \(.*\) on eval set (\S+)", scorer.log())
    assert sorted(scored) == sorted(("r1", "900", d) for d in {"chat", "code"} - done_before)


@pytest.mark.parametrize("family", ["eagle3", "dflash2"])
def test_push_mode_scores_every_drafter_family(setup, family):
    """The committed EAGLE-3 (speculators format) and DFlash2 (z-lab format) drafters of the same
    target, pushed as checkpoints: scored on every eval set like the DFlash ones; EAGLE-3's
    budgets are EAGLE's top-k tree, DFlash2's path has no tree rows."""
    src = REPO / "models" / f"tiny-qwen3-{family}"
    with ScorerClient(setup["scorer"].address, timeout=300) as client:
        pushed = client.submit_checkpoint(run=f"family-{family}", step=1, path=src)
    assert set(pushed.scores) == {"chat", "code"}
    for s in pushed.scores.values():
        assert s.status == "ok" and not s.from_database, s
        assert s.tau >= 1.0
        if family == "eagle3":
            assert s.summary.tree_method == "eagle" and s.ddtree_tau, s.summary
        else:
            assert s.summary.tree_method == "" and not s.ddtree_tau
    rows = recorded(setup, f"family-{family}", 1)
    assert {json.loads(r["summary"])["tau"] for r in rows.values()} == \
        {s.tau for s in pushed.scores.values()}
