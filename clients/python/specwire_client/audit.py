"""Are features made elsewhere the canonical ones? audit_features() recomputes every sample's
canonical states through an extractor and reports, per foreign tensor, which canonical tap it
matches (embedding, each layer, the final norm), how closely, and what that means:

    identical  equal to the canonical state rounded to the foreign dtype
    rounding   within the rounding of its dtype (relative L2 ≤ ROUNDING[dtype])
    drift      close (cosine ≥ DRIFT_COSINE) but beyond rounding: other kernels or numerics
    mismatch   no tap is close: other weights, another forward, other tokens

A tensor wider than the hidden size is a concatenation: each hidden-size slice is matched on
its own, so a concatenation in another order shows up. When the format declares which state a
tensor holds (a layer-id convention, "last state after the final norm"), the audit checks the
declaration against the best match and names the difference ("ids off by one", "pre-norm where
post-norm was declared"). Token ids are compared first when the expected ids are given (another
chat template or thinking flag shows up there), with both tokens decoded.

Readers (read_features): specwire exports (their manifest declares every slice), SpecForge
offline records (.ckpt / .ckpt.gz: DFlash `hidden_states`, EAGLE-3 `hidden_state` +
`aux_hidden_state`), vLLM / speculators `hs_{i}.safetensors` files (hidden-state indices,
vLLM's capture: index L is the last layer before the norm), and transformers captures written by
capture_hidden_states (any model object's output_hidden_states, transformers' convention: index
L is after the final norm). `python -m specwire_client.audit` runs it; the exit status is 1 when
anything is not identical / rounding-level or not where it was declared.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import io
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import torch

from .client import ExtractorClient, Target

# Relative L2 error a state may carry from being computed and stored in a dtype (the parity
# tolerances of the canonical forward: fp32 1e-5 per tap, bf16 1e-2; fp16 in between).
ROUNDING = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DRIFT_COSINE = 0.999
LEVELS = ("identical", "rounding", "drift", "mismatch")


@dataclasses.dataclass
class ForeignTensor:
    """One foreign tensor [T, k × H], and what its format says each H-wide slice holds
    (canonical tap names, e.g. ["layer.1", "final_norm"]; None: not declared)."""

    name: str
    data: torch.Tensor
    declared: list[str] | None = None


@dataclasses.dataclass
class ForeignSample:
    token_ids: list[int]
    tensors: list[ForeignTensor]
    source: str = ""
    expected_token_ids: list[int] | None = None


def tap_names(num_layers: int) -> list[str]:
    return ["embedding", *(f"layer.{k}" for k in range(num_layers)), "final_norm"]


def hf_index(tap: str, num_layers: int) -> int:
    """transformers' output_hidden_states index of a tap (final_norm = its last entry)."""
    if tap == "embedding":
        return 0
    if tap == "final_norm":
        return num_layers
    return int(tap.split(".")[1]) + 1


def tap_of_hf_index(i: int, num_layers: int, last_is_post_norm: bool) -> str:
    """The tap behind hidden-state index i: 0 the embedding, k + 1 layer k; index L is the final
    norm's output in transformers' convention and the last layer's raw output in vLLM's."""
    if not 0 <= i <= num_layers:
        raise ValueError(f"hidden-state index {i} is outside 0..{num_layers}")
    if i == 0:
        return "embedding"
    if i == num_layers and last_is_post_norm:
        return "final_norm"
    return f"layer.{i - 1}"


# --- readers -----------------------------------------------------------------------------------

def _load_ckpt(path: Path) -> dict[str, Any]:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=True)
    return torch.load(path, weights_only=True, map_location="cpu")


def _rows(t: torch.Tensor, name: str, path: Path) -> torch.Tensor:
    if t.dim() == 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2:
        raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}; expected [T, W] or "
                         "[1, T, W]")
    return t


def _ids(t: Any, name: str, path: Path) -> list[int]:
    if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point:
        raise ValueError(f"{path}: {name} must be an integer tensor")
    return [int(x) for x in t.reshape(-1).tolist()]


def read_specforge(path: Union[str, Path], *, layer_ids: Sequence[int] | None = None,
                   num_layers: int | None = None) -> list[ForeignSample]:
    """SpecForge records: a .ckpt / .ckpt.gz file or a directory of them (sorted).
    DFlash records hold input_ids + hidden_states; offline EAGLE-3 records input_ids +
    hidden_state (the final-norm state, declared so) + aux_hidden_state; the dumps of SpecForge's
    online capture (its feature store's dump_dir) name EAGLE-3's aux concatenation hidden_state
    and the final-norm state target (a target of another width, logits, is not a hidden state
    and is left out). `layer_ids` (SpecForge's: id k = hidden_states[k + 1]) declares the
    concatenated slices."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(
        f for f in p.rglob("*") if f.name.endswith((".ckpt", ".ckpt.gz")))
    if not files:
        raise ValueError(f"{p}: no .ckpt or .ckpt.gz files")
    declared = None
    if layer_ids is not None:
        if num_layers is None:
            raise ValueError("layer_ids: give num_layers too")
        declared = [tap_of_hf_index(k + 1, num_layers, True) for k in layer_ids]
    out = []
    for f in files:
        raw = _load_ckpt(f)
        if not isinstance(raw, Mapping) or "input_ids" not in raw:
            raise ValueError(f"{f}: not a SpecForge record (expected a dict with input_ids and "
                             "hidden_states, or hidden_state + aux_hidden_state)")
        tensors = []
        if "hidden_states" in raw:
            tensors.append(ForeignTensor("hidden_states", _rows(raw["hidden_states"],
                                                               "hidden_states", f), declared))
        elif "aux_hidden_state" in raw and "hidden_state" in raw:
            tensors.append(ForeignTensor("hidden_state", _rows(raw["hidden_state"],
                                                              "hidden_state", f),
                                         ["final_norm"]))
            tensors.append(ForeignTensor("aux_hidden_state", _rows(raw["aux_hidden_state"],
                                                                  "aux_hidden_state", f),
                                         declared))
        elif "hidden_state" in raw and "target" in raw:
            aux = _rows(raw["hidden_state"], "hidden_state", f)
            tensors.append(ForeignTensor("hidden_state", aux, declared))
            target = raw["target"]
            if target.dim() >= 2 and aux.shape[-1] % target.shape[-1] == 0:
                tensors.append(ForeignTensor("target", _rows(target, "target", f),
                                             ["final_norm"]))
        else:
            raise ValueError(f"{f}: has {sorted(raw)}; expected hidden_states (DFlash), "
                             "hidden_state + aux_hidden_state (offline EAGLE-3) or "
                             "hidden_state + target (online EAGLE-3)")
        out.append(ForeignSample(_ids(raw["input_ids"], "input_ids", f), tensors, str(f)))
    return out


def read_vllm(path: Union[str, Path], *, layer_ids: Sequence[int] | None = None,
              num_layers: int | None = None) -> list[ForeignSample]:
    """vLLM extract_hidden_states / speculators files: hs_{i}.safetensors (a file, a directory
    of them, or a speculators dataset directory with hidden_states/), each hidden_states
    [T, n, H] + token_ids. `layer_ids` are vLLM's hidden-state indices of the n slices (index L:
    the last layer before the final norm)."""
    from safetensors.torch import load_file
    p = Path(path)
    if p.is_dir() and (p / "hidden_states").is_dir():
        p = p / "hidden_states"
    files = [p] if p.is_file() else sorted(p.glob("hs_*.safetensors"),
                                           key=lambda f: int(f.stem[3:]) if f.stem[3:].isdigit()
                                           else -1)
    if not files:
        raise ValueError(f"{p}: no hs_*.safetensors files")
    out = []
    for f in files:
        raw = load_file(str(f))
        if "hidden_states" not in raw or "token_ids" not in raw:
            raise ValueError(f"{f}: has {sorted(raw)}; expected hidden_states [T, n, H] and "
                             "token_ids")
        hs = raw["hidden_states"]
        if hs.dim() != 3:
            raise ValueError(f"{f}: hidden_states has shape {tuple(hs.shape)}; expected "
                             "[T, n, H]")
        if layer_ids is not None and len(layer_ids) != hs.shape[1]:
            raise ValueError(f"{f}: {hs.shape[1]} layers stored, {len(layer_ids)} layer ids given")
        tensors = []
        for j in range(hs.shape[1]):
            declared = None
            if layer_ids is not None:
                if num_layers is None:
                    raise ValueError("layer_ids: give num_layers too")
                declared = [tap_of_hf_index(int(layer_ids[j]), num_layers, False)]
            tensors.append(ForeignTensor(f"hidden_states[:, {j}]", hs[:, j], declared))
        out.append(ForeignSample(_ids(raw["token_ids"], "token_ids", f), tensors, str(f)))
    return out


def capture_hidden_states(model: Any, input_ids: Sequence[int], path: Union[str, Path], *,
                          hooks: Mapping[str, Any] | None = None, **forward_kwargs: Any) -> None:
    """What a user's own model object computes, whatever its class: its output_hidden_states
    for `input_ids`, saved as hidden_states.{i} [T, H] + token_ids (read_hf reads it). With
    `hooks` ({name: module}), the outputs of those modules instead, recorded by forward hooks
    (for code that taps layers itself), saved as hook.{name}: undeclared, so the audit names the
    tap each one holds."""
    from safetensors.torch import save_file
    ids = torch.tensor([list(input_ids)], dtype=torch.long)
    tensors: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in (hooks or {}).items():
        def record(_m: Any, _inp: Any, out: Any, name: str = name) -> None:
            t = out[0] if isinstance(out, (tuple, list)) else out
            tensors[f"hook.{name}"] = t.detach().reshape(-1, t.shape[-1]).contiguous().clone()
        handles.append(module.register_forward_hook(record))
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=hooks is None, **forward_kwargs)
    finally:
        for h in handles:
            h.remove()
    if hooks is None:
        tensors = {f"hidden_states.{i}": h[0].contiguous() for i, h in enumerate(out.hidden_states)}
    elif len(tensors) != len(hooks):
        missing = sorted(set(hooks) - {k[len("hook."):] for k in tensors})
        raise ValueError(f"hooks {missing} did not run in the forward")
    tensors["token_ids"] = ids[0]
    save_file(tensors, str(path))


def read_hf(path: Union[str, Path], *, num_layers: int | None = None) -> list[ForeignSample]:
    """capture_hidden_states files (one file or a directory of *.safetensors): each
    hidden_states.{i} declared as transformers' index i (the last one after the final norm)."""
    from safetensors.torch import load_file
    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{p}: no .safetensors files")
    out = []
    for f in files:
        raw = load_file(str(f))
        names = sorted((k for k in raw if k.startswith("hidden_states.")),
                       key=lambda k: int(k.split(".")[1]))
        hooked = sorted(k for k in raw if k.startswith("hook."))
        if not (names or hooked) or "token_ids" not in raw:
            raise ValueError(f"{f}: expected hidden_states.{{i}} or hook.{{name}} tensors and "
                             "token_ids (capture_hidden_states writes them)")
        n = num_layers if num_layers is not None else len(names) - 1
        tensors = [ForeignTensor(k, _rows(raw[k], k, f),
                                 [tap_of_hf_index(int(k.split(".")[1]), n, True)]
                                 if int(k.split(".")[1]) <= n else None) for k in names]
        tensors += [ForeignTensor(k, _rows(raw[k], k, f)) for k in hooked]
        out.append(ForeignSample(_ids(raw["token_ids"], "token_ids", f), tensors, str(f)))
    return out


def read_specwire_export(path: Union[str, Path]) -> list[ForeignSample]:
    """A specwire export directory: its manifest declares the state behind every slice."""
    p = Path(path)
    m = json.loads((p / "specwire_export.json").read_text())
    layers = m["format_layers"]
    L = int(m["contract"]["num_layers"])
    if m["format"] == "specforge":
        samples = read_specforge(p)
        for s in samples:
            for t in s.tensors:
                if t.name != "hidden_state":
                    t.declared = list(layers["states"])
        return samples
    return read_vllm(p, layer_ids=layers["hidden_states_layers"], num_layers=L)


FORMATS = ("auto", "specwire-export", "specforge", "vllm", "speculators", "hf")


def read_features(path: Union[str, Path], format: str = "auto", *,
                  layer_ids: Sequence[int] | None = None,
                  num_layers: int | None = None) -> list[ForeignSample]:
    """Foreign features from `path` in `format` (auto: from the files found)."""
    p = Path(path)
    if format not in FORMATS:
        raise ValueError(f"format: {format!r} is not one of {', '.join(FORMATS)}")
    if format == "auto":
        if (p / "specwire_export.json").is_file():
            format = "specwire-export"
        elif p.name.endswith((".ckpt", ".ckpt.gz")) or (p.is_dir() and any(
                f.name.endswith((".ckpt", ".ckpt.gz")) for f in p.rglob("*"))):
            format = "specforge"
        elif p.name.startswith("hs_") or (p.is_dir() and (any(p.glob("hs_*.safetensors")) or
                                                          (p / "hidden_states").is_dir())):
            format = "vllm"
        elif p.suffix == ".safetensors" or (p.is_dir() and any(p.glob("*.safetensors"))):
            format = "hf"
        else:
            raise ValueError(f"{p}: no known feature layout (a specwire export, SpecForge "
                             ".ckpt records, hs_*.safetensors, or capture_hidden_states files)")
    if format == "specwire-export":
        return read_specwire_export(p)
    if format == "specforge":
        return read_specforge(p, layer_ids=layer_ids, num_layers=num_layers)
    if format in ("vllm", "speculators"):
        return read_vllm(p, layer_ids=layer_ids, num_layers=num_layers)
    return read_hf(p, num_layers=num_layers)


# --- the audit ---------------------------------------------------------------------------------

@dataclasses.dataclass
class SliceMatch:
    """One H-wide slice of a foreign tensor against its best canonical tap."""

    slice: int
    tap: str
    declared: str | None
    level: str
    rel_l2: float
    cosine: float
    max_abs: float
    threshold: float
    worst_position: int
    position_rel_error: list[float]
    runner_up: tuple[str, float] | None  # the next-best tap and its relative L2


@dataclasses.dataclass
class TensorAudit:
    name: str
    shape: list[int]
    dtype: str
    level: str
    slices: list[SliceMatch]
    findings: list[str]


@dataclasses.dataclass
class TokenCheck:
    equal: bool
    first_difference: int | None = None
    foreign_token: str | None = None
    expected_token: str | None = None


@dataclasses.dataclass
class SampleAudit:
    index: int
    source: str
    tokens: TokenCheck | None
    tensors: list[TensorAudit]

    @property
    def ok(self) -> bool:
        return (self.tokens is None or self.tokens.equal) and all(
            t.level in ("identical", "rounding") and not t.findings for t in self.tensors)


@dataclasses.dataclass
class AuditReport:
    contract: dict[str, Any]
    samples: list[SampleAudit]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.samples)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "thresholds": {"rounding_rel_l2": {str(k).replace("torch.", ""): v
                                                                   for k, v in ROUNDING.items()},
                                              "drift_cosine": DRIFT_COSINE},
                "contract": self.contract,
                "samples": [dataclasses.asdict(s) for s in self.samples]}

    def table(self) -> str:
        lines = [f"{'sample':>6}  {'tensor':<24} {'slice':>5}  {'declared':<12} {'matches':<12} "
                 f"{'rel L2':>9} {'cosine':>9}  verdict"]
        for s in self.samples:
            if s.tokens is not None and not s.tokens.equal:
                lines.append(f"{s.index:>6}  token ids differ at position "
                             f"{s.tokens.first_difference}: {s.tokens.foreign_token!r} here, "
                             f"{s.tokens.expected_token!r} expected")
            for t in s.tensors:
                for m in t.slices:
                    lines.append(f"{s.index:>6}  {t.name:<24} {m.slice:>5}  "
                                 f"{(m.declared or '-'):<12} {m.tap:<12} {m.rel_l2:>9.2e} "
                                 f"{m.cosine:>9.6f}  {m.level}")
                for f in t.findings:
                    lines.append(f"{'':>6}  {t.name}: {f}")
        lines.append("verdict: " + ("every tensor is the canonical state, where declared" if self.ok
                                    else "NOT the canonical features (see above)"))
        return "\n".join(lines)

    def html(self) -> str:
        """A page: the verdict, the worst relative L2 of every tensor slice over the samples
        (log-axis chart, per tap), the findings, and the error over positions of the worst slice."""
        worst: dict[tuple[str, int], SliceMatch] = {}
        for s in self.samples:
            for t in s.tensors:
                for m in t.slices:
                    key = (t.name, m.slice)
                    if key not in worst or m.rel_l2 > worst[key].rel_l2:
                        worst[key] = m
        rows = [(f"{n}[{j}] = {m.tap}" + (f" (declared {m.declared})" if m.declared and
                                          m.declared != m.tap else ""), m.rel_l2, m.level)
                for (n, j), m in worst.items()]
        found = sorted({f"{t.name}: {f}" for s in self.samples for t in s.tensors
                        for f in t.findings})
        tokens = [s for s in self.samples if s.tokens is not None and not s.tokens.equal]
        worst_slice = max(worst.values(), key=lambda m: m.rel_l2, default=None)
        parts = ["<!doctype html><html><head><meta charset='utf-8'><title>specwire audit</title>"
                 "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px}</style>"
                 "</head><body><h1>Feature audit</h1>",
                 f"<p><b>{'PASS' if self.ok else 'FAIL'}</b>: "
                 + ("every tensor is the canonical state, where declared" if self.ok else
                    "not the canonical features") + f" ({len(self.samples)} samples, target "
                 f"{html_escape(str(self.contract.get('architecture', '')))}, "
                 f"{self.contract.get('num_layers', '')} layers)</p>",
                 "<p>Thresholds: relative L2 within rounding "
                 + ", ".join(f"{str(k).replace('torch.', '')} ≤ {v:g}" for k, v in ROUNDING.items())
                 + f"; drift: cosine ≥ {DRIFT_COSINE}.</p>",
                 _svg_bars(rows, "worst relative L2 per tensor slice (log axis, 1e-9 .. 1)")]
        if tokens:
            parts.append("<h2>Token ids</h2><ul>" + "".join(
                f"<li>sample {s.index}: first difference at position {s.tokens.first_difference}"
                f": {html_escape(repr(s.tokens.foreign_token))} here, "
                f"{html_escape(repr(s.tokens.expected_token))} expected</li>" for s in tokens)
                + "</ul>")
        if found:
            parts.append("<h2>Findings</h2><ul>" + "".join(f"<li>{html_escape(f)}</li>"
                                                            for f in found) + "</ul>")
        if worst_slice is not None:
            parts.append(_svg_profile(worst_slice.position_rel_error,
                                      f"relative error over positions of the worst slice "
                                      f"(matching {worst_slice.tap}; log axis)"))
        parts.append("</body></html>")
        return "".join(parts)


def _svg_bars(rows: Sequence[tuple[str, float, str]], title: str) -> str:
    """A horizontal bar chart of relative L2 errors on a log axis (1e-9 .. 1)."""
    width, bar, left = 900, 18, 470
    h = 30 + bar * len(rows)
    colours = {"identical": "#2e7d32", "rounding": "#66bb6a", "drift": "#f9a825",
               "mismatch": "#c62828"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
           f'role="img" aria-label="{title}"><text x="4" y="14" font-size="12">{title}</text>']
    for i, (label, rel, level) in enumerate(rows):
        x = max(0.0, min(1.0, (math.log10(max(rel, 1e-9)) + 9) / 9)) * (width - left - 10)
        y = 24 + i * bar
        out.append(f'<text x="4" y="{y + 12}" font-size="11">{html_escape(label)}</text>'
                   f'<rect x="{left}" y="{y}" width="{max(x, 1):.1f}" height="{bar - 4}" '
                   f'fill="{colours.get(level, "#999")}"><title>{rel:.3e} {level}</title></rect>'
                   f'<text x="{left + max(x, 1) + 4:.1f}" y="{y + 12}" font-size="10">'
                   f'{rel:.1e} {level}</text>')
    out.append("</svg>")
    return "".join(out)


def _svg_profile(values: Sequence[float], title: str) -> str:
    """The relative error over positions (log axis) of one slice."""
    width, height = 900, 160
    if not values:
        return ""
    axis = "".join(
        f'<line x1="40" x2="{width - 10}" y1="{20 + (height - 40) * (1 - e / 9):.1f}" '
        f'y2="{20 + (height - 40) * (1 - e / 9):.1f}" stroke="#ddd"/>'
        f'<text x="2" y="{24 + (height - 40) * (1 - e / 9):.1f}" font-size="10">1e{e - 9}</text>'
        for e in (0, 3, 6, 9))
    pts = []
    for i, v in enumerate(values):
        x = 40 + (width - 50) * (i / max(1, len(values) - 1))
        y = 20 + (height - 40) * (1 - max(0.0, min(1.0, (math.log10(max(v, 1e-9)) + 9) / 9)))
        pts.append(f"{x:.1f},{y:.1f}")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'role="img" aria-label="{title}"><text x="4" y="14" font-size="12">{title}</text>'
            f'{axis}<polyline fill="none" stroke="#1565c0" points="{" ".join(pts)}"/></svg>')


def html_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _compare(f: torch.Tensor, c: torch.Tensor) -> tuple[float, float, float, torch.Tensor]:
    d = f.double() - c.double()
    cn = c.double().norm()
    rel = float(d.norm() / cn) if cn > 0 else float(d.norm())
    fn = f.double().norm()
    cos = float((f.double() * c.double()).sum() / (fn * cn)) if fn > 0 and cn > 0 else 0.0
    per_pos = d.norm(dim=-1) / c.double().norm(dim=-1).clamp_min(1e-30)
    return rel, cos, float(d.abs().max()), per_pos


def _level(f: torch.Tensor, c: torch.Tensor, rel: float, cos: float) -> tuple[str, float]:
    threshold = ROUNDING.get(f.dtype, 1e-5)
    if torch.equal(f, c.to(f.dtype)):
        return "identical", threshold
    if rel <= threshold:
        return "rounding", threshold
    if cos >= DRIFT_COSINE:
        return "drift", threshold
    return "mismatch", threshold


def _explain(declared: str, tap: str, num_layers: int) -> str:
    if declared == "final_norm" and tap == f"layer.{num_layers - 1}":
        return "declared after the final norm, holds the last layer's output before it"
    if declared == f"layer.{num_layers - 1}" and tap == "final_norm":
        return "declared the last layer's raw output, holds it after the final norm"
    shift = hf_index(tap, num_layers) - hf_index(declared, num_layers)
    return (f"declared {declared} (hidden_states[{hf_index(declared, num_layers)}]), holds {tap} "
            f"(hidden_states[{hf_index(tap, num_layers)}]): the layer ids are off by "
            f"{shift:+d}")


def audit_tensor(t: ForeignTensor, canonical: Mapping[str, torch.Tensor],
                 num_layers: int) -> TensorAudit:
    hidden = next(iter(canonical.values())).shape[-1]
    x = t.data
    rows = next(iter(canonical.values())).shape[0]
    findings: list[str] = []
    if x.shape[0] != rows or x.shape[-1] % hidden:
        return TensorAudit(t.name, list(x.shape), str(x.dtype).replace("torch.", ""), "mismatch",
                           [], [f"shape {tuple(x.shape)} does not fit [T = {rows}, k × {hidden}]"])
    k = x.shape[-1] // hidden
    declared = t.declared if t.declared is not None and len(t.declared) == k else None
    if t.declared is not None and declared is None:
        findings.append(f"{len(t.declared)} states declared for {k} slices")
    slices = []
    for j in range(k):
        f = x[:, j * hidden:(j + 1) * hidden]
        scored = []
        for tap, c in canonical.items():
            rel, cos, mx, per_pos = _compare(f, c)
            scored.append((rel, tap, cos, mx, per_pos))
        scored.sort(key=lambda s: s[0])
        rel, tap, cos, mx, per_pos = scored[0]
        level, threshold = _level(f, canonical[tap], rel, cos)
        d = declared[j] if declared else None
        if d is not None and d != tap:
            if level in ("identical", "rounding", "drift"):
                findings.append(f"slice {j}: " + _explain(d, tap, num_layers))
            else:
                rel_d, cos_d, _, _ = _compare(f, canonical[d])
                findings.append(f"slice {j}: matches no tap: cosine {cos_d:.4f} to the declared "
                                f"{d}, {cos:.4f} at its best ({tap}): other weights or another "
                                "forward")
        elif level == "mismatch":
            findings.append(f"slice {j}: matches no tap: cosine {cos:.4f} at its best ({tap}): "
                            "other weights or another forward")
        slices.append(SliceMatch(j, tap, d, level, rel, cos, mx, threshold,
                                 int(per_pos.argmax()), [float(v) for v in per_pos],
                                 (scored[1][1], scored[1][0]) if len(scored) > 1 else None))
    if declared:
        got = [s.tap for s in slices]
        if sorted(got) == sorted(declared) and got != declared:
            findings = [f for f in findings if "off by" not in f]
            findings.append(f"the slices hold {got}: the declared {declared} concatenated in "
                            "another order")
    level = max((s.level for s in slices), key=LEVELS.index) if slices else "mismatch"
    return TensorAudit(t.name, list(x.shape), str(x.dtype).replace("torch.", ""), level, slices,
                       findings)


def audit_features(target: Target | None, samples: Sequence[ForeignSample], *,
                   client: ExtractorClient | None = None, timeout: float | None = 300) -> AuditReport:
    """Audits `samples` against the canonical features of the extractor at `target` (or
    `client`): fp32 states of every tap on the foreign token ids."""
    own = client is None
    c = client or ExtractorClient(target, timeout=timeout)
    try:
        contract = c.model_info()
        L = contract.num_layers
        out = []
        for i, s in enumerate(samples):
            if not s.token_ids:
                raise ValueError(f"sample {i} ({s.source}): no token ids")
            states = c.extract([s.token_ids], list(range(L)), embedding=True, final_norm=True,
                               dtype="fp32")[0]
            canonical = {tap: states[tap] for tap in tap_names(L)}
            tokens = None
            if s.expected_token_ids is not None:
                tokens = _token_check(c, s.token_ids, s.expected_token_ids)
            out.append(SampleAudit(i, s.source, tokens,
                                   [audit_tensor(t, canonical, L) for t in s.tensors]))
        return AuditReport(json.loads(json.dumps(contract.to_dict())), out)
    finally:
        if own:
            c.close()


def _token_check(c: ExtractorClient, got: Sequence[int], want: Sequence[int]) -> TokenCheck:
    if list(got) == list(want):
        return TokenCheck(True)
    n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    pick = [[got[n]] if n < len(got) else [], [want[n]] if n < len(want) else []]
    texts = c.detokenize(pick)
    return TokenCheck(False, n, texts[0] if pick[0] else "<end>", texts[1] if pick[1] else "<end>")


# --- canary fingerprints -----------------------------------------------------------------------

FINGERPRINT_ROUNDING = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


def compare_fingerprints(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two canary fingerprints (Contract.canary, specwire-cli fingerprint's "canary", or a
    report's contract) compared tap by tap as specwire-cli fingerprint --compare does: the
    relative rms difference and the largest sketch difference over the rms; "identical",
    "rounding" (≤ the coarser compute dtype's rounding), "drift" (≤ 100×) or "mismatch"."""
    a = a.get("canary", a) if "taps" not in a else a
    b = b.get("canary", b) if "taps" not in b else b
    threshold = max(FINGERPRINT_ROUNDING.get(a.get("compute_dtype", ""), 1e-5),
                    FINGERPRINT_ROUNDING.get(b.get("compute_dtype", ""), 1e-5))
    ta, tb = a.get("taps", []), b.get("taps", [])
    if not ta or not tb or list(a.get("token_ids", [])) != list(b.get("token_ids", [])) or \
            len(ta) != len(tb):
        return {"level": "mismatch", "threshold": threshold, "taps": [],
                "problem": "the fingerprints are not comparable (no canary, another canary "
                           "input, or another depth)"}
    taps, worst = [], 0
    for x, y in zip(ta, tb):
        scale = max(abs(x["rms"]), 1e-30)
        rms_rel = abs(x["rms"] - y["rms"]) / scale
        sketch_rel = max((abs(p - q) / scale for p, q in zip(x["sketch"], y["sketch"])),
                         default=0.0)
        d = max(rms_rel, sketch_rel)
        level = (0 if x == y else 1 if d <= threshold else 2 if d <= 100 * threshold else 3)
        if x["tap"] != y["tap"]:
            level = 3
        worst = max(worst, level)
        taps.append({"tap": x["tap"], "rms_relative": rms_rel, "sketch_relative": sketch_rel,
                     "level": LEVELS[level]})
    return {"level": LEVELS[worst], "threshold": threshold, "taps": taps, "problem": ""}


# --- acceptance impact -------------------------------------------------------------------------

def drafter_taps(target_layer_ids: Sequence[int], num_layers: int) -> list[str]:
    """The taps a DFlash drafter reads (dflash's convention: id k = hidden_states[k + 1], so
    id L − 1 is the final-norm output)."""
    return [tap_of_hf_index(int(k) + 1, num_layers, True) for k in target_layer_ids]


def drafter_input(sample: ForeignSample, taps: Sequence[str], hidden: int) -> torch.Tensor:
    """The foreign context features a drafter reading `taps` would be fed: the slices declared
    as those taps, in order, or else the one tensor of width len(taps) × H."""
    slices: dict[str, torch.Tensor] = {}
    for t in sample.tensors:
        for j, d in enumerate(t.declared or []):
            slices.setdefault(d, t.data[:, j * hidden:(j + 1) * hidden])
    if all(tap in slices for tap in taps):
        return torch.cat([slices[tap] for tap in taps], dim=-1)
    wide = [t for t in sample.tensors if t.data.shape[-1] == len(taps) * hidden]
    if len(wide) == 1:
        return wide[0].data
    raise ValueError(f"{sample.source}: no foreign tensor is declared as {list(taps)} and none "
                     f"is uniquely {len(taps)} × {hidden} wide")


@dataclasses.dataclass
class AcceptanceImpact:
    """The drafter's τ on the same trajectories with canonical and with foreign features."""

    tau_canonical: float
    tau_canonical_ci: list[float] | None
    tau_foreign: float
    tau_foreign_ci: list[float] | None
    delta_tau: float  # foreign − canonical
    delta_tau_ci: list[float] | None
    prompts: int
    responses: list[dict[str, list[int]]]

    def verdict(self) -> str:
        ci = self.delta_tau_ci
        if ci is None:
            return f"Δτ {self.delta_tau:+.3f} (no interval)"
        inside = ci[0] <= 0 <= ci[1]
        return (f"Δτ {self.delta_tau:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]: " +
                ("within its interval of 0" if inside else
                 ("the foreign features cost acceptance" if ci[1] < 0 else
                  "the foreign features gain acceptance")))


def acceptance_impact(target: Target | None, drafter_dir: Union[str, Path],
                      target_checkpoint: Union[str, Path],
                      trajectories: Sequence[tuple[Sequence[int], int]],
                      foreign: Sequence[torch.Tensor], *, client: ExtractorClient | None = None,
                      replay: Union[str, Path] = "specwire-replay", bootstrap_seed: int = 0,
                      timeout: float = 600) -> AcceptanceImpact:
    """Scores the DFlash drafter in `drafter_dir` on `trajectories` ((token ids, prompt length)
    each) twice with specwire-replay's `features` command — with the canonical context features
    (from the extractor) and with `foreign` ([T, n × H] each, the drafter's layers concatenated)
    — and pairs the two prompt by prompt."""
    import subprocess
    import tempfile
    from safetensors.torch import save_file
    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    ids = (cfg.get("dflash_config") or {}).get("target_layer_ids") or cfg.get("target_layer_ids")
    if not ids:
        raise ValueError(f"{drafter_dir}/config.json: no dflash_config.target_layer_ids")
    if len(foreign) != len(trajectories):
        raise ValueError(f"{len(foreign)} foreign feature sets for {len(trajectories)} "
                         "trajectories")
    own = client is None
    c = client or ExtractorClient(target, timeout=timeout)
    try:
        L = c.model_info().num_layers
        taps = drafter_taps(ids, L)
        layers = sorted({int(t.split(".")[1]) for t in taps if t.startswith("layer.")})
        tensors: dict[str, torch.Tensor] = {}
        cases = []
        for i, ((traj, prompt_len), f) in enumerate(zip(trajectories, foreign)):
            states = c.extract([list(traj)], layers, final_norm="final_norm" in taps,
                               dtype="fp32")[0]
            canon = torch.cat([states[t] for t in taps], dim=-1)
            if tuple(f.shape) != tuple(canon.shape):
                raise ValueError(f"trajectory {i}: foreign features {tuple(f.shape)}, the "
                                 f"drafter reads {tuple(canon.shape)}")
            tensors[f"case.{i}.canonical"] = canon.contiguous()
            tensors[f"case.{i}.foreign"] = f.contiguous()
            cases.append({"trajectory": [int(t) for t in traj], "prompt_len": int(prompt_len)})
    finally:
        if own:
            c.close()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cases.safetensors"
        save_file(tensors, str(path), metadata={"cases": json.dumps(cases)})
        r = subprocess.run([str(replay), "features", "--drafter", str(drafter_dir),
                            "--target_checkpoint", str(target_checkpoint), "--cases", str(path),
                            f"--bootstrap_seed={bootstrap_seed}"],
                           capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"specwire-replay features: {r.stderr.strip()}")
    out = json.loads(r.stdout)
    return AcceptanceImpact(out["canonical"]["tau"], out["canonical"]["tau_ci"],
                            out["foreign"]["tau"], out["foreign"]["tau_ci"], out["delta_tau"],
                            out["delta_tau_ci"], out["prompts"], out["responses"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m specwire_client.audit",
        description="Are these the canonical features? Exit 1 when not.")
    p.add_argument("--extractor", default="127.0.0.1:50051")
    p.add_argument("--features", required=True, help="file or directory of foreign features")
    p.add_argument("--format", default="auto", choices=FORMATS)
    p.add_argument("--layers", default="", help="the layer ids the files were made with, in the "
                   "format's own convention (SpecForge: layer outputs; vLLM / speculators: "
                   "hidden-state indices)")
    p.add_argument("--expected", default="", help="JSONL of the expected input_ids, one line per "
                   "sample in order (e.g. prepared with the right chat template)")
    p.add_argument("--json", default="", help="also write the report as JSON here")
    p.add_argument("--html", default="", help="also write an HTML page (per-slice error chart)")
    p.add_argument("--drafter", default="", help="acceptance impact: a DFlash drafter directory")
    p.add_argument("--target_checkpoint", default="",
                   help="acceptance impact: the target checkpoint (specwire-replay runs its head)")
    p.add_argument("--prompt_len", default="", help="acceptance impact: the prompt length of "
                   "every sample (one int) or a JSON list, one per sample")
    p.add_argument("--replay", default="specwire-replay", help="the specwire-replay binary")
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args(argv)
    try:
        with ExtractorClient(a.extractor, timeout=a.timeout) as c:
            L = c.model_info().num_layers
            layers = [int(x) for x in a.layers.split(",") if x.strip()] or None
            samples = read_features(a.features, a.format, layer_ids=layers, num_layers=L)
            if a.expected:
                lines = [json.loads(x) for x in Path(a.expected).read_text().splitlines()
                         if x.strip()]
                if len(lines) != len(samples):
                    raise ValueError(f"--expected: {len(lines)} lines for {len(samples)} samples")
                for s, line in zip(samples, lines):
                    s.expected_token_ids = [int(t) for t in line["input_ids"]]
            report = audit_features(None, samples, client=c)
            impact = None
            if a.drafter:
                if not a.target_checkpoint or not a.prompt_len:
                    raise ValueError("--drafter: give --target_checkpoint and --prompt_len too")
                lens = json.loads(a.prompt_len)
                lens = lens if isinstance(lens, list) else [lens] * len(samples)
                cfg = json.loads((Path(a.drafter) / "config.json").read_text())
                taps = drafter_taps(cfg["dflash_config"]["target_layer_ids"], L)
                hidden = c.model_info().hidden_size
                impact = acceptance_impact(
                    None, a.drafter, a.target_checkpoint,
                    [(s.token_ids, n) for s, n in zip(samples, lens)],
                    [drafter_input(s, taps, hidden) for s in samples], client=c, replay=a.replay)
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        print(f"audit: {e}", file=sys.stderr)
        return 2
    print(report.table())
    if impact is not None:
        print(f"acceptance: τ {impact.tau_canonical:.3f} canonical, {impact.tau_foreign:.3f} "
              f"foreign; {impact.verdict()}")
    if a.html:
        Path(a.html).write_text(report.html())
    if a.json:
        j = report.to_json()
        if impact is not None:
            j["acceptance"] = dataclasses.asdict(impact)
        Path(a.json).write_text(json.dumps(j, indent=2,
                                           default=lambda v: None if isinstance(v, float) and
                                           math.isnan(v) else v))
    costs = impact is not None and impact.delta_tau_ci is not None and impact.delta_tau_ci[1] < 0
    return 0 if report.ok and not costs else 1


if __name__ == "__main__":
    sys.exit(main())
