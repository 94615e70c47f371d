#!/usr/bin/env bash
# The main job, on a small checkpoint: load it, print the extraction contract, extract the hidden
# states of a few token sequences and print a summary. Installs and builds first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${SPECWIRE_BUILD_DIR:-$ROOT/build}
bash scripts/setup.sh
. .venv/bin/activate
OUT=$BUILD_DIR/demo
mkdir -p "$OUT"
python scripts/make_demo_checkpoint.py "$OUT/tiny-qwen3"
echo '[[1, 2, 3, 4, 5, 6, 7, 8], [42, 7, 19]]' > "$OUT/tokens.json"
"$BUILD_DIR/services/extractor/specwire-extract" extract --model "$OUT/tiny-qwen3" \
  --tokens-file "$OUT/tokens.json" --layers 0,2,3 --embedding --final-norm \
  --out "$OUT/hidden_states.safetensors"
echo
echo "greedy completion of [1, 2, 3, 4]:"
"$BUILD_DIR/services/extractor/specwire-extract" generate --model "$OUT/tiny-qwen3" \
  --tokens 1,2,3,4 --max-new-tokens 12 --no-config-eos
