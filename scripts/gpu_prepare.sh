#!/usr/bin/env bash
# Prepares the kit that scripts/gpu_check.sh needs on a borrowed GPU host (runs HERE, on a Debian 12
# dev machine with the project's virtualenv .venv; the GPU host has torch but no Debian dev
# packages, no transformers and no network).
#
#   build/gpu-kit/deps   the engine's build dependencies besides libtorch, unpacked from the Debian
#                        .deb files with `dpkg -x` (absl headers + CMake config + shared libraries,
#                        nlohmann-json, xxhash): usable as -DSPECWIRE_DEPS_ROOT=build/gpu-kit/deps.
#                        Symbolic links are replaced by copies, so the kit survives any file copy.
#   build/gpu-kit/ref    tiny random checkpoints and transformers' fp32 CPU reference for them:
#                        all hidden states of token sequences of lengths 1, 33, 130, and greedy
#                        generations (20 tokens) with the top-2 logit margin of every step; the
#                        held-out prompts as token ids (replay_prompts.json).
#   build/gpu-kit/bin    the engine binaries and the model tests built against the GPU host's
#                        torch version (SPECWIRE_GPU_TORCH_VERSION, default 2.11.0; "none" skips).
#
# Prints the `carry` list for the device tool at the end. Safe to rerun (downloads are cached in
# build/gpu-kit-debs, which is not carried).
# Environment: SPECWIRE_BUILD_DIR   build with a specwire-extract to probe Qwen3.5 support
#                                   (default: build-gpu, then build)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KIT=build/gpu-kit
DEB_CACHE=build/gpu-kit-debs
PY=${SPECWIRE_PYTHON:-$ROOT/.venv/bin/python}

log() { printf '\033[1m[gpu-prepare]\033[0m %s\n' "$*"; }

# ---------------------------------------------------------------------------------------------
# a. Build dependencies, from the Debian packages this machine builds with.
#    libabsl-dev       headers, CMake config (abslConfig/abslTargets*.cmake); its targets import
#                      lib/x86_64-linux-gnu/libabsl_*.so.20220623.0.0 — files of libabsl20220623 —
#                      and CMake checks that every one of them exists. abslConfig needs Threads
#                      (the compiler's) and the targets link -latomic (gcc's libatomic).
#    libabsl20220623   the shared libraries (needed at link and run time), every one of them:
#                      the engine-only binaries (specwire-extract, specwire-replay,
#                      specwire-bench-extract) parse their flags with absl (flags, flags_parse,
#                      flags_usage and what those link), checked below with the rest
#    nlohmann-json3-dev, libxxhash-dev   header-only use (+ nlohmann's CMake config)
#    libatomic1        only as a fallback for a host whose compiler cannot link -latomic:
#                      kept apart in deps/fallback-lib (not on any RPATH).
# ---------------------------------------------------------------------------------------------
DEBS=(libabsl-dev libabsl20220623 nlohmann-json3-dev libxxhash-dev libatomic1)
mkdir -p "$DEB_CACHE"
need_download=()
for p in "${DEBS[@]}"; do
  ls "$DEB_CACHE/${p}_"*.deb >/dev/null 2>&1 || need_download+=("$p")
done
if [ ${#need_download[@]} -gt 0 ]; then
  log "downloading ${need_download[*]}"
  # Prefer the version installed here (what the CPU build and tests use).
  specs=()
  for p in "${need_download[@]}"; do
    v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
    specs+=("$p${v:+=$v}")
  done
  if ! (cd "$DEB_CACHE" && apt-get download "${specs[@]}" >/dev/null 2>&1); then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    (cd "$DEB_CACHE" && apt-get download "${need_download[@]}" >/dev/null)
  fi
fi

DEPS=$KIT/deps
rm -rf "$DEPS"
mkdir -p "$DEPS"
for p in libabsl-dev libabsl20220623 nlohmann-json3-dev libxxhash-dev; do
  dpkg -x "$(ls "$DEB_CACHE/${p}_"*.deb | head -n1)" "$DEPS"
done
tmp=$(mktemp -d)
dpkg -x "$(ls "$DEB_CACHE/libatomic1_"*.deb | head -n1)" "$tmp"
mkdir -p "$DEPS/fallback-lib"
cp -L "$tmp"/usr/lib/x86_64-linux-gnu/libatomic.so.1 "$DEPS/fallback-lib/libatomic.so.1"
cp -L "$tmp"/usr/lib/x86_64-linux-gnu/libatomic.so.1 "$DEPS/fallback-lib/libatomic.so"
rm -rf "$tmp"

LIBDIR=$DEPS/usr/lib/x86_64-linux-gnu
# Drop what a build does not read: docs, lintian, pkg-config files, static archives, and the
# unversioned dev symlinks (absl's CMake targets name the versioned files directly).
rm -rf "$DEPS/usr/share/doc" "$DEPS/usr/share/lintian" "$DEPS/usr/share/man" \
       "$DEPS/usr/share/pkgconfig" "$LIBDIR/pkgconfig"
find "$LIBDIR" -maxdepth 1 \( -name '*.a' -o \( -type l -name '*.so' \) \) -delete
# Remaining symlinks (libabsl_x.so.20220623 -> libabsl_x.so.20220623.0.0, the sonames the
# binaries load) become regular files.
find "$DEPS" -type l | while read -r link; do
  target=$(readlink -f "$link")
  rm "$link"
  cp "$target" "$link"
done
[ -z "$(find "$DEPS" -type l)" ] || { echo "symlinks left in $DEPS" >&2; exit 1; }

# Every file absl's CMake targets import must be in the kit.
missing=0
while read -r f; do
  [ -f "$DEPS/usr/$f" ] || { echo "kit lacks usr/$f (referenced by abslTargets)" >&2; missing=1; }
done < <(grep -ho '\${_IMPORT_PREFIX}/lib/[^" ]*' "$LIBDIR"/cmake/absl/abslTargets-*.cmake \
         | sed 's|\${_IMPORT_PREFIX}/||' | sort -u)
for f in "$LIBDIR"/libabsl_flags_parse.so.* "$LIBDIR"/libabsl_flags_usage.so.* \
         "$DEPS/usr/include/absl/flags/parse.h" \
         "$DEPS/usr/include/xxhash.h" "$DEPS/usr/include/nlohmann/json.hpp" \
         "$DEPS/usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" \
         "$LIBDIR/cmake/absl/abslConfig.cmake"; do
  [ -f "$f" ] || { echo "kit lacks $f" >&2; missing=1; }
done
[ $missing = 0 ] || exit 1
log "deps kit: $(du -sh "$DEPS" | cut -f1) in $DEPS"

# ---------------------------------------------------------------------------------------------
# b. Reference data (transformers, fp32, CPU).
# ---------------------------------------------------------------------------------------------
EXTRACT=""
for d in "${SPECWIRE_BUILD_DIR:-}" "$ROOT/build-gpu" "$ROOT/build"; do
  if [ -n "$d" ] && [ -x "$d/services/extractor/specwire-extract" ]; then
    EXTRACT=$d/services/extractor/specwire-extract
    break
  fi
done
rm -rf "$KIT/ref"
mkdir -p "$KIT/ref"
log "generating the transformers reference in $KIT/ref"
SPECWIRE_PROBE_EXTRACT="$EXTRACT" "$PY" - "$KIT/ref" <<'PYEOF'
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path.cwd() / "tests" / "parity"))
from hf_fixtures import QWEN3_5_TINY, make_checkpoint  # noqa: E402

out = Path(sys.argv[1])
VOCAB = 512
SEQ_LENS = [1, 33, 130]
MAX_NEW = 20
g = torch.Generator().manual_seed(1234)
seqs = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in SEQ_LENS]
(out / "tokens.json").write_text(json.dumps(seqs))

# Qwen3.5 hybrid (hf_fixtures.QWEN3_5_TINY): 3 Gated DeltaNet layers + 1 gated full-attention
# layer; 130 tokens span three 64-token chunks of the chunked delta rule.
CHECKPOINTS = [("qwen3_gqa2_tied", None, False), ("llama_rope3_bias", None, False),
               ("qwen3_5_hybrid", QWEN3_5_TINY, True)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def probe(path: Path) -> tuple[bool, str]:
    """Whether the engine built here loads the checkpoint (`specwire-extract info`)."""
    exe = os.environ.get("SPECWIRE_PROBE_EXTRACT")
    if not exe:
        return True, "no specwire-extract built here to probe; included"
    res = subprocess.run([exe, "info", "--model", str(path)], capture_output=True, text=True)
    if res.returncode == 0:
        return True, "engine loads it"
    if "UNIMPLEMENTED" in res.stderr:
        return False, res.stderr.strip()
    raise SystemExit(f"specwire-extract info failed on {path}:\n{res.stderr}")


def reference(path: Path, name: str) -> dict:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              attn_implementation="sdpa")
    model.eval()
    layers = model.model.layers
    captured = {}

    def hook(_mod, _inp, output):  # output of the last decoder layer, before the final norm
        captured["last"] = (output[0] if isinstance(output, tuple) else output)[0].detach().clone()

    def states(m) -> tuple[list, list]:
        handle = m.model.layers[-1].register_forward_hook(hook)
        hidden, last = [], []
        with torch.no_grad():
            for seq in seqs:
                res = m(input_ids=torch.tensor([seq]), output_hidden_states=True, use_cache=False)
                hidden.append(torch.stack([h[0].float() for h in res.hidden_states]).contiguous())
                last.append(captured["last"].float().contiguous())
        handle.remove()
        return hidden, last

    hidden, last = states(model)
    # transformers' own bf16 error against its fp32 states, per tensor: the scale of bf16
    # rounding for these weights, which the GPU check sets its bf16 verdict against.
    m16 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                            attn_implementation="sdpa").eval()
    hidden16, last16 = states(m16)
    L = len(layers)
    hf_bf16 = {}
    for i in range(len(seqs)):
        pairs = {"embedding": 0, "final_norm": L, **{f"layer.{k}": k + 1 for k in range(L - 1)}}
        for tap, j in pairs.items():
            hf_bf16[f"seq.{i}.{tap}"] = rel_err(hidden16[i][j], hidden[i][j])
        hf_bf16[f"seq.{i}.layer.{L - 1}"] = rel_err(last16[i], last[i])
    torch.save({"hidden_states": hidden, "last_layer": last, "hf_bf16_rel_err": hf_bf16},
               out / name / "hidden_states.pt")

    # Greedy generation, transformers' own generate(); eos disabled so all 20 tokens are compared.
    model.generation_config.eos_token_id = None
    gens, margins = [], []
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq])
            res = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=None,
                                 pad_token_id=0, attention_mask=torch.ones_like(ids),
                                 output_logits=True, return_dict_in_generate=True)
            gens.append(res.sequences[0, len(seq):].tolist())
            step_margins = []
            for logits in res.logits:
                top = torch.topk(logits[0].float(), 2).values
                step_margins.append(float(top[0] - top[1]))
            margins.append(step_margins)
    (out / name / "greedy.json").write_text(json.dumps({"prompts": seqs, "tokens": gens,
                                                         "margins": margins}))
    return {"num_layers": len(layers), "hidden_size": model.config.hidden_size}


manifest = {"format": 1, "torch": torch.__version__, "transformers": transformers.__version__,
            "seq_lens": SEQ_LENS, "max_new_tokens": MAX_NEW, "tokens_file": "tokens.json",
            "checkpoints": []}
for name, overrides, hybrid in CHECKPOINTS:
    (out / name).mkdir(parents=True)
    path = make_checkpoint(name, out / name, seed=7, overrides=overrides)
    model_dir = out / name / "model"
    path.rename(model_dir)
    if hybrid:
        ok, why = probe(model_dir)
        if not ok:  # engine without Qwen3.5 support: leave it out, quietly
            import shutil
            shutil.rmtree(out / name)
            continue
    info = reference(model_dir, name)
    manifest["checkpoints"].append({"name": name, "model": f"{name}/model", "hybrid": hybrid,
                                    **info})
    print(f"  {name}: {info['num_layers']} layers, hidden {info['hidden_size']}")
(out / "manifest.json").write_text(json.dumps(manifest, indent=1))
PYEOF

# The held-out prompts as the shipped target's token ids (the GPU host has no tokenizer to trust
# for this): the replay and live-loop checks of scripts/gpu_decode.sh.
"$PY" - "$KIT/ref/replay_prompts.json" <<'PYEOF'
import json
import sys

from tokenizers import Tokenizer

tok = Tokenizer.from_file("models/tiny-qwen3/tokenizer.json")
prompts = [json.loads(line)["prompt"] for line in open("models/heldout_prompts.jsonl")][:12]
json.dump([tok.encode(p).ids for p in prompts], open(sys.argv[1], "w"))
PYEOF

# ---------------------------------------------------------------------------------------------
# d. The engine binaries, built HERE against the GPU host's torch (its version: the wheel from
#    PyPI, headers and libraries only) with CUDA and the unit tests: the host runs them instead of
#    spending its time on a build, and reruns the model tests on its device (gpu_decode.sh).
#    gpu_env.sh uses them only when the host's torch has exactly this version, else it builds.
#    SPECWIRE_GPU_TORCH_VERSION=none skips this.
# ---------------------------------------------------------------------------------------------
TORCH_VERSION=${SPECWIRE_GPU_TORCH_VERSION:-2.11.0}
if [ "$TORCH_VERSION" != none ]; then
  WHEEL_DIR=build/gpu-kit-torch/$TORCH_VERSION
  if [ ! -f "$WHEEL_DIR/ext/torch/version.py" ]; then
    log "fetching torch $TORCH_VERSION (the GPU host's) for its headers and libraries"
    mkdir -p "$WHEEL_DIR"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 -d "$WHEEL_DIR" "torch==$TORCH_VERSION"
    (cd "$WHEEL_DIR" && unzip -q -o torch-*.whl 'torch/include/*' 'torch/lib/*' 'torch/version.py' -d ext)
  fi
  # The CUDA libraries libtorch_cuda links are only read by the linker (rpath-link): this
  # machine's CUDA 13 wheels have the same sonames.
  ln -sfn "$("$PY" -c 'import os, nvidia; print(os.path.dirname(nvidia.__path__[0] + "/x"))')" \
    "$WHEEL_DIR/ext/nvidia"
  KIT_BUILD=build/gpu-kit-build
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  cmake -S "$ROOT" -B "$KIT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECWIRE_ENGINE_ONLY=ON \
    -DSPECWIRE_CUDA=ON -DSPECWIRE_TESTS=ON -DSPECWIRE_DEPS_ROOT="$ROOT/$DEPS" \
    -DSPECWIRE_TORCH_DIR="$ROOT/$WHEEL_DIR/ext/torch" -DPython3_EXECUTABLE="$PY" >/dev/null
  log "building the engine binaries against torch $TORCH_VERSION (CUDA) in $KIT_BUILD"
  cmake --build "$KIT_BUILD" -j "$(nproc)" --target specwire-extract specwire-bench-extract \
    specwire-bench-decode specwire-replay models_tests >/dev/null
  mkdir -p "$KIT/bin"
  for b in services/extractor/specwire-extract bench/specwire-bench-extract \
           bench/specwire-bench-decode services/scorer/specwire-replay common/models_tests; do
    cp "$KIT_BUILD/$b" "$KIT/bin/"
  done
  "$PY" -c "import runpy; print(runpy.run_path('$WHEEL_DIR/ext/torch/version.py')['__version__'])" \
    > "$KIT/bin/torch_version"
  log "binaries for torch $(cat "$KIT/bin/torch_version"): $(du -sh "$KIT/bin" | cut -f1)"
fi

log "kit: $(du -sh "$KIT" | cut -f1) in $KIT (deps $(du -sh "$DEPS" | cut -f1), ref $(du -sh "$KIT/ref" | cut -f1))"
# ---------------------------------------------------------------------------------------------
# c. What the device tool must carry (ignored paths, relative to the repository root).
# ---------------------------------------------------------------------------------------------
echo
echo "carry: [\"$KIT\"]"
echo "then on the GPU host: bash scripts/gpu_check.sh; bash scripts/gpu_prefill.sh; bash scripts/gpu_decode.sh"
