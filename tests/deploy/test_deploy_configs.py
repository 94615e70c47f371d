"""The deployment files, checked with the tools that consume them where this machine has them
(docker-compose / `docker compose`, promtool, CMake, kubectl's kustomize) and against each other:
names, ports, probes, the metric names the services export and the packages scripts/setup.sh
installs. Images are not built here (compose_stack.py, run by hand, builds them and runs the stack);
the build stage's CMake configure runs for real against the local libtorch."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_harness import CLI, DEPLOY, REPO, binary

DOCKER = REPO / "docker"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "specwire.json"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def compose_command() -> list[str]:
    """`docker compose` when the plugin is there, else Debian's docker-compose (setup.sh)."""
    if shutil.which("docker") and run(["docker", "compose", "version"]).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("neither `docker compose` nor docker-compose is installed (scripts/setup.sh "
                "installs Debian's docker-compose)", pytrace=False)


def health_probe(test: list[str]) -> tuple[str, str]:
    """(address, service) of a `specwire-cli health` probe command: the server is named by the
    connection flags of its kind (--extractor / --scorer), and so is the deadline."""
    if test and test[0] in ("CMD", "CMD-SHELL"):
        test = test[1:]
    assert test[:2] == ["specwire-cli", "health"], test
    args = dict(zip(test[2::2], test[3::2]))
    kinds = [k for k in ("extractor", "scorer") if f"--{k}" in args]
    assert len(kinds) == 1, test
    assert f"--{kinds[0]}_timeout" in args, test  # a probe never waits without a deadline
    return args[f"--{kinds[0]}"], args.get("--service", "")


def mounts(service: dict) -> dict[str, str]:
    """target -> source of a compose service's volumes, from either output style (docker-compose
    1.x writes "source:target[:mode]", `docker compose` v2 long-form mappings)."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out[v["target"]] = str(v.get("source", ""))
        else:
            parts = str(v).split(":")
            out[parts[1]] = parts[0]
    return out


def flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


# --- compose ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict:
    r = run([*compose_command(), "-f", str(DEPLOY / "docker-compose.yml"), "config"])
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


def test_compose_validates_and_wires_the_services(compose):
    s = compose["services"]
    assert set(s) == {"extractor", "extractor-cpu", "scorer", "prometheus", "grafana"}
    gpu, cpu = s["extractor"], s["extractor-cpu"]
    assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert "deploy" not in cpu
    assert flags(gpu["command"])["device_map"] == "cuda"
    assert flags(cpu["command"])["device_map"] == "cpu"
    for e in (gpu, cpu):
        # Both answer to "extractor": the scorer and Prometheus find whichever profile runs.
        assert e["networks"]["default"]["aliases"] == ["extractor"]
        assert health_probe(e["healthcheck"]["test"]) == ("127.0.0.1:50051",
                                                          "specwire.v1.Extractor")
        f = flags(e["command"])
        assert f["listen"] == "0.0.0.0:50051" and f["metrics_listen"] == "0.0.0.0:9464"
        assert f["model"].startswith("/models/")
        assert "/models" in mounts(e)
    sc = s["scorer"]
    f = flags(sc["command"])
    assert f["extractor"] == "dns:///extractor:50051"
    assert f["metrics_listen"] == "0.0.0.0:9465" and f["data_root"] == "/models"
    assert health_probe(sc["healthcheck"]["test"]) == ("127.0.0.1:50061", "specwire.v1.Scorer")
    assert s["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    # Images are built from the repository root with the Dockerfiles here.
    for name, dockerfile in (("extractor", "extractor"), ("extractor-cpu", "extractor"),
                             ("scorer", "scorer")):
        b = s[name]["build"]
        assert Path(b["context"]).resolve() == REPO
        assert b["dockerfile"] == f"docker/{dockerfile}.Dockerfile"
    grafana = mounts(s["grafana"])
    assert Path(grafana["/etc/grafana/provisioning"]) == DEPLOY / "grafana" / "provisioning"
    assert Path(grafana["/etc/grafana/dashboards"]) == DEPLOY / "grafana" / "dashboards"
    assert Path(mounts(s["prometheus"])["/etc/prometheus"]) == DEPLOY / "prometheus"
    assert "/var/cache/specwire" in mounts(sc)


# --- Prometheus ------------------------------------------------------------------------------

def test_promtool_checks_the_config_and_rules():
    r = run(["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
    rules = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
    assert rules, "deploy/prometheus/rules holds no rule file"
    r = run(["promtool", "check", "rules", *map(str, rules)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_scrape_jobs_match_the_services(compose):
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert cfg["rule_files"] == ["rules/*.yml"]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    want = {"specwire-extractor": ("extractor", 9464), "specwire-scorer": ("scorer", 9465)}
    for job, (name, port) in want.items():
        sd = jobs[job]["dns_sd_configs"][0]
        assert (sd["names"], sd["type"], sd["port"]) == ([name], "A", port)
    # The same names are the Kubernetes Services (deploy/k8s).
    services = {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == "Service"}
    for name, port in want.values():
        assert port in [p["port"] for p in services[name]["spec"]["ports"]]


# --- Grafana ---------------------------------------------------------------------------------

def exported_metrics() -> set[str]:
    names = set()
    for src in (REPO / "services").glob("*/metrics.cc"):
        names |= set(re.findall(r'Family\(\*registry_,\s*"(specwire_\w+)"', src.read_text()))
    return names


def dashboard_exprs(path: Path = DASHBOARD) -> list[str]:
    dash = json.loads(path.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_grafana_provisioning_and_dashboard():
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = ds["datasources"][0]["uid"]
    assert ds["datasources"][0]["type"] == "prometheus"
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/specwire.yml").read_text())
    # The provider loads the whole folder (every dashboard JSON placed there).
    assert prov["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"

    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for p in panels:
        assert p["datasource"]["uid"] == uid, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == uid and t["expr"], p["title"]
    assert [v["name"] for v in dash["templating"]["list"]] == ["drafter", "dataset"]

    exported = exported_metrics()
    used = set()
    for expr in dashboard_exprs():
        for name in re.findall(r"\b(specwire_\w+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in exported or base in exported, f"{name} is not exported: {expr}"
            used.add(base if base in exported else name)
    titles = " | ".join(p["title"] for p in panels)
    for needed in ("τ", "Acceptance rate", "Per-position", "DDTree", "throughput", "latency"):
        assert needed in titles, needed
    # Acceptance and the extractor's throughput and latency come from these.
    assert {"specwire_spec_decode_mean_acceptance_length",
            "specwire_spec_decode_num_accepted_tokens_per_pos_total",
            "specwire_spec_decode_ddtree_mean_acceptance_length",
            "specwire_extractor_tokens_total",
            "specwire_extractor_request_duration_seconds"} <= used


# --- Kubernetes ------------------------------------------------------------------------------

def k8s_docs() -> list[dict]:
    kust = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    docs = []
    for res in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / "k8s" / res).read_text()) if d]
    return docs


def test_k8s_manifests():
    docs = k8s_docs()
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(d), d
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"])
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(by) == len(docs), "duplicate objects"
    assert ("Namespace", "specwire") in by
    config = by[("ConfigMap", "specwire-models")]["data"]
    assert ("PersistentVolumeClaim", "specwire-models") in by

    deployments = {n: d for (k, n), d in by.items() if k == "Deployment"}
    services = {n: d for (k, n), d in by.items() if k == "Service"}
    assert set(deployments) == {"specwire-extractor", "specwire-scorer"}
    for name, dep in deployments.items():
        assert dep["apiVersion"] == "apps/v1"
        spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), name
        assert pod["securityContext"]["runAsNonRoot"] is True
        # The images' numeric USER (docker/*.Dockerfile).
        image = pod["containers"][0]["image"].split(":")[0]
        assert image in ("specwire-extractor", "specwire-scorer"), image
        docker_user = [l.split()[1] for l in dockerfile_stages(
            DOCKER / f"{image.removeprefix('specwire-')}.Dockerfile")[-1]["lines"]
            if l.startswith("USER ")][-1]
        assert docker_user.split(":")[0] == str(pod["securityContext"]["runAsUser"])
        (c,) = pod["containers"]
        for vm in c["volumeMounts"]:
            (vol,) = [v for v in pod["volumes"] if v["name"] == vm["name"]]
            if "persistentVolumeClaim" in vol:
                assert ("PersistentVolumeClaim",
                        vol["persistentVolumeClaim"]["claimName"]) in by
        env = {}
        for ref in c.get("envFrom", []):
            env |= by[("ConfigMap", ref["configMapRef"]["name"])]["data"]
        for arg in c["args"]:
            for var in re.findall(r"\$\((\w+)\)", arg):
                assert var in env, f"{name}: {arg} uses undefined {var}"
        for probe in ("readinessProbe", "livenessProbe"):
            target, _ = health_probe(c[probe]["exec"]["command"])
            assert target == "127.0.0.1:" + flags(c["args"])["listen"].rsplit(":", 1)[1]
    for name, svc in services.items():
        (dep,) = [d for d in deployments.values()
                  if svc["spec"]["selector"].items()
                  <= d["spec"]["template"]["metadata"]["labels"].items()]
        ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, f"{name}: {p}"

    ext = deployments["specwire-extractor"]
    assert ext["spec"]["replicas"] >= 2
    (ec,) = ext["spec"]["template"]["spec"]["containers"]
    assert ec["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert health_probe(ec["readinessProbe"]["exec"]["command"])[1] == "specwire.v1.Extractor"
    assert config["SPECWIRE_TARGET"]
    # The scorer reaches every extractor replica through the headless Service.
    (sc,) = deployments["specwire-scorer"]["spec"]["template"]["spec"]["containers"]
    m = re.fullmatch(r"dns:///([a-z0-9-]+):(\d+)", flags(sc["args"])["extractor"])
    assert m, flags(sc["args"])["extractor"]
    headless = services[m.group(1)]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= ext["spec"]["template"]["metadata"][
        "labels"].items()
    grpc_port = [p for p in headless["spec"]["ports"] if p["name"] == "grpc"][0]
    assert int(m.group(2)) == grpc_port["port"] == int(flags(ec["args"])["listen"].rsplit(":")[1])
    assert health_probe(sc["readinessProbe"]["exec"]["command"])[1] == "specwire.v1.Scorer"

    if shutil.which("kubectl"):  # kustomize (built into kubectl) renders the set offline
        r = run(["kubectl", "kustomize", str(DEPLOY / "k8s")])
        assert r.returncode == 0, r.stderr
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
        assert len(rendered) == len(docs)
        assert all(d["metadata"].get("namespace") == "specwire"
                   for d in rendered if d["kind"] != "Namespace")


# --- Docker ----------------------------------------------------------------------------------

def dockerfile_stages(path: Path, build_args: dict[str, str] | None = None) -> list[dict]:
    """[{"from": image, "name": stage, "lines": [instruction lines]}], continuation lines
    joined and ${ARG}s replaced by their defaults (or `build_args`), as `docker build` resolves
    them: global ARGs in FROM lines, a stage's own ARGs in its instructions."""
    text = re.sub(r"\\\n", " ", path.read_text())
    build_args = build_args or {}
    known: dict[str, str] = {}  # global ARGs, then the current stage's
    stages = []

    def expand(value: str, scope: dict[str, str]) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: scope.get(m.group(1), m.group(0)), value)

    global_args: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        arg = re.match(r"ARG\s+(\w+)(?:=(\S*))?", line)
        if arg:
            name, default = arg.group(1), arg.group(2) or ""
            scope = global_args if not stages else known
            value = build_args.get(name, expand(default, scope))
            if not stages:
                global_args[name] = value
            else:  # a stage ARG without a default inherits the global one
                known[name] = build_args.get(name, value if arg.group(2) is not None
                                             else global_args.get(name, ""))
                stages[-1]["lines"].append(line)
            continue
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            stages.append({"from": expand(m.group(1), global_args), "name": m.group(2),
                           "lines": []})
            known = {}
        elif stages:
            stages[-1]["lines"].append(expand(line, known))
    return stages


def setup_apt_packages() -> list[str]:
    text = (REPO / "scripts" / "setup.sh").read_text()
    block = re.search(r"APT_PACKAGES=\((.*?)\n\)", text, re.S).group(1)
    return [w for line in block.splitlines() for w in line.split("#")[0].split()]


def build_packages() -> set[str]:
    """setup.sh's packages that the build of the services needs: compilers, build tools and the
    -dev libraries (not the tools only tests use: clang for fuzzing, docker-compose, prometheus)."""
    tools = {"build-essential", "cmake", "ninja-build", "pkg-config", "protobuf-compiler",
             "protobuf-compiler-grpc"}
    return {p for p in setup_apt_packages()
            if p in tools or (p.endswith("-dev") and not p.startswith(("libclang", "python3")))}


@pytest.mark.parametrize("name,targets,cuda", [
    ("extractor", {"specwire-extractor", "specwire-extract", "specwire-cli"}, True),
    ("scorer", {"specwire-scorer", "specwire-score", "specwire-cli"}, False),
])
def test_dockerfile(name, targets, cuda, tmp_path):
    path = DOCKER / f"{name}.Dockerfile"
    stages = dockerfile_stages(path)
    assert [s["name"] for s in stages] == ["build", "runtime"]
    build, runtime = stages
    if cuda:
        assert build["from"].startswith("nvidia/cuda:") and "-devel-" in build["from"]
        assert runtime["from"].startswith("nvidia/cuda:") and "-runtime-" in runtime["from"]
    build_text = "\n".join(build["lines"])
    apt = re.search(r"apt-get install [^&]*", build_text).group(0).split()
    missing = build_packages() - set(apt)
    assert not missing, f"{path.name} build stage lacks setup.sh's packages {sorted(missing)}"
    # libtorch from the pinned wheel, as cmake/Torch.cmake consumes it.
    assert "-c /src/constraints.txt" in build_text and "^torch==" in build_text

    # The build stage's CMake configure, run here against the local libtorch.
    cmake = re.search(r"cmake -S /src -B /build ([^&]*)", build_text).group(1)
    args = shlex.split(cmake)
    assert "-DSPECWIRE_TORCH_DIR=/opt/torch/torch" in args
    assert ("-DSPECWIRE_CUDA=ON" in args) == cuda and "-DSPECWIRE_TESTS=OFF" in args
    import torch
    torch_dir = str(Path(torch.__file__).parent)
    args = [a.replace("/opt/torch/torch", torch_dir).replace("/opt/venv/bin/python",
                                                              str(REPO / ".venv/bin/python"))
            for a in args]
    r = run(["cmake", "-S", str(REPO), "-B", str(tmp_path / "b"), *args])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    built = set(re.search(r"cmake --build /build --target ([^&]*)", build_text).group(1).split())
    assert built == targets
    r = run(["ninja", "-C", str(tmp_path / "b"), "-t", "targets", "all"])
    have = {line.split(":")[0] for line in r.stdout.splitlines()}
    assert targets <= have

    final = "\n".join(runtime["lines"])
    user = [l.split()[1] for l in runtime["lines"] if l.startswith("USER ")]
    # Numeric and not root: Kubernetes' runAsNonRoot can only verify a numeric user.
    assert user and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", user[-1]), user
    hc = re.search(r"HEALTHCHECK .*CMD (\[.*\])", final).group(1)
    service = "specwire.v1.Extractor" if name == "extractor" else "specwire.v1.Scorer"
    port = "50051" if name == "extractor" else "50061"
    assert health_probe(json.loads(hc)) == (f"127.0.0.1:{port}", service)
    entry = json.loads(re.search(r"ENTRYPOINT (\[.*\])", final).group(1))
    assert entry == [f"specwire-{name}"]
    cmd = flags(json.loads(re.search(r"^CMD (\[.*\])", final, re.M).group(1)))
    assert cmd["listen"] == f"0.0.0.0:{port}"
    assert "ldd" in final  # the runtime stage fails to build when a library is missing


def test_collect_libs_copies_what_the_binary_loads(tmp_path):
    cli = binary(CLI)
    dest = tmp_path / "lib"
    r = run(["sh", str(DOCKER / "collect-libs.sh"), str(dest), str(cli)])
    assert r.returncode == 0, r.stderr
    got = {p.name for p in dest.iterdir()}
    assert any(n.startswith("libgrpc++.so") for n in got)
    assert not any(n.startswith(("libc.so", "libm.so", "ld-linux", "libstdc++")) for n in got)
    # With every library in place, the binary runs from the copies alone.
    r = run(["ldd", str(cli)], env={"LD_LIBRARY_PATH": str(dest)})
    assert "not found" not in r.stdout
    grpc_line = [l for l in r.stdout.splitlines() if "libgrpc++.so" in l][0]
    assert str(dest) in grpc_line
    skipped = tmp_path / "skipped"
    r = run(["sh", str(DOCKER / "collect-libs.sh"), str(skipped), "--skip", "/usr", "--skip",
             "/lib", str(cli)])
    assert r.returncode == 0 and not list(skipped.iterdir())


def test_dockerignore_keeps_the_context_small():
    ignored = {l.strip() for l in (REPO / ".dockerignore").read_text().splitlines()
               if l.strip() and not l.startswith("#")}
    assert {".git", ".venv", "build", "models"} <= ignored


def test_the_cpu_extractor_image_differs_from_the_cuda_one_only_in_base_and_backend():
    """compose_stack.py builds the extractor image for CPUs with these build arguments: the same
    instructions, on another base, without the CUDA backend."""
    path = DOCKER / "extractor.Dockerfile"
    cuda = dockerfile_stages(path)
    cpu = dockerfile_stages(path, {"BUILD_BASE": "debian:12", "RUNTIME_BASE": "debian:12",
                                   "SPECWIRE_CUDA": "OFF"})
    assert [s["from"] for s in cpu] == ["debian:12", "debian:12"]
    for a, b in zip(cuda, cpu):
        switched = [l.replace("-DSPECWIRE_CUDA=ON", "-DSPECWIRE_CUDA=OFF")
                     .replace('[ "ON" = ON ]', '[ "OFF" = ON ]') for l in a["lines"]]
        assert switched == b["lines"]
    build = "\n".join(cpu[0]["lines"])
    assert "-DSPECWIRE_CUDA=OFF" in build and '[ "OFF" = ON ]' in build
