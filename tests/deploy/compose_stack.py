#!/usr/bin/env python3
"""The eval node for real: the images built from docker/*.Dockerfile, the compose stack of
deploy/docker-compose.yml brought up on a Docker engine, and the held-out set scored through it.
Run by hand (scripts/compose_stack.sh; about 25 minutes from nothing on two cores, a few minutes
with the engine's build cache warm), not in CI: image builds do not fit its budget.

Steps, each timed, and a table of what was measured at the end (also --json_out):
1. Engine: the running one (DOCKER_HOST or the default socket), else `dockerd` started here as
   root (`--bridge=none --iptables=false`: every container uses the host's network) and stopped
   by PID at the end. Debian's docker.io, docker-compose and debootstrap are installed when
   missing.
2. Base image: the Dockerfiles' bases are public images (ubuntu:24.04, nvidia/cuda) that no
   registry here serves, so a Debian 12 base is made with `debootstrap --variant=minbase
   bookworm` and passed as the build argument each Dockerfile takes (BASE_IMAGE; BUILD_BASE and
   RUNTIME_BASE with SPECWIRE_CUDA=OFF for the CPU extractor, which is the CUDA image's build with
   only the base and the CUDA switch changed). The host's extra CA certificates and pip.conf go
   into that local base, so that a build behind a TLS-intercepting proxy works as the host's pip
   does; the Dockerfiles themselves are unchanged for real users.
3. Images: specwire-scorer, specwire-extractor:cpu, and a Prometheus image made from Debian's
   package (prom/prometheus is not reachable here; the compose file takes the image from
   SPECWIRE_PROMETHEUS_IMAGE). Grafana is left out (no image here; its dashboards' queries are
   evaluated through Prometheus instead).
4. The stack: deploy/docker-compose.yml with the loopback changes only (network_mode: host,
   no published ports or networks, 127.0.0.1 addresses on free ports, a Prometheus config with
   static loopback targets and a 1 s scrape interval; images, volumes, health checks, commands
   and restart policies as shipped), `--profile cpu`: extractor-cpu on models/tiny-qwen3,
   scorer, Prometheus. Checked: every health check turns healthy (start-up times to SERVING
   measured), `specwire-score --scorer` scores the held-out set and its report equals the
   demo's (scripts/demo.sh, run here first), Prometheus in its container has scraped both
   services and every query of the dashboard returns data, `compose down` leaves no container.
5. Image hygiene: sizes, the numeric non-root user, the HEALTHCHECK, no compiler, build tool or
   source tree in the runtime images.
6. Bad input, each on its own compose project: a missing model mount, a wrong SPECWIRE_TARGET,
   a port already taken. The extractor exits with a clear message in its log, compose never
   reports it healthy, and nothing hangs (each case bounded, `down` bounded).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deploy_harness import (CLI, DEPLOY, REPO, SCORE, Prometheus, binary, build_dir,  # noqa: E402
                            dashboard_gaps, dashboard_variables, free_port,
                            prometheus_config, stop_process)

BASE_IMAGE = "specwire-base/debian:bookworm"
SCORER_IMAGE = "specwire-scorer:latest"
EXTRACTOR_IMAGE = "specwire-extractor:cpu"
PROMETHEUS_IMAGE = "specwire-base/prometheus:debian"
PROJECT = "specwire-stack"
DRAFTER_LABEL = "tiny-qwen3-dflash"
DATASET_LABEL = "heldout"

PROMETHEUS_DOCKERFILE = f"""\
FROM {BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus wget \\
    && rm -rf /var/lib/apt/lists/* \\
    && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n"
                           f"{r.stderr[-6000:]}")
    return r


class Engine:
    """A Docker engine: the one that answers, or dockerd started here (stopped by PID)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.proc: subprocess.Popen | None = None
        # The engine's own client: its BuildKit needs no buildx plugin.
        self.docker = os.environ.get("DOCKER") or ("/usr/bin/docker"
                                                   if Path("/usr/bin/docker").exists()
                                                   else "docker")
        self.env = dict(os.environ, DOCKER_BUILDKIT="1")

    def answers(self) -> bool:
        return run([self.docker, "info"], timeout=30, check=False, env=self.env).returncode == 0

    def start(self) -> None:
        missing = [p for p, exe in (("docker.io", "dockerd"), ("docker-compose", "docker-compose"),
                                    ("debootstrap", "debootstrap"))
                   if shutil.which(exe) is None]
        if missing:
            log(f"installing {' '.join(missing)}")
            run(["apt-get", "install", "-y", "-q", *missing], timeout=900,
                env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if self.answers():
            log("engine: the running one")
            return
        if os.geteuid() != 0:
            raise SystemExit("no Docker engine answers and dockerd needs root")
        sock = self.work / "docker.sock"
        self.env["DOCKER_HOST"] = f"unix://{sock}"
        data_root = os.environ.get("SPECWIRE_DOCKER_DATA", "/var/lib/docker")
        with open(self.work / "dockerd.log", "w") as out:
            self.proc = subprocess.Popen(
                ["dockerd", f"--data-root={data_root}", f"--exec-root={self.work / 'exec'}",
                 f"--pidfile={self.work / 'dockerd.pid'}", f"--host=unix://{sock}",
                 "--bridge=none", "--iptables=false"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dockerd did not start:\n"
                                   + (self.work / "dockerd.log").read_text()[-3000:])
            time.sleep(0.5)
        log(f"engine: dockerd pid {self.proc.pid}, data root {data_root}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 60)

    def __call__(self, *args: str, timeout: float = 600, check: bool = True,
                 **kw) -> subprocess.CompletedProcess:
        return run([self.docker, *args], timeout=timeout, check=check, env=self.env, **kw)

    def has_image(self, name: str) -> bool:
        return self("image", "inspect", name, check=False, timeout=30).returncode == 0

    def inspect(self, name: str, kind: str = "container") -> dict:
        return json.loads(self(kind, "inspect", name, timeout=30).stdout)[0]


def compose_command() -> list[str]:
    if run(["docker", "compose", "version"], check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"]


def make_base(engine: Engine, work: Path) -> None:
    if engine.has_image(BASE_IMAGE):
        log(f"base: {BASE_IMAGE} (already made)")
        return
    rootfs = work / "rootfs"
    log("base: debootstrap --variant=minbase bookworm")
    run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs),
         os.environ.get("SPECWIRE_DEBIAN_MIRROR", "http://deb.debian.org/debian")], timeout=1200)
    extra = Path("/usr/local/share/ca-certificates")
    if extra.is_dir() and any(extra.glob("*.crt")):
        dest = rootfs / "usr/local/share/ca-certificates"
        dest.mkdir(parents=True, exist_ok=True)
        for crt in extra.glob("*.crt"):
            shutil.copy(crt, dest / crt.name)
        bundle = Path("/etc/ssl/certs/ca-certificates.crt")
        if bundle.exists():
            (rootfs / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
            shutil.copy(bundle, rootfs / "etc/ssl/certs/ca-certificates.crt")
    if Path("/etc/pip.conf").exists():
        shutil.copy("/etc/pip.conf", rootfs / "etc/pip.conf")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    imp = subprocess.run([engine.docker, "import", "-", BASE_IMAGE], stdin=tar.stdout,
                         capture_output=True, text=True, env=engine.env, timeout=600)
    tar.wait()
    if imp.returncode != 0:
        raise RuntimeError(imp.stderr)
    shutil.rmtree(rootfs, ignore_errors=True)


def build_images(engine: Engine, work: Path, timings: dict) -> None:
    builds = [
        (SCORER_IMAGE, ["-f", "docker/scorer.Dockerfile", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                        str(REPO)]),
        (EXTRACTOR_IMAGE, ["-f", "docker/extractor.Dockerfile",
                           "--build-arg", f"BUILD_BASE={BASE_IMAGE}",
                           "--build-arg", f"RUNTIME_BASE={BASE_IMAGE}",
                           "--build-arg", "SPECWIRE_CUDA=OFF", str(REPO)]),
    ]
    prom_ctx = work / "prometheus-image"
    prom_ctx.mkdir(exist_ok=True)
    (prom_ctx / "Dockerfile").write_text(PROMETHEUS_DOCKERFILE)
    builds.append((PROMETHEUS_IMAGE, [str(prom_ctx)]))
    for tag, args in builds:
        log(f"building {tag}")
        t0 = time.monotonic()
        r = engine("build", "--network", "host", "-t", tag, *args, timeout=3600, check=False,
                   cwd=REPO)
        (work / f"build-{tag.replace('/', '_').replace(':', '_')}.log").write_text(
            r.stdout + r.stderr)
        if r.returncode != 0:
            raise RuntimeError(f"building {tag} failed:\n{r.stderr[-6000:]}")
        timings[f"build {tag}"] = time.monotonic() - t0


# --- the stack -------------------------------------------------------------------------------

class Ports:
    def __init__(self) -> None:
        self.extractor, self.extractor_metrics = free_port(), free_port()
        self.scorer, self.scorer_metrics = free_port(), free_port()
        self.prometheus = free_port()

    def rewrites(self) -> dict[str, str]:
        """The shipped addresses (compose commands and health checks) -> this run's loopback
        ones."""
        out = {}
        for port, mine in ((50051, self.extractor), (9464, self.extractor_metrics),
                           (50061, self.scorer), (9465, self.scorer_metrics),
                           (9090, self.prometheus)):
            for host in ("0.0.0.0", "127.0.0.1"):
                out[f"{host}:{port}"] = f"127.0.0.1:{mine}"
        out["dns:///extractor:50051"] = f"127.0.0.1:{self.extractor}"
        return out


def loopback_compose(work: Path, ports: Ports) -> Path:
    """deploy/docker-compose.yml with the loopback changes only (see the module's docstring)."""
    # Through JSON: the services that share the file's x-extractor anchor get dicts of their own.
    cfg = json.loads(json.dumps(yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())))
    prom_dir = work / "prometheus-config"
    shutil.rmtree(prom_dir, ignore_errors=True)
    shutil.copytree(DEPLOY / "prometheus", prom_dir)
    prom_cfg = prometheus_config(
        {"specwire-extractor": ports.extractor_metrics, "specwire-scorer": ports.scorer_metrics,
         "prometheus": ports.prometheus}, rules_at=None)
    (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
    rewrites = ports.rewrites()

    def rewrite(arg: str) -> str:
        for old, new in rewrites.items():
            arg = arg.replace(old, new)
        return arg

    cfg.pop("x-extractor", None)
    del cfg["services"]["grafana"]
    cfg["volumes"].pop("grafana-data", None)
    for name, svc in cfg["services"].items():
        svc["network_mode"] = "host"
        svc.pop("ports", None)
        svc.pop("networks", None)
        if "build" in svc:
            svc["build"]["context"] = str(REPO)
        svc["command"] = [rewrite(a) for a in svc.get("command", [])]
        svc["healthcheck"]["test"] = [rewrite(a) for a in svc["healthcheck"]["test"]]
        vols = []
        for v in svc.get("volumes", []):
            source, target = v.split(":")[:2]
            if target == "/etc/prometheus":
                v = f"{prom_dir}:/etc/prometheus:ro"
            vols.append(v)
        svc["volumes"] = vols
    prom = cfg["services"]["prometheus"]
    prom["command"].append(f"--web.listen-address=127.0.0.1:{ports.prometheus}")
    prom["healthcheck"]["test"] = [a.replace("127.0.0.1:9090", f"127.0.0.1:{ports.prometheus}")
                                   for a in prom["healthcheck"]["test"]]
    path = work / "docker-compose.loopback.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


class Stack:
    def __init__(self, engine: Engine, compose_file: Path, project: str, env: dict) -> None:
        self.engine = engine
        self.cmd = [*compose_command(), "-p", project, "-f", str(compose_file), "--profile", "cpu"]
        self.project = project
        self.env = {**engine.env, "SPECWIRE_EXTRACTOR_IMAGE": EXTRACTOR_IMAGE,
                    "SPECWIRE_SCORER_IMAGE": SCORER_IMAGE,
                    "SPECWIRE_PROMETHEUS_IMAGE": PROMETHEUS_IMAGE,
                    "SPECWIRE_MODELS": str(REPO / "models"), **env}

    def __call__(self, *args: str, timeout: float = 300, check: bool = True):
        return run([*self.cmd, *args], timeout=timeout, check=check, env=self.env, cwd=REPO)

    def container(self, service: str) -> str:
        ids = self("ps", "-q", service).stdout.split()
        assert len(ids) == 1, (service, ids)
        return ids[0]

    def state(self, service: str) -> dict:
        return self.engine.inspect(self.container(service))["State"]

    def running_containers(self) -> list[str]:
        r = self.engine("ps", "-a", "-q", "--filter",
                        f"label=com.docker.compose.project={self.project}", timeout=30)
        return r.stdout.split()


def wait_healthy(stack: Stack, services: list[str], timeout: float) -> dict[str, float]:
    t0 = time.monotonic()
    healthy: dict[str, float] = {}
    while len(healthy) < len(services):
        for s in services:
            if s in healthy:
                continue
            st = stack.state(s)
            if st.get("Health", {}).get("Status") == "healthy":
                healthy[s] = time.monotonic() - t0
            elif st["Status"] in ("exited", "dead") or st.get("RestartCount", 0) > 0:
                raise RuntimeError(f"{s} stopped ({st['Status']}, exit {st['ExitCode']}):\n"
                                   + stack("logs", "--no-color", s, check=False).stdout[-3000:])
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"not healthy after {timeout} s: "
                               f"{sorted(set(services) - set(healthy))}")
        time.sleep(0.5)
    return healthy


def wait_serving(kind: str, address: str, service: str, t0: float, timeout: float = 300) -> float:
    """Seconds from t0 until `specwire-cli health` answers SERVING, polled from the host."""
    while True:
        r = run([str(binary(CLI)), "health", f"--{kind}", address, "--service", service,
                 f"--{kind}_timeout", "1"], check=False, timeout=30)
        if r.returncode == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{address} not SERVING after {timeout} s: {r.stderr}")
        time.sleep(0.2)


def score(ports: Ports, out: Path, max_prompts: int, max_new_tokens: int) -> dict:
    """specwire-score through the stack's scorer, with the demo's settings; paths are the
    scorer container's."""
    r = run([str(binary(SCORE)), f"--scorer=127.0.0.1:{ports.scorer}",
             "--drafter=/models/tiny-qwen3-dflash", "--dataset=/models/heldout_prompts.jsonl",
             f"--max_prompts={max_prompts}", f"--max_new_tokens={max_new_tokens}",
             "--ddtree=8", f"--drafter_label={DRAFTER_LABEL}", f"--dataset_label={DATASET_LABEL}",
             f"--json_out={out}", "--scorer_timeout=600", "--quiet"], timeout=900)
    return json.loads(out.read_text())


def demo_report(work: Path, max_new_tokens: int) -> dict:
    """scripts/demo.sh on the host's build (the README's main command, build step skipped)."""
    env = dict(os.environ, SPECWIRE_SKIP_BUILD="1", SPECWIRE_BUILD_DIR=str(build_dir()),
               SPECWIRE_DEMO_MAX_NEW_TOKENS=str(max_new_tokens))
    run(["bash", str(REPO / "scripts" / "demo.sh")], timeout=900, env=env,
        stdin=subprocess.DEVNULL)
    return json.loads((build_dir() / "demo" / "report.json").read_text())


# What must be equal between the demo's report and the stack's: everything the scoring decided.
# Left out: timings, creation time, endpoints, extractor addresses and the drafter's path (the
# container's /models against the host's).
REPORT_KEYS = ("summary", "prompts", "contract", "labels", "mode", "settings", "chat_template")


def report_differences(a: dict, b: dict) -> list[str]:
    diffs = []
    for k in REPORT_KEYS:
        if a.get(k) != b.get(k):
            diffs.append(f"{k}: demo {json.dumps(a.get(k))[:300]} != stack "
                         f"{json.dumps(b.get(k))[:300]}")
    return diffs


def check_stack(engine: Engine, work: Path, results: dict, max_new_tokens: int) -> None:
    ports = Ports()
    compose_file = loopback_compose(work, ports)
    stack = Stack(engine, compose_file, PROJECT, {})
    stack("down", "-v", "--remove-orphans", check=False)
    services = ["extractor-cpu", "scorer", "prometheus"]
    try:
        t0 = time.monotonic()
        stack("up", "-d", "--no-build", *services)
        results["serving_s"] = {
            "extractor-cpu": wait_serving("extractor", f"127.0.0.1:{ports.extractor}",
                                          "specwire.v1.Extractor", t0),
            "scorer": wait_serving("scorer", f"127.0.0.1:{ports.scorer}", "specwire.v1.Scorer",
                                   t0)}
        results["healthy_s"] = wait_healthy(stack, services, timeout=240)
        log(f"stack healthy: {results['healthy_s']}")

        demo = demo_report(work, max_new_tokens)
        report = score(ports, work / "stack-report.json", 0, max_new_tokens)
        diffs = report_differences(demo, report)
        results["report_equals_demo"] = not diffs
        results["report_differences"] = diffs
        results["tau"] = report["summary"]["tau_mean_of_means"]
        results["prompts"] = report["summary"]["responses"]
        log(f"scored {results['prompts']} prompts through the stack: tau "
            f"{results['tau']:.3f}; equal to the demo's report: {not diffs}")

        prom = Prometheus(ports.prometheus)
        up = prom.wait_for('count(up{job=~"specwire-.*"} == 1) == 2', timeout=60)
        results["prometheus_up"] = {r["metric"]["job"]: r["value"][1]
                                    for r in prom.query('up')}
        if not up:
            raise RuntimeError(f"Prometheus has not scraped both services: {prom.query('up')}")
        n = results["prompts"]
        prom.wait_for(f"sum(specwire_scorer_prompts_scored_total) == {n}", timeout=60)
        score(ports, work / "stack-report-2.json", 3, 16)  # counters move inside the window
        prom.wait_for("increase(specwire_scorer_prompts_scored_total[1m]) > 0", timeout=60)
        prom.wait_for("increase(specwire_extractor_requests_total[1m]) > 0", timeout=60)
        queries, empty = dashboard_gaps(prom, dashboard_variables(DRAFTER_LABEL, DATASET_LABEL))
        results["dashboard_queries"] = queries
        results["dashboard_queries_empty"] = empty
        log(f"dashboard: {queries} queries, {len(empty)} without data")
    finally:
        (work / "stack.log").write_text(stack("logs", "--no-color", check=False).stdout)
        t0 = time.monotonic()
        stack("down", "-v", "--remove-orphans", timeout=180)
        results["down_s"] = time.monotonic() - t0
        results["left_running"] = stack.running_containers()


# --- image hygiene ---------------------------------------------------------------------------

BUILD_TOOLS = ("gcc", "g++", "cc", "c++", "cmake", "ninja", "make", "protoc", "ccache", "git",
               "pip", "python3")


def hygiene(engine: Engine) -> list[dict]:
    rows = []
    for image in (EXTRACTOR_IMAGE, SCORER_IMAGE):
        info = engine.inspect(image, "image")
        cfg = info["Config"]
        probe = " ".join(f"command -v {t} >/dev/null && echo {t};" for t in BUILD_TOOLS)
        r = engine("run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                   probe + " for d in /src /build /opt/venv /opt/torch/torch/include "
                   "/usr/include/grpcpp /usr/include/google/protobuf /usr/include/c++; do "
                   "test -e $d && echo $d; done; true", timeout=120)
        found = r.stdout.split()
        rows.append({"image": image, "size_mb": round(info["Size"] / 1e6),
                     "user": cfg.get("User", ""),
                     "healthcheck": " ".join(cfg.get("Healthcheck", {}).get("Test", [])),
                     "build_tools_or_sources": found})
    return rows


# --- bad input -------------------------------------------------------------------------------

def bad_input(engine: Engine, work: Path) -> list[dict]:
    """Each case: the extractor alone on its own project; it must exit non-zero with the
    expected message in its log within the bound, never report healthy, and `down` must end."""
    # SPECWIRE_MODELS naming a folder that does not exist: the engine mounts an empty one.
    no_models = work / f"no-models-{os.getpid()}"
    cases = [
        ("missing model mount", {"SPECWIRE_MODELS": str(no_models)}, None,
         "/models/tiny-qwen3/config.json"),
        ("wrong SPECWIRE_TARGET", {"SPECWIRE_TARGET": "no-such-target"}, None,
         "/models/no-such-target/config.json"),
        ("port already taken", {}, "extractor", "already in use"),
    ]
    rows = []
    for name, env, taken, expect in cases:
        ports = Ports()
        compose_file = loopback_compose(work, ports)
        project = f"{PROJECT}-bad{len(rows)}"
        stack = Stack(engine, compose_file, project, env)
        holder = None
        if taken:
            holder = socket.socket()
            holder.bind(("127.0.0.1", ports.extractor))
            holder.listen()
        t0 = time.monotonic()
        since = str(int(time.time()) - 1)
        row = {"case": name}
        try:
            stack("up", "-d", "--no-build", "extractor-cpu")
            container = stack.container("extractor-cpu")
            while True:
                st = stack.state("extractor-cpu")
                if st.get("Health", {}).get("Status") == "healthy":
                    row["verdict"] = "FAIL: reported healthy"
                    break
                # restart: unless-stopped starts it again, with a growing delay.
                if st["Status"] != "running" or st.get("RestartCount", 0) > 0:
                    break
                if time.monotonic() - t0 > 120:
                    row["verdict"] = "FAIL: still running after 120 s"
                    break
                time.sleep(0.2)
            row["seconds_to_exit"] = round(time.monotonic() - t0, 1)
            # The exit codes of its ends so far, as the engine recorded them.
            events = engine("events", "--since", since, "--until", str(int(time.time()) + 1),
                            "--filter", f"container={container}", "--filter", "event=die",
                            "--format", "{{.Actor.Attributes.exitCode}}", timeout=30)
            row["exit_codes"] = [int(c) for c in events.stdout.split()]
            st = stack.state("extractor-cpu")
            row["state"] = st["Status"]
            row["restarts"] = st.get("RestartCount", 0)
            row["health"] = st.get("Health", {}).get("Status", "")
            logs = stack("logs", "--no-color", "extractor-cpu", check=False).stdout
            last = [l for l in logs.splitlines() if "specwire-extractor:" in l]
            row["message"] = last[-1].split("|", 1)[-1].strip() if last else logs[-300:]
            ps = stack("ps", check=False).stdout
            row["compose_ps"] = [l for l in ps.splitlines() if "extractor" in l][-1:] or ps
            if "verdict" not in row:
                ok = (expect in row["message"] and row["exit_codes"]
                      and all(c != 0 for c in row["exit_codes"]) and row["health"] != "healthy")
                row["verdict"] = "ok" if ok else f"FAIL: expected {expect!r}, a non-zero exit"
        finally:
            t1 = time.monotonic()
            stack("down", "-v", "--remove-orphans", timeout=180)
            row["down_s"] = round(time.monotonic() - t1, 1)
            row["left_running"] = stack.running_containers()
            if holder:
                holder.close()
        rows.append(row)
        log(f"bad input: {name}: {row['verdict']} ({row['message']})")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="", help="scratch folder (default: a temporary one)")
    ap.add_argument("--json_out", default="", help="write the measurements here")
    ap.add_argument("--max_new_tokens", type=int, default=64, help="as the demo's default")
    ap.add_argument("--skip_build", action="store_true",
                    help="use the images already built (the engine's cache makes rebuilds cheap)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="specwire-stack-"))
    work.mkdir(parents=True, exist_ok=True)
    engine = Engine(work)
    results: dict = {"timings_s": {}}
    t_all = time.monotonic()
    try:
        t0 = time.monotonic()
        engine.start()
        results["engine"] = engine("version", "--format", "{{.Server.Version}}").stdout.strip()
        make_base(engine, work)
        results["timings_s"]["engine and base"] = time.monotonic() - t0
        if not args.skip_build:
            build_images(engine, work, results["timings_s"])
        results["hygiene"] = hygiene(engine)
        t0 = time.monotonic()
        check_stack(engine, work, results, args.max_new_tokens)
        results["timings_s"]["stack"] = time.monotonic() - t0
        t0 = time.monotonic()
        results["bad_input"] = bad_input(engine, work)
        results["timings_s"]["bad input"] = time.monotonic() - t0
    finally:
        results["timings_s"]["total"] = time.monotonic() - t_all
        engine.stop()
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(results, indent=2, default=str))
    return print_table(results)


def print_table(r: dict) -> int:
    failures = []
    print("\n== images ==")
    print(f"{'image':<28} {'size MB':>8}  {'user':<12} {'healthcheck':<12} build tools / sources")
    for h in r.get("hygiene", []):
        print(f"{h['image']:<28} {h['size_mb']:>8}  {h['user']:<12} "
              f"{'yes' if h['healthcheck'] else 'NO':<12} {h['build_tools_or_sources'] or 'none'}")
        if h["build_tools_or_sources"] or not h["healthcheck"] or h["user"] in ("", "0", "root"):
            failures.append(f"hygiene {h['image']}")
    print("\n== stack ==")
    for k in ("serving_s", "healthy_s"):
        for s, v in r.get(k, {}).items():
            print(f"{k.replace('_s', '')} {s:<16} {v:6.1f} s")
    print(f"held-out prompts scored: {r.get('prompts')}, tau {r.get('tau')}")
    print(f"report equals the demo's: {r.get('report_equals_demo')}")
    for d in r.get("report_differences", []):
        print("  " + d)
    print(f"Prometheus up: {r.get('prometheus_up')}")
    print(f"dashboard queries with data: "
          f"{r.get('dashboard_queries', 0) - len(r.get('dashboard_queries_empty', []))}"
          f"/{r.get('dashboard_queries', 0)}")
    for e in r.get("dashboard_queries_empty", []):
        print("  empty: " + e)
    print(f"compose down: {r.get('down_s', 0):.1f} s, containers left: {r.get('left_running')}")
    if not r.get("report_equals_demo"):
        failures.append("report")
    if r.get("dashboard_queries_empty") or not r.get("dashboard_queries"):
        failures.append("dashboard")
    if r.get("left_running"):
        failures.append("down")
    print("\n== bad input ==")
    for b in r.get("bad_input", []):
        print(f"{b['case']:<24} {b['verdict']:<6} exits {b.get('exit_codes')} within "
              f"{b.get('seconds_to_exit')} s, health '{b.get('health')}', compose: "
              f"{' '.join(b.get('compose_ps', [''])[-1].split()[-2:])}, down {b.get('down_s')} s")
        print(f"{'':<24} {b.get('message')}")
        if b["verdict"] != "ok" or b.get("left_running"):
            failures.append(f"bad input {b['case']}")
    if len(r.get("bad_input", [])) != 3:
        failures.append("bad input not run")
    print("\n== timings ==")
    for k, v in r.get("timings_s", {}).items():
        print(f"{k:<40} {v:7.1f} s")
    print(f"\ncompose_stack_checks_failed={len(failures)}")
    if failures:
        print("FAILED: " + ", ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
