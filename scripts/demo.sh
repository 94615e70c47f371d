#!/usr/bin/env bash
# The demo: the trained tiny pair in models/ scored end to end through the services.
#   1. installs what is missing and builds (scripts/setup.sh)
#   2. starts specwire-extractor (models/tiny-qwen3, float32) and specwire-scorer on 127.0.0.1,
#      gRPC and metrics on free ports
#   3. scores models/heldout_prompts.jsonl with the DFlash drafter models/tiny-qwen3-dflash
#      through the scorer: τ per response and pooled, DDTree-8, per-position acceptance; the JSON
#      and HTML reports go to $BUILD_DIR/demo (build/demo by default)
#   4. the hybrid target models/tiny-qwen3_5 (Gated DeltaNet) on a second extractor: its
#      contract, hidden states of a prompt and a greedy completion
#   5. stops the servers it started (by PID, also on Ctrl-C or an error)
# Environment: SPECWIRE_BUILD_DIR (default build), SPECWIRE_DEMO_MODELS (default models),
#   SPECWIRE_DEMO_MAX_NEW_TOKENS (default 64), SPECWIRE_DEMO_MAX_PROMPTS (0: all),
#   SPECWIRE_DEMO_THREADS (intra-op threads of each server; 0: torch's default),
#   SPECWIRE_DEMO_KEEP=1 leaves the servers running until Enter is pressed (to look at /metrics).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${SPECWIRE_BUILD_DIR:-$ROOT/build}
MODELS=${SPECWIRE_DEMO_MODELS:-$ROOT/models}
MAX_NEW_TOKENS=${SPECWIRE_DEMO_MAX_NEW_TOKENS:-64}
MAX_PROMPTS=${SPECWIRE_DEMO_MAX_PROMPTS:-0}
THREADS=${SPECWIRE_DEMO_THREADS:-0}

bash scripts/setup.sh
PY=$ROOT/.venv/bin/python
OUT=$BUILD_DIR/demo
LOGS=$OUT/logs
mkdir -p "$OUT" "$LOGS"
EXTRACTOR=$BUILD_DIR/services/extractor/specwire-extractor
SCORER=$BUILD_DIR/services/scorer/specwire-scorer
SCORE=$BUILD_DIR/services/scorer/specwire-score
CLI=$BUILD_DIR/clients/cli/specwire-cli

if [ -t 1 ]; then
  say() { printf '\n\033[1m== %s ==\033[0m\n' "$*"; }
else
  say() { printf '\n== %s ==\n' "$*"; }
fi
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

for m in tiny-qwen3 tiny-qwen3-dflash tiny-qwen3-dflash2 tiny-qwen3-eagle3 tiny-qwen3-mtp tiny-qwen3_5 \
    heldout_prompts.jsonl; do
  [ -e "$MODELS/$m" ] || die "$MODELS/$m is missing (the trained demo models)"
done
for b in "$EXTRACTOR" "$SCORER" "$SCORE" "$CLI"; do
  [ -x "$b" ] || die "$b is not built"
done

# Servers started here, stopped by PID on any exit: SIGTERM (they drain), SIGKILL after 20 s.
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start NAME LOG CMD...: runs CMD in the background, waits for its "serving ... on port N" line
# and sets PORT to N.
start() {
  local name=$1 log=$2
  shift 2
  : > "$log"  # exists before the first read below, whenever the background process opens it
  "$@" >> "$log" 2>&1 < /dev/null &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1200); do
    PORT=$(sed -n 's/.*serving .* on port \([0-9]*\).*/\1/p' "$log" | head -n 1)
    [ -n "$PORT" ] && { echo "$name: pid $pid, 127.0.0.1:$PORT"; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$log" >&2
  die "$name did not start (log: $log)"
}

say "starting the services"
EXTRACTOR_METRICS=$(free_port)
start specwire-extractor "$LOGS/extractor.log" "$EXTRACTOR" --model="$MODELS/tiny-qwen3" \
  --dtype=float32 --listen=127.0.0.1:0 --metrics_listen="127.0.0.1:$EXTRACTOR_METRICS" \
  --threads="$THREADS"
EXTRACTOR_ADDR=127.0.0.1:$PORT
SCORER_METRICS=$(free_port)
start specwire-scorer "$LOGS/scorer.log" "$SCORER" --extractor="$EXTRACTOR_ADDR" \
  --listen=127.0.0.1:0 --metrics_listen="127.0.0.1:$SCORER_METRICS" --dtype=float32 \
  --threads="$THREADS" --cache_dir="$OUT/cache"
SCORER_ADDR=127.0.0.1:$PORT
"$CLI" health --extractor "$EXTRACTOR_ADDR" --service specwire.v1.Extractor \
  --extractor_timeout 10 > /dev/null
"$CLI" health --scorer "$SCORER_ADDR" --service specwire.v1.Scorer --scorer_timeout 10 > /dev/null

say "scoring $(basename "$MODELS")/heldout_prompts.jsonl with tiny-qwen3-dflash (through the scorer)"
"$SCORE" --scorer="$SCORER_ADDR" --drafter="$MODELS/tiny-qwen3-dflash" \
  --dataset="$MODELS/heldout_prompts.jsonl" --max_prompts="$MAX_PROMPTS" \
  --max_new_tokens="$MAX_NEW_TOKENS" --ddtree=8 --drafter_label=tiny-qwen3-dflash \
  --dataset_label=heldout --json_out="$OUT/report.json" --html_out="$OUT/report.html" \
  --scorer_timeout=600 2> "$LOGS/score-progress.log"

echo
"$PY" - "$OUT/report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["summary"]
print(f"{'response':>8}  {'prompt':>6}  {'completion':>10}  {'steps':>5}  {'tau':>6}  {'DDTree-8':>8}")
for p in r["prompts"]:
    dd = p["ddtree_step_lengths"]["8"]
    # A completion that starts with a stop token has no steps: no τ (left out of the means).
    tau = f"{p['tau']:6.3f}" if p["step_lengths"] else f"{'-':>6}"
    tree = f"{sum(dd) / len(dd):8.3f}" if dd else f"{'-':>8}"
    print(f"{p['prompt_index']:>8}  {p['prompt_tokens']:>6}  {p['completion_tokens']:>10}  "
          f"{len(p['step_lengths']):>5}  {tau}  {tree}")
dd = s["ddtree_tau"]["8"]
print(f"{'pooled':>8}  {'':>6}  {'':>10}  {s['steps']:>5}  {s['tau_pooled']:6.3f}  "
      f"{dd['tau_pooled']:8.3f}")
print(f"{'mean':>8}  {'':>6}  {'':>10}  {'':>5}  {s['tau_mean_of_means']:6.3f}  "
      f"{dd['tau_mean_of_means']:8.3f}")
ci = s.get("tau_mean_of_means_ci")
if ci:
    print(f"\ntau {s['tau_mean_of_means']:.3f}, 95% interval [{ci[0]:.3f}, {ci[1]:.3f}] "
          f"({r['settings']['text']})")
EOF
echo
echo "reports: $OUT/report.json"
echo "         $OUT/report.html"

say "drafter families side by side: DFlash (a block; DDTree), DFlash2 (its selector's path), DSpark (a block with a Markov head and a confidence head), Domino (a block with a GRU logit correction), XPress (a block refined by Jacobi passes), EAGLE-3 (a chain; EAGLE's top-k tree), P-EAGLE (EAGLE-3's drafts in one forward; DDTree) and an MTP head (a chain)"
for family in dflash2 dspark domino xpress eagle3 peagle mtp; do
  "$SCORE" --scorer="$SCORER_ADDR" --drafter="$MODELS/tiny-qwen3-$family" \
    --dataset="$MODELS/heldout_prompts.jsonl" --max_prompts="$MAX_PROMPTS" \
    --max_new_tokens="$MAX_NEW_TOKENS" --drafter_label="tiny-qwen3-$family" \
    --dataset_label=heldout --json_out="$OUT/report-$family.json" \
    --html_out="$OUT/report-$family.html" --scorer_timeout=600 --quiet \
    > "$LOGS/score-$family.log" 2> "$LOGS/score-$family-progress.log"
done
"$PY" - "$OUT/report.json" "$OUT/report-dflash2.json" "$OUT/report-dspark.json" \
  "$OUT/report-domino.json" "$OUT/report-xpress.json" "$OUT/report-eagle3.json" "$OUT/report-peagle.json" "$OUT/report-mtp.json" "$MODELS" <<'EOF'
import json, sys
from pathlib import Path
print(f"{'drafter':<20} {'method':<7} {'format':<12} {'drafts/step':>11} {'tau':>6} "
      f"{'95% interval':>16} {'pooled':>7} {'steps':>6}  {'tree (8 nodes)':<20}")
predicted = []
for path in sys.argv[1:-1]:
    r = json.load(open(path))
    s, labels = r["summary"], r["labels"]
    cfg = json.load(open(Path(sys.argv[-1]) / labels["drafter"] / "config.json"))
    fmt = ("speculators" if cfg.get("speculators_model_type") else
           "specforge" if cfg.get("dflash_config", {}).get("projector_type") else "z-lab")
    if s.get("predicted_acceptance"):
        predicted.append((labels["drafter"], s["predicted_acceptance"]))
    ci = s.get("tau_mean_of_means_ci") or [float("nan")] * 2
    # The tree each family verifies with: DDTree-8, EAGLE's top-k tree of 8 nodes, or none.
    tree = s.get("tree", {}).get("method", "ddtree")
    dd = s["ddtree_tau"].get("8")
    name = {"ddtree": "DDTree-8", "eagle": "EAGLE-tree-8"}.get(tree, "")
    cell = f"{name} {dd['tau_mean_of_means']:.3f}" if dd else "- (one path)"
    print(f"{labels['drafter']:<20} {labels['method']:<7} {fmt:<12} {s['block_size'] - 1:>11} "
          f"{s['tau_mean_of_means']:>6.3f} {f'[{ci[0]:.3f}, {ci[1]:.3f}]':>16} "
          f"{s['tau_pooled']:>7.3f} {s['steps']:>6}  {cell:<20}")
for name, pa in predicted:
    print(f"\n{name}: its confidence head's predicted acceptance against the observed")
    print("  position " + "".join(f"{row['position']:>6}" for row in pa["calibration"][:8]))
    print("  predicted" + "".join(f"{row['predicted']:>6.2f}" for row in pa["calibration"][:8]))
    print("  observed " + "".join(f"{row['observed']:>6.2f}" for row in pa["calibration"][:8]))
    for c in pa["cutoffs"]:
        print(f"  verify while predicted survival >= {c['cutoff']:.1f}: tau "
              f"{c['tau_mean_of_means']:.3f} (pooled {c['tau_pooled']:.3f})")
EOF
echo "reports: $OUT/report-dflash2.json $OUT/report-dspark.json $OUT/report-domino.json $OUT/report-xpress.json $OUT/report-eagle3.json $OUT/report-peagle.json $OUT/report-mtp.json"

say "metrics (Prometheus text format)"
echo "extractor: http://127.0.0.1:$EXTRACTOR_METRICS/metrics"
echo "scorer:    http://127.0.0.1:$SCORER_METRICS/metrics"
"$PY" - "$SCORER_METRICS" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
for line in text.splitlines():
    if line.startswith(("specwire_spec_decode_mean_acceptance_length{",
                        "specwire_spec_decode_num_drafts_total{")):
        print("  " + line)
EOF
echo "(deploy/docker-compose.yml runs Prometheus + Grafana over the same endpoints)"

say "hybrid target: tiny-qwen3_5 (Gated DeltaNet + gated attention)"
HYBRID_METRICS=$(free_port)
start specwire-extractor "$LOGS/extractor-hybrid.log" "$EXTRACTOR" \
  --model="$MODELS/tiny-qwen3_5" --dtype=float32 --listen=127.0.0.1:0 \
  --metrics_listen="127.0.0.1:$HYBRID_METRICS" --threads="$THREADS"
HYBRID_ADDR=127.0.0.1:$PORT
"$CLI" info --extractor "$HYBRID_ADDR" > "$OUT/hybrid_contract.json"
LAST=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_layers"] - 1)' \
  "$OUT/hybrid_contract.json")
HYBRID_PROMPT="def fibonacci(n):"
"$CLI" extract --extractor "$HYBRID_ADDR" --text "$HYBRID_PROMPT" --layers "0,$LAST" \
  --final_norm --wire_dtype fp32 --out "$OUT/hybrid_states.safetensors" > "$LOGS/hybrid-extract.log"
# --decode: the server's detokenizer; ids past the tokenizer's vocabulary (padded embeddings)
# cannot be decoded, and then the ids alone are shown.
"$CLI" generate --extractor "$HYBRID_ADDR" --text "$HYBRID_PROMPT" --max_new_tokens 24 --decode \
  > "$OUT/hybrid_completion.json" 2> "$LOGS/hybrid-generate.log" ||
  "$CLI" generate --extractor "$HYBRID_ADDR" --text "$HYBRID_PROMPT" --max_new_tokens 24 \
    > "$OUT/hybrid_completion.json"
"$PY" - "$OUT/hybrid_contract.json" "$LOGS/hybrid-extract.log" "$OUT/hybrid_completion.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
extract = open(sys.argv[2]).read().splitlines()
g = json.load(open(sys.argv[3]))[0]
types = c.get("layer_types") or []
kinds = {t: types.count(t) for t in dict.fromkeys(types)}
print(f"architecture   {c['architecture']} ({c.get('source_layout', '?')} layout), "
      f"{c['num_layers']} layers" + (f": {kinds}" if kinds else "")
      + f", hidden {c['hidden_size']}, {c['compute_dtype']}")
print(f"weights digest {c.get('weights_digest', '?')}")
print("hidden states  " + extract[0])
for line in extract[2:]:
    print("             " + line)
print(f"greedy         {len(g['prompt_token_ids'])} prompt tokens -> "
      f"{len(g['completion_token_ids'])} new ({g['finish_reason']}): "
      + (repr(g["completion_text"]) if "completion_text" in g else str(g["completion_token_ids"])))
EOF

if [ "${SPECWIRE_DEMO_KEEP:-0}" = 1 ] && [ -t 0 ]; then
  read -r -p "servers still running; press Enter to stop them " _
fi
say "done: outputs in $OUT (the servers stop now)"
