"""What the deployment tests share: repository paths, binaries, a server process started on a
free port (its "serving ... on port N" line read back) and stopped by PID, and Prometheus: the
repository's scrape config pointed at loopback targets, its HTTP API, and the dashboard's
queries evaluated through it."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
from processes import SERVING, free_port, launch_server, stop_process  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def build_dir() -> Path:
    return Path(os.environ.get("SPECWIRE_BUILD_DIR", REPO / "build"))


def binary(relpath: str) -> Path:
    exe = build_dir() / relpath
    if not exe.exists():
        pytest.fail(f"{exe} not built (set SPECWIRE_BUILD_DIR; `cmake --build <dir>`)",
                    pytrace=False)
    return exe


EXTRACTOR = "services/extractor/specwire-extractor"
SCORER = "services/scorer/specwire-scorer"
SCORE = "services/scorer/specwire-score"
CLI = "clients/cli/specwire-cli"


class Process:
    """A server process; `ready` is a regex on its log whose group 1, if any, is the port."""

    def __init__(self, cmd: list[str], log_path: Path, ready: str) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self.ready = ready
        self.port = 0
        self.metrics_port: int | None = None
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "Process":
        self.proc, self.port = launch_server(self.cmd, self.log_path, timeout, self.ready)
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)


def extractor(model: Path, log_dir: Path, metrics_port: int, *extra: str) -> Process:
    p = Process([str(binary(EXTRACTOR)), f"--model={model}", "--dtype=float32",
                 "--listen=127.0.0.1:0", f"--metrics_listen=127.0.0.1:{metrics_port}",
                 "--threads=1", *extra], log_dir / f"extractor-{metrics_port}.log", SERVING)
    p.metrics_port = metrics_port
    return p


def scorer(extractors: str, log_dir: Path, metrics_port: int, cache_dir: Path) -> Process:
    p = Process([str(binary(SCORER)), f"--extractor={extractors}", "--listen=127.0.0.1:0",
                 f"--metrics_listen=127.0.0.1:{metrics_port}", "--dtype=float32",
                 "--threads=1", f"--cache_dir={cache_dir}"],
                log_dir / f"scorer-{metrics_port}.log", SERVING)
    p.metrics_port = metrics_port
    return p


def http_get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


# --- Prometheus and the dashboard ------------------------------------------------------------

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "specwire.json"


def dashboard_variables(drafter: str, dataset: str) -> dict[str, str]:
    """Grafana's variables as the tests resolve them: the window spans many 1 s scrapes."""
    return {"$__rate_interval": "1m", "$__interval": "5s", "$__range": "5m",
            "$drafter": drafter, "$dataset": dataset}


def substitute(expr: str, variables: dict[str, str]) -> str:
    for k in sorted(variables, key=len, reverse=True):
        expr = expr.replace(k, variables[k])
    assert "$" not in expr, f"unresolved variable in {expr}"
    return expr


def prometheus_config(ports: dict[str, int],
                      rules_at: Path | None = DEPLOY / "prometheus") -> dict:
    """The repository's config with each job's targets rewritten to 127.0.0.1:ports[job]
    (everything else kept) and a 1 s scrape interval. Rule files are made absolute under
    `rules_at`, or left relative to the config's folder when it is None."""
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    if rules_at is not None:
        cfg["rule_files"] = [str(rules_at / r) for r in cfg["rule_files"]]
    for job in cfg["scrape_configs"]:
        for key in [k for k in job if k.endswith("_sd_configs") or k == "static_configs"]:
            del job[key]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[job['job_name']]}"]}]
    assert set(ports) == {j["job_name"] for j in cfg["scrape_configs"]}
    return cfg


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        body = json.loads(http_get(url))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 30.0) -> list:
        """The first result of `expr` holding a finite value (or the last one at the
        deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = self.query(expr)
            except OSError:  # not listening yet
                result = []
            if any(math.isfinite(float(r["value"][1])) for r in result):
                return result
            if time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def label_values(self, metric: str, label: str) -> list[str]:
        url = (f"{self.base}/api/v1/label/{label}/values?"
               + urllib.parse.urlencode({"match[]": metric}))
        return json.loads(http_get(url))["data"]


def dashboard_gaps(prom: Prometheus, variables: dict[str, str],
                   dashboard: Path = DASHBOARD) -> tuple[int, list[str]]:
    """(number of queries, the ones without data): every panel's PromQL with the variables
    substituted, and every variable's label_values(metric, label) query, which must offer the
    value substituted for it."""
    dash = json.loads(dashboard.read_text())
    empty, n = [], 0
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            expr = substitute(t["expr"], variables)
            n += 1
            result = prom.wait_for(expr, timeout=10)
            if not any(math.isfinite(float(r["value"][1])) for r in result):
                empty.append(f"{panel['title']}: {expr} -> {result}")
    for var in dash["templating"]["list"]:
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["definition"])
        n += 1
        if m is None or variables["$" + var["name"]] not in prom.label_values(m.group(1),
                                                                              m.group(2)):
            empty.append(f"variable {var['name']}: {var['definition']}")
    return n, empty
