#!/usr/bin/env bash
# Prefill speed of the extractor on a GPU (bench/gpu_prefill.py): Qwen3-8B's and Qwen3.6-27B's
# hybrid shapes on random weights drawn on the device, bf16, 512- and 2,048-token prompts in
# batches; tokens/s, FLOP/s against the same GEMMs timed in the same run
# (gpu_prefill_vs_gemm_ratio), MFU, the device-to-host copy and how much of it overlaps the next
# forward, the host waits per extraction. Run from the repository root on the CUDA host after
# scripts/gpu_prepare.sh made the kit here and it was carried (build/gpu-kit).
#
# Environment: SPECWIRE_GPU_PREFILL_ARGS (extra arguments for bench/gpu_prefill.py, e.g.
# "--hybrid-layers 24"), SPECWIRE_GPU_LOG_DIR, and scripts/gpu_env.sh's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh

main() {
  local args=()
  [ "$DEVICE" = cuda ] || args+=(--device cpu --small --seq-lens 128,256 --tokens-per-batch 1024
                                 --packed-rows 512,1024 --reps 1)
  # shellcheck disable=SC2206
  args+=(${SPECWIRE_GPU_PREFILL_ARGS:-})
  mkdir -p "$BUILD_DIR"
  "$PY" -u bench/gpu_prefill.py --bench "$BIN_BENCH_EXTRACT" --work "$BUILD_DIR/gpu-prefill" \
    --out "$LOG_DIR" ${args[@]+"${args[@]}"}
  gpu_done $?
}

gpu_main gpu_prefill.log
