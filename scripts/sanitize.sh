#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run of the torch-free C++ tests: core_tests
# (safetensors, checkpoints, config.json, wire), tokenizer_tests, security_tests (TLS, tokens),
# scorer_service_tests (reports, job runner and the scorer's gRPC service over fakes) and
# client_tests (the extractor's gRPC service and C++ client over loopback). Tests that link
# libtorch are left out: the wheel's libraries are not built with ASan and their allocator and
# OpenMP runtime swamp it with reports that are not ours.
#
# One clang build (build-sanitize, -DSPECWIRE_FUZZ=ON) serves this script and scripts/fuzz.sh:
# the coverage instrumentation the fuzzers need does not change what the tests run.
#
# Usage: scripts/sanitize.sh              build and run the tests
#        scripts/sanitize.sh --build-only TARGET...   configure and build TARGETs (fuzz.sh)
# Environment: SPECWIRE_SANITIZE_BUILD_DIR (default build-sanitize), SPECWIRE_JOBS.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${SPECWIRE_SANITIZE_BUILD_DIR:-$ROOT/build-sanitize}
JOBS=${SPECWIRE_JOBS:-$(nproc)}
TESTS=(core_tests tokenizer_tests security_tests scorer_service_tests client_tests)

build_only=0
targets=("${TESTS[@]}")
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
  targets=("$@")
fi

for tool in clang-14 clang++-14; do
  command -v $tool >/dev/null || { echo "sanitize: $tool missing (scripts/setup.sh installs it)"; exit 1; }
done
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  TORCH_DIR=$(.venv/bin/python -c 'import os, torch; print(os.path.dirname(torch.__file__))') || exit 1
  echo "[sanitize] configuring $BUILD_DIR (clang-14, ASan + UBSan + libFuzzer)"
  CC=clang-14 CXX=clang++-14 cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSPECWIRE_FUZZ=ON -DSPECWIRE_TORCH_DIR="$TORCH_DIR" -DPython3_EXECUTABLE="$ROOT/.venv/bin/python" \
    >/dev/null || exit 1
fi
start=$(date +%s)
echo "[sanitize] building ${targets[*]}"
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" || exit 1
echo "[sanitize] built in $(( $(date +%s) - start )) s"
[ $build_only = 1 ] && exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
for t in "${TESTS[@]}"; do
  bin=$(find "$BUILD_DIR" -name "$t" -type f -perm -u+x | head -1)
  echo "== $t (ASan + UBSan) =="
  t0=$(date +%s)
  if "$bin" --gtest_brief=1; then
    echo "== $t passed in $(( $(date +%s) - t0 )) s =="
  else
    echo "== $t FAILED =="
    status=1
  fi
done
exit $status
