"""`specwire-cli health`: the probe of the Docker HEALTHCHECKs, compose healthchecks and the
Kubernetes probes. Exit 0 only when the checked service is SERVING."""
from __future__ import annotations

import subprocess
from concurrent import futures

import grpc
import pytest
from deploy_harness import CLI, binary, free_port
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


@pytest.fixture(scope="module")
def health_server():
    """A stock grpcio health server whose statuses the tests set."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def probe(target: str, *args: str, kind: str = "extractor") -> subprocess.CompletedProcess:
    """`specwire-cli health` against `target` named by the connection flags of `kind`
    (--extractor / --scorer): any specwire server answers either way."""
    return subprocess.run(
        [str(binary(CLI)), "health", f"--{kind}", target, *args, f"--{kind}_timeout", "10"],
        capture_output=True, text=True, timeout=30)


def test_serving_exits_0(health_server):
    servicer, target = health_server
    servicer.set("specwire.v1.Extractor", health_pb2.HealthCheckResponse.SERVING)
    r = probe(target, "--service", "specwire.v1.Extractor")
    assert (r.returncode, r.stdout) == (0, "SERVING\n"), r.stderr
    # The server as a whole ("" service): grpcio's servicer answers SERVING for it by default.
    r = probe(target)
    assert (r.returncode, r.stdout) == (0, "SERVING\n"), r.stderr


def test_not_serving_exits_1(health_server):
    servicer, target = health_server
    servicer.set("specwire.v1.Scorer", health_pb2.HealthCheckResponse.NOT_SERVING)
    r = probe(target, "--service", "specwire.v1.Scorer", kind="scorer")
    assert (r.returncode, r.stdout) == (1, "NOT_SERVING\n")


def test_unknown_service_and_unreachable_server(health_server):
    _, target = health_server
    r = probe(target, "--service", "no.such.Service")
    assert r.returncode == 1
    assert r.stderr.startswith("specwire-cli: NOT_FOUND: health check of \"no.such.Service\"")
    port = free_port()  # nothing listens there
    r = probe(f"127.0.0.1:{port}")
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr


def test_bad_flags_fail_with_the_flag_named():
    """absl refuses a flag without its value, a bad value and an unknown flag (exit status 1);
    specwire-cli's own checks exit 2."""
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(binary(CLI)), *args], capture_output=True, text=True,
                              timeout=30)
    r = cli("health", "--extractor")
    assert r.returncode == 1 and "Missing the value for the flag 'extractor'" in r.stderr
    r = cli("health", "--extractor_timeout", "soon")
    assert r.returncode == 1 and "Illegal value 'soon'" in r.stderr
    assert "extractor_timeout" in r.stderr
    r = cli("health", "--target", "127.0.0.1:1")  # the spelling before the flag sets
    assert r.returncode == 1 and "Unknown command line flag 'target'" in r.stderr
    r = cli("health", "--extractor_timeout=-1")
    assert r.returncode == 2 and "--extractor_timeout" in r.stderr
    r = cli("probe")
    assert r.returncode == 2 and "unknown command probe" in r.stderr
