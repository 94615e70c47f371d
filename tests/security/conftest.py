"""Security tier: TLS, mTLS and bearer tokens on real specwire-extractor / specwire-scorer processes
on 127.0.0.1, with certificates made by openssl when the tests start."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
from extractor_harness import hf_fixtures  # noqa: E402,F401  (puts tests/parity on sys.path)


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{res.stderr}")


def _key_and_csr(d: Path, name: str, cn: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _sign(d: Path, name: str, ca: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
             cwd=d)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA; a server certificate for 127.0.0.1 / localhost; a client certificate from the same
    CA; and a rogue CA with its own client certificate (the wrong one)."""
    d = tmp_path_factory.mktemp("certs")
    _ca(d, "ca")
    _ca(d, "rogue-ca")
    _key_and_csr(d, "server", "specwire-server")
    _sign(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
          "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    for name, ca in (("client", "ca"), ("rogue-client", "rogue-ca")):
        _key_and_csr(d, name, name)
        _sign(d, name, ca, "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    token = d / "token"
    token.write_text("sw-test-token-7f3a9c\n")
    wrong = d / "wrong-token"
    wrong.write_text("sw-test-token-7f3a9d\n")
    out = {n: d / f"{n}.crt" for n in ("ca", "rogue-ca", "server", "client", "rogue-client")}
    out |= {f"{n}.key": d / f"{n}.key" for n in ("server", "client", "rogue-client")}
    out |= {"token": token, "wrong-token": wrong, "dir": d}
    return out
