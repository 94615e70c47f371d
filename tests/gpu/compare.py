#!/usr/bin/env python3
"""GPU check driver: specwire on a device vs transformers' fp32 CPU reference. Needs torch only.

Runs on a GPU host that has the torch wheel but not transformers or safetensors; the reference was
made beforehand on a dev machine by scripts/gpu_prepare.sh (build/gpu-kit/ref). Called by
scripts/gpu_check.sh, which finds or builds the binaries first.

  compare.py run --extract E --bench B --ref R --device cuda --out O   every check, then a table
  compare.py make-bench-model DIR                                 the ~100M random Qwen3

Checks (one table row each):
  parity    specwire-extract in float32 and bfloat16 on the device vs the fp32 CPU reference, all
            taps (embedding, every layer, final norm), sequences of 1, 33 and 130 tokens. Metric:
            relative error ||ours - ref|| / ||ref|| per tensor, the maximum is reported.
            Thresholds: 1e-4 (fp32), 1e-2 (bf16; also passes when no tensor's error is above
            BF16_VS_HF x transformers' own bf16 CPU error for it, which is already ~1e-2 on the
            tiny random checkpoints). fp32 runs get NVIDIA_TF32_OVERRIDE=0: libtorch
            leaves cuBLAS TF32 off by default and the engine does not turn it on, but the variable
            would otherwise let a host force TF32 (errors ~1e-3) behind our back.
  generate  greedy fp32 generation (20 tokens) on the device vs transformers' generate() on CPU.
            A divergence right where the reference's top-2 logit margin is below TIE_TOL counts as
            a near tie (reported, not a failure); any other divergence fails.
  split     a layer-split device map on one device (cuda:0=0-1,cuda:0=2-2 style) must give the
            states of the single-device run (identical, or relative error <= 1e-6).
  long      bf16 states of the ~100M Qwen3 at 2048 tokens vs a plain-torch fp32 forward on the
            device (transformers-free; the plain-torch forward reproduces transformers' Qwen3
            bit for bit on CPU). Threshold 1e-2, or BF16_VS_HF x the plain-torch bf16 forward's
            own error, per tensor (12 bf16 layers exceed 1e-2 at the final norm by themselves).
  bench     specwire-bench-extract (all layers captured, states copied to the host) vs the same
            forward written in plain torch (eager, sdpa), same device, dtype and inputs; medians,
            tokens/s. transformers is timed as well when it happens to be importable.
Exit status 1 when any row is FAIL or ERROR.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

THRESHOLDS = {"float32": 1e-4, "bfloat16": 1e-2}
# bf16 also passes when no tensor's error exceeds this multiple of transformers' own bf16 error
# (bf16 CPU vs fp32 CPU, stored by gpu_prepare.sh).
BF16_VS_HF = 1.5
SPLIT_TOL = 1e-6
LONG_TOL = 1e-2
TIE_TOL = 1e-3  # top-2 logit margin below which a greedy divergence is a near tie

# Same shape as bench/extract_vs_hf.py's QWEN3_100M (kept in sync by hand: that file needs
# transformers, this one must not).
QWEN3_100M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                  max_position_embeddings=16384, tie_word_embeddings=True, rope_theta=1_000_000.0,
                  rms_norm_eps=1e-6)

# ---------------------------------------------------------------------------------------------
# safetensors, torch only: 8-byte little-endian header length, JSON header, raw bytes.
# ---------------------------------------------------------------------------------------------
ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
             "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
             "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    buf = bytearray(Path(path).read_bytes())
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        dtype = ST_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        t = torch.frombuffer(buf, dtype=dtype, count=count, offset=base + begin) if count else \
            torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"])
    return tensors, meta


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> None:
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    flat = []
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
        flat.append(t)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in flat:
            if t.nbytes:
                f.write(ctypes.string_at(t.data_ptr(), t.nbytes))


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.double(), ref.double()
    return ((ours - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------------------------------------
# The ~100M Qwen3 (random weights) and its forward in plain torch.
# ---------------------------------------------------------------------------------------------
def make_bench_model(path: Path, device: str = "cpu", seed: int = 0) -> Path:
    """config.json + model.safetensors (bf16, normal(0, 0.02), norms 1); reused when present."""
    path = Path(path)
    if (path / "config.json").exists() and (path / "model.safetensors").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    c = QWEN3_100M
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    t = {"model.embed_tokens.weight": rand(c["vocab_size"], h), "model.norm.weight": ones(h)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t.update({p + "input_layernorm.weight": ones(h),
                  p + "post_attention_layernorm.weight": ones(h),
                  p + "self_attn.q_proj.weight": rand(nh * hd, h),
                  p + "self_attn.k_proj.weight": rand(nkv * hd, h),
                  p + "self_attn.v_proj.weight": rand(nkv * hd, h),
                  p + "self_attn.o_proj.weight": rand(h, nh * hd),
                  p + "self_attn.q_norm.weight": ones(hd),
                  p + "self_attn.k_norm.weight": ones(hd),
                  p + "mlp.gate_proj.weight": rand(i, h),
                  p + "mlp.up_proj.weight": rand(i, h),
                  p + "mlp.down_proj.weight": rand(h, i)})
    write_safetensors(path / "model.safetensors.tmp", t)
    os.replace(path / "model.safetensors.tmp", path / "model.safetensors")
    config = dict(c, architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
                  attention_bias=False, attention_dropout=0.0, torch_dtype="bfloat16",
                  bos_token_id=None, eos_token_id=None, use_cache=True, initializer_range=0.02)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


class EagerQwen3:
    """transformers' Qwen3 forward (sdpa, no cache) in plain torch: the same casts at the same
    points (fp32 RMSNorm, fp32 rope tables cast to the compute dtype)."""

    def __init__(self, model_dir: Path, device: str, dtype: torch.dtype):
        self.cfg = json.loads((Path(model_dir) / "config.json").read_text())
        tensors, _ = read_safetensors(Path(model_dir) / "model.safetensors")
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
        self.device, self.dtype = device, dtype

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"])
        return w * xf.to(x.dtype)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)

    @torch.inference_mode()
    def forward(self, ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(embedding + every layer's output, final-norm output), each [T, hidden]."""
        c, w = self.cfg, self.w
        nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        ids_t = torch.tensor(ids, device=self.device)
        T = ids_t.shape[0]
        h = F.embedding(ids_t, w["model.embed_tokens.weight"])
        states = [h]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64,
                                                      device=self.device).float() / hd))
        freqs = torch.arange(T, device=self.device).float()[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            x = self._rms(h, w[p + "input_layernorm.weight"])
            q = F.linear(x, w[p + "self_attn.q_proj.weight"]).view(T, nh, hd)
            k = F.linear(x, w[p + "self_attn.k_proj.weight"]).view(T, nkv, hd)
            v = F.linear(x, w[p + "self_attn.v_proj.weight"]).view(T, nkv, hd).transpose(0, 1)
            q = self._rms(q, w[p + "self_attn.q_norm.weight"]).transpose(0, 1)
            k = self._rms(k, w[p + "self_attn.k_norm.weight"]).transpose(0, 1)
            q = q * cos + self._rotate_half(q) * sin
            k = k * cos + self._rotate_half(k) * sin
            a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                               scale=hd ** -0.5, enable_gqa=True)[0]
            h = h + F.linear(a.transpose(0, 1).reshape(T, nh * hd), w[p + "self_attn.o_proj.weight"])
            x = self._rms(h, w[p + "post_attention_layernorm.weight"])
            m = F.silu(F.linear(x, w[p + "mlp.gate_proj.weight"])) * F.linear(x, w[p + "mlp.up_proj.weight"])
            h = h + F.linear(m, w[p + "mlp.down_proj.weight"])
            states.append(h)
        return states, self._rms(h, w["model.norm.weight"])


def bench_tokens(seq_len: int, vocab: int) -> list[int]:
    # specwire-bench-extract's inputs (batch 0)
    return [(t * 7919 + 13) % vocab for t in range(seq_len)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_fn(fn, device: str, warmup: int, reps: int) -> list[float]:
    times = []
    for r in range(warmup + reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------------------------------------
# The checks.
# ---------------------------------------------------------------------------------------------
class Checker:
    def __init__(self, args):
        self.extract = Path(args.extract)
        self.bench = Path(args.bench)
        self.ref = Path(args.ref)
        self.out = Path(args.out)  # logs and the summary (small files only)
        self.work = Path(args.work or Path(args.out) / "states")  # extracted states
        self.device = args.device
        self.dev0 = "cuda:0" if args.device == "cuda" else args.device
        self.args = args
        self.rows: list[dict] = []
        self.manifest = json.loads((self.ref / "manifest.json").read_text())
        self.tokens_file = self.ref / self.manifest["tokens_file"]
        self.seqs = json.loads(self.tokens_file.read_text())
        self.single: dict[tuple[str, str], Path] = {}  # (checkpoint, dtype) -> states file
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)

    def row(self, check: str, result: str, numbers: str) -> None:
        self.rows.append({"check": check, "result": result, "numbers": numbers})
        print(f"  {result:<5} {check:<34} {numbers}", flush=True)

    def run(self, cmd: list, env_extra: dict | None = None, timeout: int = 300):
        env = dict(os.environ, **(env_extra or {}))
        t0 = time.perf_counter()
        try:
            res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                                 timeout=timeout)
        except subprocess.TimeoutExpired as e:
            res = subprocess.CompletedProcess(e.cmd, 124, "", f"timed out after {timeout}s")
        secs = time.perf_counter() - t0
        with open(self.out / "commands.log", "a") as log:
            log.write(f"$ {' '.join(str(c) for c in cmd)}\n# rc={res.returncode} {secs:.1f}s\n")
            log.write(res.stdout[-4000:] + res.stderr[-4000:] + "\n")
        return res, secs

    def extract_states(self, ckpt: dict, dtype: str, device_map: str, out: Path):
        layers = ",".join(str(k) for k in range(ckpt["num_layers"]))
        out_dtype = "bfloat16" if dtype == "bfloat16" else "float32"
        env = {"NVIDIA_TF32_OVERRIDE": "0"} if dtype == "float32" else {}
        return self.run([self.extract, "extract", "--model", self.ref / ckpt["model"],
                         "--tokens_file", self.tokens_file, "--layers", layers, "--embedding",
                         "--final_norm", "--device_map", device_map, "--dtype", dtype,
                         "--out", out, "--out_dtype", out_dtype], env)

    @staticmethod
    def failure(res) -> str:
        lines = (res.stderr or res.stdout).strip().splitlines()
        return (lines[-1] if lines else f"exit {res.returncode}")[:160]

    def parity(self, ckpt: dict, dtype: str) -> None:
        name = f"parity {ckpt['name']} {dtype}"
        out = self.work / f"{ckpt['name']}.{dtype}.safetensors"
        res, secs = self.extract_states(ckpt, dtype, self.device, out)
        if res.returncode != 0:
            if ckpt.get("hybrid") and "UNIMPLEMENTED" in res.stderr:
                return self.row(name, "SKIP", "engine: UNIMPLEMENTED")
            return self.row(name, "ERROR", self.failure(res))
        self.single[(ckpt["name"], dtype)] = out
        ours, _ = read_safetensors(out)
        ref = torch.load(self.ref / ckpt["name"] / "hidden_states.pt", weights_only=True)
        L = ckpt["num_layers"]
        hf16 = ref.get("hf_bf16_rel_err", {})
        worst, worst_tap, worst_ratio, ratio_tap = 0.0, "", 0.0, ""
        for i, _ in enumerate(self.seqs):
            hs, last = ref["hidden_states"][i], ref["last_layer"][i]
            pairs = {"embedding": hs[0], "final_norm": hs[L]}
            for k in range(L):
                pairs[f"layer.{k}"] = hs[k + 1] if k < L - 1 else last
            for tap, r in pairs.items():
                t = ours.get(f"seq.{i}.{tap}")
                if t is None:
                    return self.row(name, "FAIL", f"missing seq.{i}.{tap} in the output")
                if tuple(t.shape) != tuple(r.shape):
                    return self.row(name, "FAIL", f"seq.{i}.{tap}: shape {list(t.shape)} vs "
                                                  f"{list(r.shape)}")
                key = f"seq.{i}.{tap}"
                e = rel_err(t, r)
                if not e <= worst:  # also catches NaN
                    worst, worst_tap = e, key
                if key in hf16:
                    ratio = e / max(hf16[key], 1e-12)
                    if not ratio <= worst_ratio:
                        worst_ratio, ratio_tap = ratio, key
        thr = THRESHOLDS[dtype]
        numbers = f"max rel {worst:.2e} ({worst_tap}) <= {thr:.0e}"
        ok = worst <= thr
        if dtype == "bfloat16" and hf16:
            # transformers' own bf16 error on CPU reaches ~1e-2 on these random weights; a device
            # whose bf16 kernels round differently may cross 1e-2 without being wrong.
            numbers += (f"; vs transformers' own bf16 error: x{worst_ratio:.2f} max ({ratio_tap}, "
                        f"HF {hf16[ratio_tap]:.2e}) <= x{BF16_VS_HF}")
            ok = ok or worst_ratio <= BF16_VS_HF
        self.row(name, "PASS" if ok else "FAIL", f"{numbers}; {secs:.1f}s")

    def generate(self, ckpt: dict) -> None:
        name = f"generate {ckpt['name']} float32"
        ref = json.loads((self.ref / ckpt["name"] / "greedy.json").read_text())
        res, secs = self.run([self.extract, "generate", "--model", self.ref / ckpt["model"],
                              "--tokens_file", self.tokens_file, "--max_new_tokens",
                              self.manifest["max_new_tokens"], "--ignore_model_eos",
                              "--device_map", self.device, "--dtype", "float32"],
                             {"NVIDIA_TF32_OVERRIDE": "0"})
        if res.returncode != 0:
            if ckpt.get("hybrid") and "UNIMPLEMENTED" in res.stderr:
                return self.row(name, "SKIP", "engine: UNIMPLEMENTED")
            return self.row(name, "ERROR", self.failure(res))
        got = json.loads(res.stdout.strip().splitlines()[-1])
        got = [got] if isinstance(got, dict) else got
        identical = tie = hard = 0
        tokens = equal_tokens = 0
        notes = []
        for i, (g, want, margins) in enumerate(zip(got, ref["tokens"], ref["margins"])):
            ours = g["tokens"]
            tokens += len(want)
            n = 0
            while n < min(len(ours), len(want)) and ours[n] == want[n]:
                n += 1
            equal_tokens += n
            if n == len(want) and len(ours) == len(want):
                identical += 1
            elif n < len(want) and margins[n] < TIE_TOL:
                tie += 1
                notes.append(f"p{i}: near tie at step {n} (margin {margins[n]:.1e})")
            else:
                hard += 1
                notes.append(f"p{i}: diverges at step {n} (margin {margins[n]:.1e})"
                             if n < len(want) else f"p{i}: {len(ours)} tokens, want {len(want)}")
        result = "FAIL" if hard else ("TIE" if tie else "PASS")
        self.row(name, result, f"{identical}/{len(got)} identical, {equal_tokens}/{tokens} tokens "
                               f"before divergence; {secs:.1f}s" + ("; " + "; ".join(notes) if notes else ""))

    def split(self, ckpt: dict, dtype: str) -> None:
        name = f"split {ckpt['name']} {dtype}"
        base = self.single.get((ckpt["name"], dtype))
        if base is None:
            return self.row(name, "SKIP", "no single-device run to compare with")
        L = ckpt["num_layers"]
        m = (L + 1) // 2
        dm = f"{self.dev0}=0-{m - 1},{self.dev0}={m}-{L - 1}"
        out = self.work / f"{ckpt['name']}.{dtype}.split.safetensors"
        res, secs = self.extract_states(ckpt, dtype, dm, out)
        if res.returncode != 0:
            return self.row(name, "ERROR", f"{dm}: {self.failure(res)}")
        a, _ = read_safetensors(out)
        b, _ = read_safetensors(base)
        if sorted(a) != sorted(b):
            return self.row(name, "FAIL", f"{dm}: different tensor names")
        max_abs = max((x.float() - b[k].float()).abs().max().item() for k, x in a.items())
        worst = max(rel_err(x, b[k]) for k, x in a.items())
        ok = worst <= SPLIT_TOL
        self.row(name, "PASS" if ok else "FAIL",
                 f"{dm}: {'identical' if max_abs == 0 else f'max rel {worst:.2e}'} vs single device; {secs:.1f}s")

    def long_parity(self, model_dir: Path, seq_len: int) -> None:
        name = f"long qwen3-100m bfloat16 T={seq_len}"
        ids = bench_tokens(seq_len, QWEN3_100M["vocab_size"])
        tokens = self.work / "long_tokens.json"
        tokens.write_text(json.dumps([ids]))
        out = self.work / "long.bfloat16.safetensors"
        L = QWEN3_100M["num_hidden_layers"]
        res, secs = self.run([self.extract, "extract", "--model", model_dir, "--tokens_file", tokens,
                              "--layers", ",".join(str(k) for k in range(L)), "--embedding",
                              "--final_norm", "--device_map", self.device, "--dtype", "bfloat16",
                              "--out", out, "--out_dtype", "bfloat16"])
        if res.returncode != 0:
            return self.row(name, "ERROR", self.failure(res))
        ours, _ = read_safetensors(out)
        ref = {}
        for dtype in (torch.float32, torch.bfloat16):
            eager = EagerQwen3(model_dir, self.dev0, dtype)
            states, final = eager.forward(ids)
            ref[dtype] = {"seq.0.embedding": states[0].cpu(), "seq.0.final_norm": final.cpu(),
                          **{f"seq.0.layer.{k}": states[k + 1].cpu() for k in range(L)}}
            del eager, states, final
        worst, worst_tap, worst_ratio, ratio_tap, ok = 0.0, "", 0.0, "", True
        for key, r in ref[torch.float32].items():
            e = rel_err(ours[key], r)
            ratio = e / max(rel_err(ref[torch.bfloat16][key], r), 1e-12)
            if not e <= worst:
                worst, worst_tap = e, key
            if not ratio <= worst_ratio:
                worst_ratio, ratio_tap = ratio, key
            ok &= e <= LONG_TOL or ratio <= BF16_VS_HF
        same = max(rel_err(ours[k], r) for k, r in ref[torch.bfloat16].items())
        self.row(name, "PASS" if ok else "FAIL",
                 f"vs plain-torch fp32: max rel {worst:.2e} ({worst_tap}), x{worst_ratio:.2f} max the "
                 f"plain-torch bf16 error ({ratio_tap}) <= {LONG_TOL:.0e} or x{BF16_VS_HF}; vs "
                 f"plain-torch bf16: max rel {same:.2e}; {secs:.1f}s")

    def benchmark(self, model_dir: Path) -> None:
        a = self.args
        dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[a.bench_dtype]
        res, secs = self.run([self.bench, "--model", model_dir, "--device_map", self.device,
                              "--dtype", a.bench_dtype, "--seq_lens", a.seq_lens, "--reps", a.reps,
                              "--warmup", a.warmup], timeout=400)
        if res.returncode != 0:
            return self.row(f"bench {a.bench_dtype}", "ERROR", self.failure(res))
        ours = {}
        for line in res.stdout.strip().splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                ours[j["seq_len"]] = statistics.median(j["times_s"])
        eager = EagerQwen3(model_dir, self.dev0, dtype)
        hf_model = None
        if os.environ.get("SPECWIRE_GPU_CHECK_HF", "1") != "0":
            try:
                import transformers  # optional: absent on the GPU host as a rule
                hf_model = transformers.AutoModelForCausalLM.from_pretrained(
                    model_dir, dtype=dtype, attn_implementation="sdpa").to(self.dev0).eval()
            except Exception as e:  # noqa: BLE001
                print(f"  (transformers not timed: {type(e).__name__}: {str(e)[:80]})")
        for T in (int(s) for s in a.seq_lens.split(",")):
            ids = bench_tokens(T, QWEN3_100M["vocab_size"])

            def eager_run():
                states, final = eager.forward(ids)
                _ = [s.cpu() for s in states] + [final.cpu()]

            t_eager = statistics.median(time_fn(eager_run, self.device, a.warmup, a.reps))
            hf_txt = ""
            if hf_model is not None:
                ids_t = torch.tensor([ids], device=self.dev0)

                def hf_run():
                    with torch.inference_mode():
                        o = hf_model(input_ids=ids_t, output_hidden_states=True, use_cache=False,
                                     logits_to_keep=1)
                        _ = [h.cpu() for h in o.hidden_states]

                t_hf = statistics.median(time_fn(hf_run, self.device, a.warmup, a.reps))
                hf_txt = f"; transformers {T / t_hf:,.0f} tok/s (specwire x{t_hf / ours[T]:.2f})"
            if T not in ours:
                self.row(f"bench {a.bench_dtype} T={T}", "ERROR", "no timing from the binary")
                continue
            self.row(f"bench {a.bench_dtype} T={T}", "INFO",
                     f"specwire {T / ours[T]:,.0f} tok/s ({ours[T] * 1e3:.1f} ms); plain torch "
                     f"{T / t_eager:,.0f} tok/s (specwire x{t_eager / ours[T]:.2f}){hf_txt}")
        del eager, hf_model


def cmd_run(args) -> int:
    t0 = time.perf_counter()
    ck = Checker(args)
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("torch sees no CUDA device", file=sys.stderr)
            return 1
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}")
    else:
        print(f"device: {args.device}, torch {torch.__version__}")
    print(f"reference: transformers {ck.manifest['transformers']} on CPU (torch "
          f"{ck.manifest['torch']}), {len(ck.manifest['checkpoints'])} checkpoints, "
          f"sequences of {', '.join(str(len(s)) for s in ck.seqs)} tokens")
    def guard(name: str, fn, *fn_args) -> None:  # one broken check must not hide the others
        try:
            fn(*fn_args)
        except Exception as e:  # noqa: BLE001
            ck.row(name, "ERROR", f"{type(e).__name__}: {str(e)[:140]}")

    ckpts = ck.manifest["checkpoints"]
    for c in ckpts:
        for dtype in ("float32", "bfloat16"):
            guard(f"parity {c['name']} {dtype}", ck.parity, c, dtype)
    for c in ckpts:
        guard(f"generate {c['name']} float32", ck.generate, c)
    for c in ckpts:
        guard(f"split {c['name']} bfloat16", ck.split, c, "bfloat16")
    if not args.skip_bench:
        t_model = time.perf_counter()
        model_dir = make_bench_model(Path(args.bench_model), device=ck.dev0)
        print(f"  (bench model ready in {time.perf_counter() - t_model:.1f}s: {model_dir.name})")
        guard(f"long qwen3-100m bfloat16 T={args.long_len}", ck.long_parity, model_dir, args.long_len)
        guard(f"bench {args.bench_dtype}", ck.benchmark, model_dir)

    width = max(len(r["check"]) for r in ck.rows)
    lines = [f"{'check':<{width}}  result  numbers", "-" * (width + 60)]
    lines += [f"{r['check']:<{width}}  {r['result']:<6}  {r['numbers']}" for r in ck.rows]
    bad = [r for r in ck.rows if r["result"] in ("FAIL", "ERROR")]
    lines.append(f"{len(ck.rows)} checks, {len(bad)} failed; compare.py {time.perf_counter() - t0:.0f}s")
    table = "\n".join(lines)
    print("\n" + table)
    (ck.out / "summary.txt").write_text(table + "\n")
    (ck.out / "summary.json").write_text(json.dumps(ck.rows, indent=1))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="every check, then the table")
    r.add_argument("--extract", required=True, help="the specwire-extract binary")
    r.add_argument("--bench", required=True, help="the specwire-bench-extract binary")
    r.add_argument("--ref", required=True, help="build/gpu-kit/ref")
    r.add_argument("--out", required=True, help="logs and summary")
    r.add_argument("--work", help="extracted states (tens of MB; default OUT/states)")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--bench-model", required=True, help="directory for the ~100M Qwen3 (made once)")
    r.add_argument("--bench-dtype", default="bfloat16")
    r.add_argument("--seq-lens", default="512,2048,8192")
    r.add_argument("--long-len", type=int, default=2048)
    r.add_argument("--reps", type=int, default=5)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--skip-bench", action="store_true")
    m = sub.add_parser("make-bench-model", help="write the ~100M random Qwen3")
    m.add_argument("dir")
    args = ap.parse_args()
    if args.cmd == "make-bench-model":
        print(make_bench_model(Path(args.dir)))
        return 0
    return cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
