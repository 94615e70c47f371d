#!/usr/bin/env bash
# Runs every test tier: C++ unit tests (ctest), then the Python tiers (parity against transformers,
# service, end-to-end) with pytest. Installs and builds first (scripts/setup.sh).
# Exit status is non-zero if any tier fails.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export SPECWIRE_BUILD_DIR=${SPECWIRE_BUILD_DIR:-$ROOT/build}
bash scripts/setup.sh || exit 1
. .venv/bin/activate

start=$(date +%s)
status=0
echo "== unit tests (ctest) =="
ctest --test-dir "$SPECWIRE_BUILD_DIR" --output-on-failure -j "$(nproc)" || status=1
echo "== parity, service and end-to-end tests (pytest) =="
python -m pytest tests -q -p no:cacheprovider --durations=5 || status=1
echo "== sanitizers: ASan + UBSan build of the torch-free C++ tests (scripts/sanitize.sh) =="
bash scripts/sanitize.sh || status=1
echo "== fuzzing: each libFuzzer target for ${SPECWIRE_FUZZ_SECONDS:-15} s (scripts/fuzz.sh) =="
bash scripts/fuzz.sh "${SPECWIRE_FUZZ_SECONDS:-15}" || status=1
echo "== all tiers finished in $(( $(date +%s) - start )) s, status $status =="
exit $status
