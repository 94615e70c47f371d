#!/usr/bin/env bash
# Every GPU check in one call of a borrowed GPU host: scripts/gpu_check.sh (build and parity),
# scripts/gpu_prefill.sh (prefill speed) and scripts/gpu_decode.sh (decoding, sessions, the
# scorer's loop), each under its own time limit so that one hang does not take the others. The
# detailed logs go to build/gpu-out/<part>; $OUT (the device tool's output folder) gets each
# part's main log and one archive of everything.
#
#   bash scripts/gpu_all.sh [check] [prefill] [decode]     (default: all three)
# Environment: SPECWIRE_GPU_LIMITS="check=150 prefill=200 decode=230" (seconds), and the parts'.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT_DIR=${OUT:-$ROOT/build/gpu-out}
mkdir -p "$OUT_DIR" build/gpu-out
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(check prefill decode)
declare -A limit=([check]=150 [prefill]=200 [decode]=230)
for kv in ${SPECWIRE_GPU_LIMITS:-}; do limit[${kv%%=*}]=${kv#*=}; done
status=0
for p in "${parts[@]}"; do
  case "$p" in check|prefill|decode) ;; *) echo "unknown part $p (check, prefill, decode)"; exit 2 ;; esac
  dir=build/gpu-out/$p
  rm -rf "$dir"; mkdir -p "$dir"
  echo "== $p (limit ${limit[$p]}s) =="
  t=$(date +%s)
  SPECWIRE_GPU_LOG_DIR=$ROOT/$dir timeout -k 10 "${limit[$p]}" bash "scripts/gpu_$p.sh" > "$dir/stdout.log" 2>&1
  rc=$?
  [ $rc = 124 ] && echo "(timed out after ${limit[$p]}s)" >> "$dir/stdout.log"
  # The table (what follows the run's progress lines) and the ratio lines.
  sed -n '/^check \|^model /,$p' "$dir/stdout.log" | tail -n 60
  grep -E '^[a-z_]+=[0-9.]+$' "$dir/stdout.log" | tail -n 3
  echo "== $p: exit $rc in $(( $(date +%s) - t ))s =="
  cp "$dir/stdout.log" "$OUT_DIR/$p.log" 2>/dev/null
  [ $rc = 0 ] || status=1
done
tar -czf "$OUT_DIR/gpu-logs.tgz" -C build gpu-out 2>/dev/null
exit $status
