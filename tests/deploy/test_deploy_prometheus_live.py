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
from deploy_harness import (SCORE, Process, Prometheus, binary, dashboard_gaps,
                            dashboard_variables, extractor, free_port, http_get, prometheus_config,
                            scorer)

import extractor_harness  # noqa: E402  (puts tests/parity on sys.path)
import dflash_fixtures as F  # noqa: E402  (the drafter is dflash's model class)

DRAFTER_LABEL = "live-drafter"
DATASET_LABEL = "live-set"
VARIABLES = dashboard_variables(DRAFTER_LABEL, DATASET_LABEL)


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
            yaml.safe_dump(prometheus_config({"specwire-extractor": ext.metrics_port,
                                              "specwire-scorer": sc.metrics_port,
                                              "prometheus": port})))
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
    n, empty = dashboard_gaps(scored["prometheus"], VARIABLES)
    assert not empty, "\n".join(empty)
    assert n >= 20


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
