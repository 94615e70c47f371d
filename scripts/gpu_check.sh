#!/usr/bin/env bash
# GPU check, run from the repository root on a CUDA host that has the torch wheel (libtorch inside)
# but no Debian dev packages, no transformers and no network. Needs the kit made on a dev machine
# by scripts/gpu_prepare.sh (build/gpu-kit: build dependencies + transformers reference).
#
#   1. takes the kit's binaries (built by gpu_prepare.sh against this host's torch version), or
#      builds the engine binaries with CUDA into build-gpu (scripts/gpu_env.sh)
#   2. tests/gpu/compare.py: parity in fp32 and bf16 against transformers' fp32 CPU states, greedy
#      generation, a layer-split device map, a long-sequence check and the benchmark
#   3. prints a table; exit status 1 when a check fails
#
# Logs go to $SPECWIRE_GPU_LOG_DIR, else $OUT (the device tool's output folder), else build/gpu-out.
# Environment:
#   SPECWIRE_GPU_CHECK_DEVICE=cpu   the same flow on the CPU with SPECWIRE_CUDA=OFF (to test the
#                                   check itself on a machine without a GPU)
#   SPECWIRE_GPU_CHECK_SEQ_LENS     benchmark lengths (default 512,2048,8192; cpu: 128,512)
#   SPECWIRE_GPU_CHECK_SKIP_BENCH=1 parity only
#   SPECWIRE_GPU_LOG_DIR            where the logs go (default $OUT, else build/gpu-out)
#   and scripts/gpu_env.sh's (SPECWIRE_PYTHON, SPECWIRE_TORCH_DIR, SPECWIRE_GPU_BUILD, ...)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
: > "$LOG_DIR/commands.log"

main() {
# ---- checks ----------------------------------------------------------------------------------
if [ "$DEVICE" = cuda ]; then
  SEQ_LENS=${SPECWIRE_GPU_CHECK_SEQ_LENS:-512,2048,8192}; REPS=5; LONG=2048
else
  SEQ_LENS=${SPECWIRE_GPU_CHECK_SEQ_LENS:-128,512}; REPS=2; LONG=512
fi
BENCH_ARGS=()
[ "${SPECWIRE_GPU_CHECK_SKIP_BENCH:-0}" = 1 ] && BENCH_ARGS+=(--skip-bench)
mkdir -p "$BUILD_DIR"
"$PY" -u tests/gpu/compare.py run --extract "$BIN_EXTRACT" --bench "$BIN_BENCH_EXTRACT" \
  --ref "$KIT/ref" --out "$LOG_DIR" --work "$BUILD_DIR/gpu-check" \
  --device "$DEVICE" --bench-model "$BUILD_DIR/bench-models/qwen3-100m" --seq-lens "$SEQ_LENS" \
  --reps $REPS --long-len $LONG ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"}
gpu_done $? "build ${BUILD_S}s, "
}

gpu_main gpu_check.log
