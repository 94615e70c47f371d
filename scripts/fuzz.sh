#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan) and runs each for a bounded time,
# starting from its committed seed corpus (fuzz/corpus/<target>, read only). Fails if any target
# finds a crash, a sanitizer report, a failed check, a leak, a timeout or an out-of-memory; the
# input that did it is left in $SPECWIRE_FUZZ_OUT (default build-sanitize/fuzz-out).
#
# Usage: scripts/fuzz.sh [seconds-per-target] [target ...]
# Environment: SPECWIRE_SANITIZE_BUILD_DIR (default build-sanitize; shared with sanitize.sh),
#              SPECWIRE_FUZZ_OUT, SPECWIRE_FUZZ_FLAGS (extra libFuzzer flags).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_PER_TARGET=${1:-20}
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(safetensors_fuzz model_config_fuzz wire_fuzz tokenizer_fuzz tokenizer_json_fuzz
           extractor_request_fuzz scorer_request_fuzz)
fi
BUILD_DIR=${SPECWIRE_SANITIZE_BUILD_DIR:-$ROOT/build-sanitize}
OUT=${SPECWIRE_FUZZ_OUT:-$BUILD_DIR/fuzz-out}

bash scripts/sanitize.sh --build-only fuzzers || exit 1

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
summary=()
for t in "${TARGETS[@]}"; do
  work=$OUT/$t/corpus
  rm -rf "$OUT/$t"
  mkdir -p "$work"
  log=$OUT/$t/log.txt
  # New inputs go to the scratch corpus (first folder); the seeds are only read.
  "$BUILD_DIR/fuzz/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$OUT/$t/" ${SPECWIRE_FUZZ_FLAGS:-} \
    "$work" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    status=1
    summary+=("$(printf '%-24s %12s executions  FAILED (rc %d), see %s' "$t" "${execs:-?}" "$rc" "$log")")
    echo "== $t failed; the end of its log: =="
    tail -40 "$log"
  else
    summary+=("$(printf '%-24s %12s executions  0 crashes' "$t" "${execs:-?}")")
  fi
done
echo "== fuzzing, ${SECONDS_PER_TARGET} s per target =="
printf '%s\n' "${summary[@]}"
exit $status
