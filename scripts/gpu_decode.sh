#!/usr/bin/env bash
# Decoding, live sessions and the scorer's loop on a GPU (bench/gpu_decode.py): the decoding,
# session and packing unit tests rerun on the device; batch invariance of decoding (tiny
# reference targets and Qwen3-8B's shapes, fp32 and bf16); Generate's tokens/s per batch
# (generate_batching_ratio); a decode step as a CUDA graph; the committed drafters' replay on the
# GPU against the CPU; the live loop in-process (live_vs_replay_cost). Run from the repository
# root on the CUDA host after scripts/gpu_prepare.sh made the kit here and it was carried.
#
# Environment: SPECWIRE_GPU_DECODE_ARGS (extra arguments for bench/gpu_decode.py),
# SPECWIRE_GPU_LOG_DIR, and scripts/gpu_env.sh's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh

main() {
  local args=()
  [ "$DEVICE" = cuda ] || args+=(--device cpu --device-name cpu --small --batches 1,4
                                 --graph-batches 1 --new-tokens 8)
  # shellcheck disable=SC2206
  args+=(${SPECWIRE_GPU_DECODE_ARGS:-})
  mkdir -p "$BUILD_DIR"
  "$PY" -u bench/gpu_decode.py --bench-decode "$BIN_BENCH_DECODE" --replay "$BIN_REPLAY" \
    --models-tests "${BIN_MODELS_TESTS:-}" --ref "$KIT/ref" --prompts "$KIT/ref/replay_prompts.json" \
    --work "$BUILD_DIR/gpu-decode" --out "$LOG_DIR" ${args[@]+"${args[@]}"}
  gpu_done $?
}

gpu_main gpu_decode.log
