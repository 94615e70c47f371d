# Sourced by the GPU scripts (gpu_check.sh, gpu_prefill.sh, gpu_decode.sh), from the repository
# root on a CUDA host that has the torch wheel but no Debian dev packages and no network. Needs the
# kit that scripts/gpu_prepare.sh makes on a dev machine (build/gpu-kit).
#
# On sourcing: ROOT (the repository root), T0 (the start), LOG_DIR ($SPECWIRE_GPU_LOG_DIR, else
# $OUT, the device tool's output folder, else build/gpu-out; created). A script defines main(),
# which ends with `gpu_done $?`, and ends with `gpu_main NAME.log`: gpu_env_setup, then main,
# their output teed into $LOG_DIR/NAME.log; the script exits with their status.
#
# After `gpu_env_setup`:
#   PY           a python that imports torch; TORCH_DIR its torch package
#   BIN_EXTRACT, BIN_BENCH_EXTRACT, BIN_BENCH_DECODE, BIN_REPLAY   the engine binaries
#   BIN_MODELS_TESTS   the model unit tests (empty when the binaries were built here: no GTest)
#   BUILD_S      seconds spent building (0 with the kit's binaries)
#   LD_LIBRARY_PATH    torch's lib and the kit's shared libraries
# The binaries are the kit's (build/gpu-kit/bin, built by gpu_prepare.sh against the same torch
# version the host has) when they start here, else built into $BUILD_DIR (engine only).
#
# Environment:
#   SPECWIRE_GPU_CHECK_DEVICE=cpu   the same flow on the CPU with SPECWIRE_CUDA=OFF (to test the
#                                   scripts on a machine without a GPU)
#   SPECWIRE_GPU_BUILD=1            build here even when the kit's binaries would do
#   SPECWIRE_PYTHON, SPECWIRE_TORCH_DIR, SPECWIRE_JOBS, SPECWIRE_GPU_BUILD_DIR
ROOT=$PWD
T0=$(date +%s)
LOG_DIR=${SPECWIRE_GPU_LOG_DIR:-${OUT:-$ROOT/build/gpu-out}}
mkdir -p "$LOG_DIR"
DEVICE=${SPECWIRE_GPU_CHECK_DEVICE:-cuda}
KIT=$ROOT/build/gpu-kit
DEPS=$KIT/deps
BUILD_DIR=${SPECWIRE_GPU_BUILD_DIR:-$ROOT/build-gpu}
JOBS=${SPECWIRE_JOBS:-$(nproc)}

log() { printf '[gpu] %s\n' "$*"; }
die() { log "ERROR: $*"; exit 2; }

# gpu_main NAME.log: a script's last line (above).
gpu_main() {
  { gpu_env_setup "$LOG_DIR"; main; } 2>&1 | tee "$LOG_DIR/$1"
  exit "${PIPESTATUS[0]}"
}

# gpu_done STATUS [PREFIX]: main's last line: logs PREFIX, the total time and STATUS; returns it.
gpu_done() {
  log "${2:-}total $(( $(date +%s) - T0 ))s, status $1 (logs: $LOG_DIR)"
  return "$1"
}

gpu_env_setup() {
  local log_dir=$1
  if [ ! -f "$KIT/ref/manifest.json" ] || [ ! -d "$DEPS/usr/include/absl" ]; then
    die "$KIT is missing or incomplete: run scripts/gpu_prepare.sh on the dev machine and carry build/gpu-kit"
  fi
  PY=""
  for p in ${SPECWIRE_PYTHON:-} python3 python "$ROOT/.venv/bin/python"; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then PY=$(command -v "$p"); break; fi
  done
  [ -n "$PY" ] || die "no python with torch found (set SPECWIRE_PYTHON)"
  TORCH_DIR=${SPECWIRE_TORCH_DIR:-$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')}
  local torch_version
  torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
  log "python: $PY; torch $torch_version (cuda $("$PY" -c 'import torch; print(torch.version.cuda)'))"
  [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  # The binaries find torch and the kit's absl through these (their build-time RPATH points at
  # the machine that built them).
  export LD_LIBRARY_PATH=$TORCH_DIR/lib:$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

  BUILD_S=0
  local bin=$KIT/bin
  if [ "$DEVICE" = cuda ] && [ "${SPECWIRE_GPU_BUILD:-0}" != 1 ] && [ -x "$bin/specwire-extract" ] &&
     [ "$(cat "$bin/torch_version" 2>/dev/null)" = "$torch_version" ] &&
     "$bin/specwire-extract" --version >/dev/null 2>&1; then
    log "using the kit's binaries (built against torch $torch_version)"
    BIN_EXTRACT=$bin/specwire-extract
    BIN_BENCH_EXTRACT=$bin/specwire-bench-extract
    BIN_BENCH_DECODE=$bin/specwire-bench-decode
    BIN_REPLAY=$bin/specwire-replay
    BIN_MODELS_TESTS=$bin/models_tests
    return 0
  fi
  [ -x "$bin/specwire-extract" ] && log "the kit's binaries do not run here (torch $(cat "$bin/torch_version" 2>/dev/null) vs $torch_version): building"
  gpu_build "$log_dir"
}

gpu_build() {
  local log_dir=$1 cuda=OFF tb
  [ "$DEVICE" = cuda ] && cuda=ON
  tb=$(date +%s)
  log "cmake $(cmake --version | head -n1 | awk '{print $3}'), ninja $(ninja --version 2>/dev/null || echo '?'), c++: $(${CXX:-c++} --version 2>/dev/null | head -n1)"
  # absl's CMake targets link -latomic. A compiler install normally provides libatomic; if this one
  # cannot link it, use the copy in the kit (deps/fallback-lib, Debian 12's libatomic1).
  local extra=()
  if ! printf 'int main() { return 0; }\n' | ${CXX:-c++} -x c++ - -latomic -o /dev/null 2>/dev/null; then
    log "the compiler cannot link -latomic: using $DEPS/fallback-lib"
    extra+=("-DCMAKE_EXE_LINKER_FLAGS=-L$DEPS/fallback-lib -Wl,-rpath,$DEPS/fallback-lib")
  fi
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  [ -f "$BUILD_DIR/CMakeCache.txt" ] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=Ninja" "$BUILD_DIR/CMakeCache.txt" && gen=()
  log "configuring $BUILD_DIR (SPECWIRE_CUDA=$cuda)"
  cmake -S "$ROOT" -B "$BUILD_DIR" ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=Release \
    -DSPECWIRE_ENGINE_ONLY=ON -DSPECWIRE_CUDA=$cuda -DSPECWIRE_TESTS=OFF \
    -DSPECWIRE_DEPS_ROOT="$DEPS" -DSPECWIRE_TORCH_DIR="$TORCH_DIR" -DPython3_EXECUTABLE="$PY" \
    ${extra[@]+"${extra[@]}"} > "$log_dir/cmake-configure.log" 2>&1 ||
    { tail -n 30 "$log_dir/cmake-configure.log"; die "configure failed (log: cmake-configure.log)"; }
  local absl_dir
  absl_dir=$(grep '^absl_DIR:' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2-)
  case "$absl_dir" in "$DEPS"/*) ;; *) log "WARNING: absl was not taken from the kit ($absl_dir)" ;; esac
  log "building the engine binaries ($JOBS jobs)"
  cmake --build "$BUILD_DIR" -j "$JOBS" --target specwire-extract specwire-bench-extract \
    specwire-bench-decode specwire-replay > "$log_dir/build.log" 2>&1 ||
    { grep -E 'FAILED:|error:|undefined reference' "$log_dir/build.log" | cut -c1-400 | head -n 30
      die "build failed (log: build.log)"; }
  BUILD_S=$(( $(date +%s) - tb ))
  log "build: ${BUILD_S}s"
  BIN_EXTRACT=$BUILD_DIR/services/extractor/specwire-extract
  BIN_BENCH_EXTRACT=$BUILD_DIR/bench/specwire-bench-extract
  BIN_BENCH_DECODE=$BUILD_DIR/bench/specwire-bench-decode
  BIN_REPLAY=$BUILD_DIR/services/scorer/specwire-replay
  BIN_MODELS_TESTS=""
  # --version (absl flags: it exits 0) loads every shared library the binary links.
  "$BIN_EXTRACT" --version > /dev/null ||
    die "specwire-extract does not start (missing shared libraries?): $(ldd "$BIN_EXTRACT" | grep 'not found' | tr '\n' ' ')"
}
