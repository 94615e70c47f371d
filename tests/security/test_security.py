"""TLS, mTLS and bearer tokens, end to end on loopback.

Three extractors (TLS; mTLS + token with health open; plaintext + token with health closed) and a
scorer (TLS + token, talking to the mTLS + token extractor with a client certificate and the
token) serve a tiny random target. Checked: TLS works and a plaintext or wrongly-rooted client
fails cleanly (UNAVAILABLE, the server unharmed); mTLS refuses a client without a certificate or
with one from another CA; the token: missing → UNAUTHENTICATED, wrong → UNAUTHENTICATED, right →
OK, for every RPC including reflection, health open only when asked; specwire-cli and
specwire-score with their TLS/token flags and the environment variable; a scoring job through
the secured scorer → extractor path; the scorer's --data_root confinement (a path outside it, and
a symlink out of it); metrics on their own plain-HTTP address. About 25 s on two cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest
import torch
from extractor_harness import ExtractorServer, build_dir
from grpc_health.v1 import health_pb2, health_pb2_grpc
from processes import launch_server, stop_process

from specwire_client import (ChannelSecurity, ExtractorClient, ExtractorError, FeatureDataset,
                             RetryPolicy)
from specwire_client._generated.proto.specwire.v1 import scorer_pb2 as spb
from specwire_client._generated.proto.specwire.v1 import scorer_pb2_grpc as spb_grpc

pytest.importorskip("dflash", reason="the drafter comes from dflash's model code")
import dflash_fixtures as F  # noqa: E402

BLOCK = 4
TARGET_LAYER_IDS = [1, 2]


def _binary(sub: str, name: str) -> Path:
    exe = build_dir() / sub / name
    if not exe.exists():
        pytest.fail(f"{exe} not built (set SPECWIRE_BUILD_DIR)", pytrace=False)
    return exe


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    """A 3-layer random target and an (untrained) DFlash drafter for it, under one data root."""
    root = tmp_path_factory.mktemp("data")
    target = F.make_target(root / "target", overrides={"num_hidden_layers": 3})
    hf = F.hf_target(target)
    cfg = F.drafter_config(hf.config, block_size=BLOCK, target_layer_ids=TARGET_LAYER_IDS,
                           layer_types=["full_attention"], sliding_window=8)
    drafter = F.save_drafter(F.new_drafter(cfg, seed=1), root / "drafters" / "d1", zlab_rope={})
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 500, (2, 6), generator=g).tolist()
    return {"root": root, "target": target, "drafter": drafter, "prompts": prompts}


@pytest.fixture(scope="module")
def servers(pair, certs, tmp_path_factory):
    c = certs
    tls = ["--tls_cert", str(c["server"]), "--tls_key", str(c["server.key"])]
    specs = {
        "tls": (tls, True),
        "mtls_token": (tls + ["--tls_client_ca", str(c["ca"]), "--auth_token_file",
                              str(c["token"])], False),
        "plain_token": (["--auth_token_file", str(c["token"]), "--auth_open_health=false"],
                        False),
    }
    out: dict[str, ExtractorServer] = {}
    try:
        for name, (args, metrics) in specs.items():
            out[name] = ExtractorServer(pair["target"], tmp_path_factory.mktemp(name),
                                        args=tuple(args), metrics=metrics).start()
        yield out
    finally:
        for s in out.values():
            s.stop()


def _tls(certs, **kw) -> dict:
    return dict(tls_ca=certs["ca"], **kw)


def _mtls(certs, **kw) -> dict:
    return dict(tls_ca=certs["ca"], tls_client_cert=certs["client"],
                tls_client_key=certs["client.key"], **kw)


def _info_code(address: str, **kw) -> grpc.StatusCode | None:
    with ExtractorClient(address, timeout=10, **kw) as c:
        try:
            c.model_info()
        except ExtractorError as e:
            return e.code
    return None


# --- TLS --------------------------------------------------------------------------------------

def test_tls_extract_round_trip(servers, certs):
    s = servers["tls"]
    assert "[TLS]" in s.log()
    with ExtractorClient(s.address, timeout=30, **_tls(certs)) as c:
        assert c.model_info().num_layers == 3
        states = c.extract([[1, 2, 3, 4, 5]], [0, 2], dtype="fp32")
    assert states[0]["layer.2"].shape == (5, 64)


def test_feature_dataset_over_mtls_and_token(servers, certs):
    """The training-side reader keeps its TLS material and token for every (re)connection."""
    s = servers["mtls_token"]
    security = ChannelSecurity.resolve(**_mtls(certs, token_file=certs["token"]))
    seqs = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    ds = FeatureDataset(s.address, seqs, [1], dtype="fp32", sequences_per_request=2,
                        timeout=30, security=security)
    items = list(ds)
    assert [it["input_ids"].tolist() for it in items] == seqs
    assert [tuple(it["hidden_states"]["layer.1"].shape) for it in items] == [(3, 64), (4, 64),
                                                                              (2, 64)]
    # Without the token the same dataset is refused, not retried forever.
    bare = FeatureDataset(s.address, seqs, [1], dtype="fp32", retry=RetryPolicy(max_retries=0),
                          timeout=30,
                          security=ChannelSecurity.resolve(**_mtls(certs)))
    with pytest.raises(ExtractorError) as e:
        list(bare)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_plaintext_client_to_tls_server_fails_cleanly(servers, certs):
    s = servers["tls"]
    assert _info_code(s.address) == grpc.StatusCode.UNAVAILABLE
    assert _info_code(s.address, tls_ca=certs["rogue-ca"]) == grpc.StatusCode.UNAVAILABLE
    # the server is unharmed
    assert s.proc.poll() is None
    assert _info_code(s.address, **_tls(certs)) is None


def test_mtls_requires_a_certificate_from_the_configured_ca(servers, certs):
    s = servers["mtls_token"]
    assert "[mTLS + bearer token (health open)]" in s.log()
    tok = dict(token_file=certs["token"])
    assert _info_code(s.address, **_tls(certs, **tok)) == grpc.StatusCode.UNAVAILABLE
    rogue = dict(tls_ca=certs["ca"], tls_client_cert=certs["rogue-client"],
                 tls_client_key=certs["rogue-client.key"], **tok)
    assert _info_code(s.address, **rogue) == grpc.StatusCode.UNAVAILABLE
    assert _info_code(s.address, **_mtls(certs, **tok)) is None
    assert s.proc.poll() is None


def test_bad_security_flags_fail_at_start(pair, certs):
    exe = _binary("services/extractor", "specwire-extractor")
    for args, words in (([f"--tls_cert={certs['server']}"], "--tls_cert and --tls_key"),
                        ([f"--tls_client_ca={certs['ca']}"], "--tls_client_ca needs"),
                        (["--auth_token_file=/nonexistent/token"], "--auth_token_file")):
        res = subprocess.run([str(exe), f"--model={pair['target']}", "--listen=127.0.0.1:0",
                              "--metrics_listen=", *args], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 2 and words in res.stderr, (args, res.stderr)


# --- tokens -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["mtls_token", "plain_token"])
def test_token_missing_wrong_right(servers, certs, kind, monkeypatch):
    monkeypatch.delenv("SPECWIRE_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("SPECWIRE_AUTH_TOKEN_FILE", raising=False)
    s = servers[kind]
    base = _mtls(certs) if kind == "mtls_token" else {}
    with ExtractorClient(s.address, timeout=10, **base) as c:
        with pytest.raises(ExtractorError) as e:
            c.model_info()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert "missing bearer token" in str(e.value)
        with pytest.raises(ExtractorError) as e:  # a streaming call is refused the same way
            c.extract([[1, 2, 3]], [0])
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with ExtractorClient(s.address, timeout=10, token_file=certs["wrong-token"], **base) as c:
        with pytest.raises(ExtractorError) as e:
            c.model_info()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert "invalid bearer token" in str(e.value)
    with ExtractorClient(s.address, timeout=30, token_file=certs["token"], **base) as c:
        assert c.extract([[1, 2, 3]], [0])[0]["layer.0"].shape == (3, 64)
    # the token from the environment
    monkeypatch.setenv("SPECWIRE_AUTH_TOKEN", certs["token"].read_text().strip())
    assert _info_code(s.address, **base) is None
    monkeypatch.delenv("SPECWIRE_AUTH_TOKEN")
    monkeypatch.setenv("SPECWIRE_AUTH_TOKEN_FILE", str(certs["token"]))
    assert _info_code(s.address, **base) is None


def test_malformed_authorization_and_reflection(servers, certs):
    s = servers["plain_token"]
    channel = grpc.insecure_channel(s.address)
    info = channel.unary_unary("/specwire.v1.Extractor/GetModelInfo",
                               request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        info(b"", metadata=[("authorization", "Basic abc")], timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not \"Bearer <token>\"" in e.value.details()
    refl = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                 request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        list(refl(iter([b"\x3a\x00"]), timeout=10))  # list_services
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()


def test_health_open_or_closed_as_configured(servers, certs):
    req = health_pb2.HealthCheckRequest(service="specwire.v1.Extractor")
    s = servers["mtls_token"]  # health open (the default), but mTLS still applies
    creds = grpc.ssl_channel_credentials(certs["ca"].read_bytes(),
                                         certs["client.key"].read_bytes(),
                                         certs["client"].read_bytes())
    with grpc.secure_channel(s.address, creds) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(req, timeout=10)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    s = servers["plain_token"]  # --auth_open_health=false
    with grpc.insecure_channel(s.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(ch).Check(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        r = health_pb2_grpc.HealthStub(ch).Check(
            req, timeout=10,
            metadata=[("authorization", "Bearer " + certs["token"].read_text().strip())])
        assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_metrics_on_their_own_plain_address(servers):
    s = servers["tls"]  # gRPC over TLS, metrics plain HTTP elsewhere
    assert s.metrics_port != s.port
    with urllib.request.urlopen(f"http://127.0.0.1:{s.metrics_port}/metrics", timeout=5) as r:
        assert "specwire" in r.read().decode()
    assert "metrics on" not in servers["plain_token"].log()  # --metrics_listen= disables


def test_cli_flags(servers, certs):
    s = servers["mtls_token"]
    cli = _binary("clients/cli", "specwire-cli")
    # The same --extractor* flags as specwire-scorer's and specwire-score's.
    base = [str(cli), "info", "--extractor", s.address, "--extractor_timeout", "20",
            "--extractor_tls_ca", str(certs["ca"]), "--extractor_tls_client_cert",
            str(certs["client"]), "--extractor_tls_client_key", str(certs["client.key"])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECWIRE_AUTH_TOKEN")}
    ok = subprocess.run(base + ["--extractor_auth_token_file", str(certs["token"])],
                        capture_output=True, text=True, timeout=60, env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["num_layers"] == 3
    missing = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env)
    assert missing.returncode == 1 and "UNAUTHENTICATED" in missing.stderr
    assert "missing bearer token" in missing.stderr
    from_env = subprocess.run(base, capture_output=True, text=True, timeout=60,
                              env=env | {"SPECWIRE_AUTH_TOKEN_FILE": str(certs["token"])})
    assert from_env.returncode == 0, from_env.stderr
    bad = subprocess.run(base + ["--extractor_auth_token_file", str(certs["dir"] / "nope")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "--extractor_auth_token_file" in bad.stderr


# --- the scorer: TLS + token in front, mTLS + token to the extractor ---------------------------

class _Scorer:
    def __init__(self, args: list[str], log: Path) -> None:
        self.log_path = log
        cmd = [str(_binary("services/scorer", "specwire-scorer")), "--listen=127.0.0.1:0",
               "--metrics_listen=", "--dtype=float32", "--threads=1", "--cache_dir=none", *args]
        self.proc, port = launch_server(cmd, log, 60)
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture(scope="module")
def scorers(servers, certs, pair, tmp_path_factory):
    c = certs
    to_extractor = ["--extractor", servers["mtls_token"].address, "--extractor_tls_ca",
                    str(c["ca"]), "--extractor_tls_client_cert", str(c["client"]),
                    "--extractor_tls_client_key", str(c["client.key"])]
    front = ["--tls_cert", str(c["server"]), "--tls_key", str(c["server.key"]),
             "--auth_token_file", str(c["token"]), "--data_root", str(pair["root"])]
    d = tmp_path_factory.mktemp("scorers")
    started = []
    try:
        started.append(_Scorer(front + to_extractor + ["--extractor_auth_token_file",
                                                       str(c["token"])], d / "good.log"))
        # The same without the extractor's token: its jobs must be refused by the extractor.
        started.append(_Scorer(front + to_extractor, d / "no-token.log"))
        yield {"good": started[0], "no_token": started[1]}
    finally:
        for s in started:
            s.stop()


def _scorer_stub(address: str, certs, token: bool = True):
    creds = grpc.ssl_channel_credentials(certs["ca"].read_bytes())
    if token:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(certs["token"].read_text().strip()))
    ch = grpc.secure_channel(address, creds)
    return ch, spb_grpc.ScorerStub(ch)


def _request(pair, **kw) -> spb.ScoreRequest:
    args = dict(drafter_path=str(pair["drafter"]), max_new_tokens=8,
                prompts=[spb.PromptInput(tokens={"ids": p}) for p in pair["prompts"]])
    return spb.ScoreRequest(**(args | kw))


def test_scoring_job_over_tls_and_tokens(scorers, certs, pair, monkeypatch):
    ch, stub = _scorer_stub(scorers["good"].address, certs)
    msgs = list(stub.Score(_request(pair), timeout=120))
    assert msgs[-1].WhichOneof("message") == "summary"
    assert msgs[-1].summary.responses == len(pair["prompts"])
    ch.close()
    # without the token the scorer itself refuses
    ch, stub = _scorer_stub(scorers["good"].address, certs, token=False)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Score(_request(pair), timeout=60))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    ch.close()
    # specwire-score through the scorer, with its --scorer* TLS and token flags
    out = pair["root"] / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECWIRE_AUTH_TOKEN")}
    res = subprocess.run(
        [str(_binary("services/scorer", "specwire-score")), "--scorer", scorers["good"].address,
         "--scorer_tls_ca", str(certs["ca"]), "--scorer_auth_token_file", str(certs["token"]),
         "--drafter", str(pair["drafter"]), "--tokens", "5,6,7,8,9", "--max_new_tokens", "8",
         "--json_out", str(out), "--quiet"], capture_output=True, text=True, timeout=120,
        env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["summary"]["responses"] == 1


def test_scorer_without_the_extractor_token_is_refused_by_the_extractor(scorers, certs, pair):
    ch, stub = _scorer_stub(scorers["no_token"].address, certs)
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Score(_request(pair), timeout=60))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "bearer token" in e.value.details()
    ch.close()


def test_scorer_paths_confined_to_data_root(scorers, certs, pair, tmp_path):
    ch, stub = _scorer_stub(scorers["good"].address, certs)
    outside = F.save_drafter(F.new_drafter(
        F.drafter_config(F.hf_target(pair["target"]).config, block_size=BLOCK,
                         target_layer_ids=TARGET_LAYER_IDS, layer_types=["full_attention"],
                         sliding_window=8), seed=2), tmp_path / "outside", zlab_rope={})
    escape = pair["root"] / "drafters" / "escape"
    if not escape.exists():
        escape.symlink_to(outside)
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"input_ids": [1, 2, 3]}\n')
    for req, field in ((_request(pair, drafter_path=str(outside)), "drafter_path"),
                       (_request(pair, drafter_path=str(escape)), "drafter_path"),
                       (_request(pair, drafter_path=str(pair["root"] / ".." / "x")),
                        "drafter_path"),
                       (spb.ScoreRequest(drafter_path=str(pair["drafter"]),
                                         dataset_path=str(dataset), max_new_tokens=8),
                        "dataset_path")):
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Score(req, timeout=60))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
        assert f"{field}: " in e.value.details() and "outside --data_root" in e.value.details()
    ch.close()
