"""A real Prometheus (Debian's package) with the repository's scrape config and alert rules,
scraping a real extractor and scorer on loopback every second while two scoring jobs run; then
every PromQL expression of the Grafana dashboard (deploy/grafana/dashboards/specwire.json) is
evaluated through Prometheus' HTTP API, with the dashboard's variables substituted, and each
must return data. About 20 s on two cores."""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.parse

import pytest
import yaml
from deploy_harness import (DEPLOY, SCORE, Process, binary, extractor, free_port, http_get,
                            scorer)

import extractor_harness  # noqa: E402  (puts tests/parity on sys.path)
import dflash_fixtures as F  # noqa: E402  (the drafter is dflash's model class)

DRAFTER_LABEL = "live-drafter"
DATASET_LABEL = "live-set"
# Grafana's variables as this test resolves them: the window spans many 1 s scrapes.
VARIABLES = {"$__rate_interval": "1m", "$__interval": "5s", "$__range": "5m",
             "$drafter": DRAFTER_LABEL, "$dataset": DATASET_LABEL}


def substitute(expr: str) -> str:
    for k in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(k, VARIABLES[k])
    assert "$" not in expr, f"unresolved variable in {expr}"
    return expr


def prometheus_config(extractor_metrics: int, scorer_metrics: int, prometheus_port: int) -> dict:
    """The repository's config with each job's targets rewritten to this test's loopback ports
    (everything else, rule files included, kept) and a 1 s scrape interval."""
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    cfg["rule_files"] = [str(DEPLOY / "prometheus" / r) for r in cfg["rule_files"]]
    ports = {"specwire-extractor": extractor_metrics, "specwire-scorer": scorer_metrics,
             "prometheus": prometheus_port}
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
        """The first result of `expr` holding a finite value."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if any(math.isfinite(float(r["value"][1])) for r in result):
                return result
            if time.monotonic() > deadline:
                return result
            time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is not installed (scripts/setup.sh installs Debian's package)",
                    pytrace=False)
    root = tmp_path_factory.mktemp("live")
    target = F.make_target(root, overrides={"num_hidden_layers": 3})
    hf = F.hf_target(target)
    cfg = F.drafter_config(hf.config, block_size=8, target_layer_ids=[1, 2],
                           layer_types=["sliding_attention", "full_attention"], sliding_window=12)
    drafter = F.save_drafter(F.new_drafter(cfg, seed=3, perturb=False), root / "drafter",
                             zlab_rope={})
    started: list[Process] = []
    try:
        ext = extractor(target, root, free_port())
        started.append(ext.start())
        sc = scorer(ext.address, root, free_port(), root / "cache")
        started.append(sc.start())
        port = free_port()
        config = root / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(prometheus_config(ext.metrics_port, sc.metrics_port, port)))
        prom = Process(["prometheus", f"--config.file={config}",
                        f"--storage.tsdb.path={root / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{port}"],
                       root / "prometheus.log", r"Server is ready to receive web requests")
        started.append(prom.start())
        yield {"extractor": ext, "scorer": sc, "prometheus": Prometheus(port),
               "drafter": drafter, "root": root}
    finally:
        for p in reversed(started):
            p.stop()


def score(stack, n: int) -> None:
    prompts = stack["root"] / f"prompts{n}.json"
    prompts.write_text(json.dumps([[5 + n, 17, 33, 101, 7], [400, 12, 9], [3, 3, 250, 61, 8, 2]]))
    r = subprocess.run(
        [str(binary(SCORE)), f"--scorer={stack['scorer'].address}",
         f"--drafter={stack['drafter']}", f"--prompts_file={prompts}", "--max_new_tokens=16",
         "--ddtree=8", f"--drafter_label={DRAFTER_LABEL}", f"--dataset_label={DATASET_LABEL}",
         "--quiet"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def scraped_since_last_change(stack) -> bool:
    """Whether Prometheus' newest samples of the extractor and the scorer hold what they export
    now (a counter that only work moves, per target): each was scraped after its last change."""
    prom = stack["prometheus"]
    for proc, name in ((stack["extractor"], "specwire_extractor_tokens_total"),
                       (stack["scorer"], "specwire_scorer_prompts_scored_total")):
        here = extractor_harness.metric_sum(
            http_get(f"http://127.0.0.1:{proc.metrics_port}/metrics"), name)
        there = prom.query(f"sum({name})")
        if here == 0 or not there or float(there[0]["value"][1]) != here:
            return False
    return True


@pytest.fixture(scope="module")
def scored(stack) -> dict:
    """Two scoring jobs with scrapes in between, so counters and histograms move inside the
    window."""
    prom = stack["prometheus"]
    up = prom.wait_for('count(up{job=~"specwire-.*"} == 1) == 2')
    assert up, prom.query('up')
    score(stack, 1)
    prom.wait_for(f'specwire_spec_decode_num_drafts_total{{drafter="{DRAFTER_LABEL}"}}')
    extractor_harness.wait_for(lambda: scraped_since_last_change(stack), 30,
                               "a scrape of both targets between the two jobs")
    score(stack, 2)
    prom.wait_for('increase(specwire_scorer_prompts_scored_total[1m]) > 0')
    prom.wait_for('increase(specwire_extractor_requests_total[1m]) > 0')
    return stack


def test_every_dashboard_expression_returns_data(scored):
    prom = scored["prometheus"]
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "specwire.json").read_text())
    empty = []
    n = 0
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            expr = substitute(t["expr"])
            n += 1
            result = prom.wait_for(expr, timeout=10)
            if not any(math.isfinite(float(r["value"][1])) for r in result):
                empty.append(f"{panel['title']}: {expr} -> {result}")
    assert not empty, "\n".join(empty)
    assert n >= 20

    # The variables' label_values(metric, label) queries.
    for var in dash["templating"]["list"]:
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["definition"])
        url = (f"{prom.base}/api/v1/label/{m.group(2)}/values?"
               + urllib.parse.urlencode({"match[]": m.group(1)}))
        assert VARIABLES["$" + var["name"]] in json.loads(http_get(url))["data"]


def test_numbers_match_the_scorer_and_rules_are_loaded(scored):
    prom, stack = scored["prometheus"], scored
    labels = f'drafter="{DRAFTER_LABEL}", dataset="{DATASET_LABEL}"'
    # The latest job's τ as Prometheus holds it equals the scorer's own gauge.
    text = http_get(f"http://127.0.0.1:{stack['scorer'].metrics_port}/metrics")
    line = [l for l in text.splitlines()
            if l.startswith("specwire_spec_decode_mean_acceptance_length{")
            and 'kind="pooled"' in l and DRAFTER_LABEL in l][0]
    tau = prom.wait_for(f'specwire_spec_decode_mean_acceptance_length{{{labels}, '
                        f'kind="pooled"}}')
    assert float(tau[0]["value"][1]) == pytest.approx(float(line.split()[-1]))
    # Six prompts in two jobs.
    scored = prom.wait_for(f"sum(specwire_scorer_prompts_scored_total{{{labels}}}) == 6")
    assert float(scored[0]["value"][1]) == 6
    rules = json.loads(http_get(f"{prom.base}/api/v1/rules"))["data"]["groups"]
    assert "specwire-serving" in {g["name"] for g in rules}
    assert all(r["health"] == "ok" for g in rules for r in g["rules"])
