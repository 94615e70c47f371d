#!/usr/bin/env bash
# GPU check, run from the repository root on a CUDA host that has the torch wheel (libtorch inside)
# but no Debian dev packages, no transformers and no network. Needs the kit made on a dev machine
# by scripts/gpu_prepare.sh (build/gpu-kit: build dependencies + transformers reference).
#
#   1. builds specwire-extract and specwire-bench-extract with CUDA into build-gpu (engine only)
#   2. tests/gpu/compare.py: parity in fp32 and bf16 against transformers' fp32 CPU states, greedy
#      generation, a layer-split device map, a long-sequence check and the benchmark
#   3. prints a table; exit status 1 when a check fails
#
# Logs go to $OUT (the device tool's output folder) when set, else build/gpu-out.
# Environment:
#   SPECWIRE_GPU_CHECK_DEVICE=cpu   the same flow on the CPU with SPECWIRE_CUDA=OFF (to test the
#                                   check itself on a machine without a GPU)
#   SPECWIRE_GPU_CHECK_SEQ_LENS     benchmark lengths (default 512,2048,8192; cpu: 128,512)
#   SPECWIRE_GPU_CHECK_SKIP_BENCH=1 parity only
#   SPECWIRE_PYTHON                 a python with torch (default: the first of python3, python,
#                                   .venv/bin/python that imports torch)
#   SPECWIRE_TORCH_DIR              libtorch to build against (default: that python's torch)
#   SPECWIRE_JOBS                   build jobs (default nproc)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
T0=$(date +%s)
DEVICE=${SPECWIRE_GPU_CHECK_DEVICE:-cuda}
LOG_DIR=${OUT:-$ROOT/build/gpu-out}
BUILD_DIR=${SPECWIRE_GPU_BUILD_DIR:-$ROOT/build-gpu}
KIT=$ROOT/build/gpu-kit
JOBS=${SPECWIRE_JOBS:-$(nproc)}
mkdir -p "$LOG_DIR"
: > "$LOG_DIR/commands.log"

log() { printf '[gpu-check] %s\n' "$*"; }
die() { log "ERROR: $*"; exit 2; }

main() {
if [ ! -f "$KIT/ref/manifest.json" ] || [ ! -d "$KIT/deps/usr/include/absl" ]; then
  die "$KIT is missing or incomplete: run scripts/gpu_prepare.sh on the dev machine and carry build/gpu-kit"
fi

PY=""
for p in ${SPECWIRE_PYTHON:-} python3 python "$ROOT/.venv/bin/python"; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then PY=$(command -v "$p"); break; fi
done
[ -n "$PY" ] || die "no python with torch found (set SPECWIRE_PYTHON)"
TORCH_DIR=${SPECWIRE_TORCH_DIR:-$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')}
log "python: $PY; torch $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
log "torch dir: $TORCH_DIR"
if [ "$DEVICE" = cuda ]; then
  CUDA=ON
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  CUDA=OFF
fi
log "cmake $(cmake --version | head -n1 | awk '{print $3}'), ninja $(ninja --version 2>/dev/null || echo '?'), " \
    "c++: $(${CXX:-c++} --version 2>/dev/null | head -n1)"

# absl's CMake targets link -latomic. A compiler install normally provides libatomic; if this one
# cannot link it, use the copy in the kit (deps/fallback-lib, Debian 12's libatomic1).
DEPS=$KIT/deps
EXTRA_CMAKE=()
if ! printf 'int main() { return 0; }\n' | ${CXX:-c++} -x c++ - -latomic -o /dev/null 2>/dev/null; then
  log "the compiler cannot link -latomic: using $DEPS/fallback-lib"
  EXTRA_CMAKE+=("-DCMAKE_EXE_LINKER_FLAGS=-L$DEPS/fallback-lib -Wl,-rpath,$DEPS/fallback-lib")
fi
# The kit's shared libraries are found through the binaries' build RPATH; this is a second way.
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- build -----------------------------------------------------------------------------------
tb=$(date +%s)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
[ -f "$BUILD_DIR/CMakeCache.txt" ] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=Ninja" "$BUILD_DIR/CMakeCache.txt" && GEN=()
log "configuring $BUILD_DIR (SPECWIRE_CUDA=$CUDA)"
cmake -S "$ROOT" -B "$BUILD_DIR" ${GEN[@]+"${GEN[@]}"} -DCMAKE_BUILD_TYPE=Release \
  -DSPECWIRE_ENGINE_ONLY=ON -DSPECWIRE_CUDA=$CUDA -DSPECWIRE_TESTS=OFF \
  -DSPECWIRE_DEPS_ROOT="$DEPS" -DSPECWIRE_TORCH_DIR="$TORCH_DIR" -DPython3_EXECUTABLE="$PY" \
  ${EXTRA_CMAKE[@]+"${EXTRA_CMAKE[@]}"} > "$LOG_DIR/cmake-configure.log" 2>&1 ||
  { tail -n 30 "$LOG_DIR/cmake-configure.log"; die "configure failed (log: cmake-configure.log)"; }
absl_dir=$(grep '^absl_DIR:' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2-)
log "absl from: $absl_dir"
case "$absl_dir" in "$DEPS"/*) ;; *) log "WARNING: absl was not taken from the kit" ;; esac
log "building specwire-extract specwire-bench-extract ($JOBS jobs)"
cmake --build "$BUILD_DIR" -j "$JOBS" --target specwire-extract specwire-bench-extract \
  > "$LOG_DIR/build.log" 2>&1 ||
  { grep -E 'FAILED:|error:|undefined reference' "$LOG_DIR/build.log" | cut -c1-400 | head -n 30
    die "build failed (log: build.log)"; }
BUILD_S=$(( $(date +%s) - tb ))
log "build: ${BUILD_S}s"
# --version (absl flags: it exits 0; --help exits 1 by absl's convention) loads every shared
# library the binary links, the kit's absl flags libraries included.
"$BUILD_DIR/services/extractor/specwire-extract" --version > /dev/null ||
  die "specwire-extract does not start (missing shared libraries?): $(ldd "$BUILD_DIR/services/extractor/specwire-extract" | grep 'not found' | tr '\n' ' ')"

# ---- checks ----------------------------------------------------------------------------------
if [ "$DEVICE" = cuda ]; then
  SEQ_LENS=${SPECWIRE_GPU_CHECK_SEQ_LENS:-512,2048,8192}; REPS=5; LONG=2048
else
  SEQ_LENS=${SPECWIRE_GPU_CHECK_SEQ_LENS:-128,512}; REPS=2; LONG=512
fi
BENCH_ARGS=()
[ "${SPECWIRE_GPU_CHECK_SKIP_BENCH:-0}" = 1 ] && BENCH_ARGS+=(--skip-bench)
"$PY" -u tests/gpu/compare.py run --build-dir "$BUILD_DIR" --ref "$KIT/ref" --out "$LOG_DIR" \
  --work "$BUILD_DIR/gpu-check" \
  --device "$DEVICE" --bench-model "$BUILD_DIR/bench-models/qwen3-100m" --seq-lens "$SEQ_LENS" \
  --reps $REPS --long-len $LONG ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"}
status=$?
log "build ${BUILD_S}s, total $(( $(date +%s) - T0 ))s, status $status (logs: $LOG_DIR)"
return $status
}

main 2>&1 | tee "$LOG_DIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
