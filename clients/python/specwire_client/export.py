"""Training features written as the offline datasets of SpecForge and vllm-project/speculators,
so their own trainers read specwire's extraction as if their capture scripts had made it.

    export_features(target, samples, out_dir, format="specforge" | "speculators",
                    layout="dflash" | "eagle3", layer_ids=..., dtype="bf16")

Layer ids are specwire's (and SpecForge's): id k is the output of decoder layer k, transformers'
hidden_states[k + 1]. speculators numbers the same tensors by hidden-state index (k + 1); the
export converts and records both.

specforge (one torch.save file per sample, `data_{i:08d}.ckpt`, what SpecForge's
OfflineManifestReader / build_offline_eagle3_dataset list and torch.load):
    dflash:  input_ids [T] int64, loss_mask [T] int64,
             hidden_states [T, len(ids) * H]  (hidden_states[k + 1] for each id, concatenated
             in order: layer.k, and final_norm for k = L - 1 as SpecForge's capture reads it)
    eagle3:  input_ids [T] int64, loss_mask [T] int64,
             hidden_state [1, T, H]  (final_norm: the state SpecForge's TargetHead projects),
             aux_hidden_state [1, T, 3H]  (the three aux layers, concatenated)
speculators (a `datasets` directory and `hidden_states/hs_{i}.safetensors`, what speculators'
ArrowDataset loads with load_from_disk and its FileTransfer):
    rows:    input_ids list<int64>, loss_mask list<int64>, seq_len int64
    hs_i:    hidden_states [T, len(ids) + 1, H]  (layer.k for each id, then the last decoder
             layer's output before the final norm: speculators' verifier_last_hidden_states),
             token_ids [T] int64
Both: `specwire_export.json` beside the data, with the extraction contract, the layers in both
numberings, the dtype, the chat template records, the counts and the samples left out; it is
written last, so a directory without it is an interrupted export. A specforge dflash export
leaves out samples without two consecutive supervised tokens (SpecForge's reader refuses them);
file names keep the dataset index.

Samples are token-id lists, dicts with "input_ids" (and "loss_mask"; without one every token is
supervised), or dicts with "messages", rendered with the given ChatTemplate (loss mask over the
assistant spans, ChatTemplate.prepare). `python -m specwire_client.export` runs it on a JSONL
file; `specwire-cli export` writes the same layouts from prepared lines.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import torch

from .chat import ChatTemplate, TemplateRecord, tokenizer_encoder
from .client import ExtractorClient, Target
from .contract import Contract, ContractExpectation
from .dataset import FeatureDataset, RetryPolicy
from .errors import ExtractorError
from .security import ChannelSecurity

FORMATS = ("specforge", "speculators")
LAYOUTS = ("dflash", "eagle3")
MANIFEST = "specwire_export.json"
EXPORT_VERSION = 1

Encode = Callable[[str], tuple[list[int], list[tuple[int, int]]]]


def default_layer_ids(layout: str, num_layers: int,
                      drafter_config: Mapping[str, Any] | None = None) -> list[int]:
    """The layers a layout reads when none are given: a DFlash drafter's
    dflash_config.target_layer_ids; EAGLE-3's [1, L/2 - 1, L - 4] (SpecForge's and vLLM's
    default, in layer-output ids), or the drafter's eagle_aux_hidden_state_layer_ids (a
    speculators config, hidden-state indices) when given."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: {layout!r} is not one of {', '.join(LAYOUTS)}")
    cfg = dict(drafter_config or {})
    if layout == "dflash":
        ids = (cfg.get("dflash_config") or {}).get("target_layer_ids")
        if not ids:
            raise ValueError("layer_ids: a dflash export needs the drafter's layers: give "
                             "layer_ids or a drafter config with dflash_config.target_layer_ids")
        return [int(i) for i in ids]
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        return [int(i) - 1 for i in cfg["eagle_aux_hidden_state_layer_ids"]]
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if len(set(ids)) != 3 or min(ids) < 0:
        raise ValueError(f"layer_ids: EAGLE-3's default aux layers {ids} do not fit a "
                         f"{num_layers}-layer target; give three distinct layer_ids")
    return ids


def check_layer_ids(layout: str, layer_ids: Sequence[int], num_layers: int) -> list[int]:
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise ValueError("layer_ids: empty")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"layer_ids: {bad} outside the target's layers 0..{num_layers - 1}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"layer_ids: {ids} repeats a layer")
    if layout == "eagle3" and len(ids) != 3:
        raise ValueError(f"layer_ids: EAGLE-3 reads exactly three aux layers, got {ids}")
    return ids


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    """What one export writes: format, layout, layers (specwire ids) and dtype."""

    format: str
    layout: str
    layer_ids: tuple[int, ...]
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format: {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if self.dtype not in ("bf16", "fp32"):
            raise ValueError(f"dtype: {self.dtype!r} is not bf16 or fp32")

    def layer_states(self, num_layers: int) -> list[str]:
        """The specwire state behind each selected layer, in order. SpecForge reads id k as
        transformers' hidden_states[k + 1], so its id L - 1 is the final-norm output (as in
        dflash's reference code and specwire's scorer); speculators' vLLM capture reads the last
        layer's output before the norm."""
        return [f"layer.{k}" if self.format == "speculators" or k != num_layers - 1
                else "final_norm" for k in self.layer_ids]

    def states(self, num_layers: int) -> tuple[list[int], bool]:
        """(layer ids to extract, whether final_norm is needed)."""
        names = self.layer_states(num_layers)
        if self.format == "speculators":
            names.append(f"layer.{num_layers - 1}")
        elif self.layout == "eagle3":
            names.append("final_norm")
        ids = sorted({int(n.split(".")[1]) for n in names if n.startswith("layer.")})
        return ids, "final_norm" in names

    def format_layers(self, num_layers: int) -> dict[str, Any]:
        """The layers in the trainer's own numbering, for its config."""
        if self.format == "specforge":
            key = "target_layer_ids" if self.layout == "dflash" else "aux_hidden_state_layer_ids"
            out: dict[str, Any] = {key: list(self.layer_ids),
                                   "states": self.layer_states(num_layers)}
            if self.layout == "eagle3":
                out["hidden_state"] = "final_norm"
            return out
        key = "target_layer_ids" if self.layout == "dflash" else "eagle_aux_hidden_state_layer_ids"
        return {key: [i + 1 for i in self.layer_ids],
                "hidden_states_layers": [i + 1 for i in self.layer_ids] + [num_layers],
                "verifier_last_hidden_states": f"layer.{num_layers - 1} (before the final norm)"}


def sample_tensors(spec: ExportSpec, num_layers: int, input_ids: torch.Tensor,
                   loss_mask: torch.Tensor,
                   states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One sample's tensors in the format's names, shapes and dtypes."""
    layers = [states[name] for name in spec.layer_states(num_layers)]
    ids = input_ids.to(torch.long).contiguous()
    if spec.format == "speculators":
        stacked = torch.stack(layers + [states[f"layer.{num_layers - 1}"]], dim=1)
        return {"hidden_states": stacked.contiguous(), "token_ids": ids}
    mask = loss_mask.to(torch.long).contiguous()
    if spec.layout == "dflash":
        return {"input_ids": ids, "loss_mask": mask,
                "hidden_states": torch.cat(layers, dim=-1).contiguous()}
    return {"input_ids": ids, "loss_mask": mask,
            "hidden_state": states["final_norm"].unsqueeze(0).contiguous(),
            "aux_hidden_state": torch.cat(layers, dim=-1).unsqueeze(0).contiguous()}


def prepare_samples(samples: Iterable[Any], template: ChatTemplate | None = None,
                    encode: Encode | None = None,
                    flags: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every sample as {"input_ids": [...], "loss_mask": [...]} (plus "chat_template" when it
    has a record), checked: ids are non-negative ints, the mask is 0/1 and as long as the ids.
    Conversations ({"messages": [...]}) are rendered with `template` and `encode`."""
    out = []
    for i, s in enumerate(samples):
        record: Any = None
        if isinstance(s, Mapping) and "messages" in s:
            if template is None or encode is None:
                raise ValueError(f"sample {i}: has messages but no chat template / tokenizer "
                                 "was given to render them")
            p = template.prepare(s["messages"], encode, **dict(flags or {}))
            ids, mask, record = p.input_ids, p.loss_mask, p.record.to_json()
        elif isinstance(s, Mapping):
            if "input_ids" not in s:
                raise ValueError(f"sample {i}: needs input_ids or messages")
            ids = _int_list(s["input_ids"], i, "input_ids")
            mask = (_int_list(s["loss_mask"], i, "loss_mask") if s.get("loss_mask") is not None
                    else [1] * len(ids))
            record = s.get("chat_template")
        else:
            ids = _int_list(s, i, "input_ids")
            mask = [1] * len(ids)
        if not ids:
            raise ValueError(f"sample {i}: input_ids is empty")
        if any(t < 0 for t in ids):
            raise ValueError(f"sample {i}: input_ids holds a negative token id")
        if len(mask) != len(ids):
            raise ValueError(f"sample {i}: loss_mask has {len(mask)} entries for "
                             f"{len(ids)} input_ids")
        if any(m not in (0, 1) for m in mask):
            raise ValueError(f"sample {i}: loss_mask entries must be 0 or 1")
        row: dict[str, Any] = {"input_ids": ids, "loss_mask": mask}
        if record is not None:
            row["chat_template"] = record
        out.append(row)
    return out


def _int_list(v: Any, i: int, field: str) -> list[int]:
    if isinstance(v, torch.Tensor):
        v = v.reshape(-1).tolist()
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
        raise ValueError(f"sample {i}: {field} must be a list of integers")
    out = []
    for t in v:
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"sample {i}: {field} holds {t!r}, not an integer")
        out.append(t)
    return out


def _template_records(rows: Sequence[Mapping[str, Any]]) -> list[Any]:
    records: list[Any] = []
    for r in rows:
        rec = r.get("chat_template")
        if rec is not None and rec not in records:
            records.append(rec)
    return records


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_speculators_rows(out_dir: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """The `datasets` directory (save_to_disk's layout: one Arrow stream file, state.json,
    dataset_info.json) of the rows' input_ids, loss_mask and seq_len, torch-formatted."""
    try:
        import pyarrow as pa
    except ImportError as e:  # pragma: no cover
        raise ImportError("the speculators format writes Arrow: pip install "
                          "'specwire-client[speculators]' (pyarrow)") from e
    features = speculators_features()
    schema = pa.schema([("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int64())),
                        ("seq_len", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    table = pa.table({"input_ids": [list(r["input_ids"]) for r in rows],
                      "loss_mask": [list(r["loss_mask"]) for r in rows],
                      "seq_len": [len(r["input_ids"]) for r in rows]}, schema=schema)

    def arrow(p: Path) -> None:
        with pa.OSFile(str(p), "wb") as f:
            with pa.ipc.new_stream(f, schema) as w:
                w.write_table(table)

    _atomic_write(out_dir / SPECULATORS_ARROW, arrow)
    for name, content in speculators_dataset_json(rows).items():
        (out_dir / name).write_text(content)


SPECULATORS_ARROW = "data-00000-of-00001.arrow"


def speculators_features() -> dict[str, Any]:
    ints = {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"}
    return {"input_ids": ints, "loss_mask": ints, "seq_len": {"dtype": "int64", "_type": "Value"}}


def speculators_dataset_json(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """state.json and dataset_info.json of the rows' dataset (the fingerprint is a digest of
    the rows, so the same rows give the same directory)."""
    import hashlib
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps([list(r["input_ids"]), list(r["loss_mask"])]).encode())
    state = {"_data_files": [{"filename": SPECULATORS_ARROW}], "_fingerprint": h.hexdigest()[:16],
             "_format_columns": None, "_format_kwargs": {}, "_format_type": "torch",
             "_output_all_columns": False, "_split": None}
    info = {"citation": "", "description": "", "features": speculators_features(),
            "homepage": "", "license": ""}
    return {"state.json": json.dumps(state, indent=2), "dataset_info.json": json.dumps(info,
                                                                                       indent=2)}


def sample_path(spec: ExportSpec, out_dir: Path, index: int) -> Path:
    if spec.format == "specforge":
        return out_dir / f"data_{index:08d}.ckpt"
    return out_dir / "hidden_states" / f"hs_{index}.safetensors"


def write_sample(spec: ExportSpec, path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    if spec.format == "specforge":
        _atomic_write(path, lambda p: torch.save(dict(tensors), str(p)))
    else:
        from safetensors.torch import save_file
        _atomic_write(path, lambda p: save_file(dict(tensors), str(p)))


def trainable(spec: ExportSpec, loss_mask: Sequence[int]) -> bool:
    """SpecForge's DFlash reader refuses a sample without two consecutive supervised tokens (no
    block can be anchored in it): such samples are left out of a specforge dflash export."""
    if spec.format != "specforge" or spec.layout != "dflash":
        return True
    return any(a and b for a, b in zip(loss_mask, loss_mask[1:]))


UNTRAINABLE = "no two consecutive supervised tokens (SpecForge's DFlash reader refuses it)"


def manifest(spec: ExportSpec, contract: Contract, rows: Sequence[Mapping[str, Any]],
             source: str = "", skipped: Sequence[int] = ()) -> dict[str, Any]:
    skip = set(skipped)
    rows = [r for i, r in enumerate(rows) if i not in skip]
    return {
        "specwire_export": EXPORT_VERSION,
        "format": spec.format,
        "layout": spec.layout,
        "dtype": spec.dtype,
        "layer_ids": list(spec.layer_ids),
        "layer_numbering": "specwire: id k = output of decoder layer k = hidden_states[k + 1]",
        "format_layers": spec.format_layers(contract.num_layers),
        "samples": len(rows),
        "tokens": sum(len(r["input_ids"]) for r in rows),
        "supervised_tokens": sum(sum(r["loss_mask"]) for r in rows),
        "skipped": [{"sample_index": i, "reason": UNTRAINABLE} for i in sorted(skip)],
        "chat_templates": _template_records(rows),
        "source": source,
        "contract": contract.to_dict(),
    }


@dataclasses.dataclass(frozen=True)
class ExportSummary:
    out_dir: Path
    samples: int
    tokens: int
    manifest: dict[str, Any]


def export_features(target: Target | None, samples: Iterable[Any], out_dir: Union[str, Path], *,
                    format: str, layout: str, layer_ids: Sequence[int] | None = None,
                    drafter_config: Mapping[str, Any] | None = None, dtype: str = "bf16",
                    template: ChatTemplate | None = None, encode: Encode | None = None,
                    template_flags: Mapping[str, Any] | None = None,
                    sequences_per_request: int = 8, retry: RetryPolicy = RetryPolicy(),
                    security: ChannelSecurity | None = None, timeout: float | None = None,
                    client_factory: Callable[[], ExtractorClient] | None = None,
                    source: str = "") -> ExportSummary:
    """Extracts every sample's states from the extractor at `target` and writes them in
    `format`'s offline layout for `layout` under `out_dir` (created; files of an earlier export
    there are overwritten). Every stream must come from the target whose contract was read
    first (ContractMismatch otherwise). Returns the manifest written beside the data."""
    rows = prepare_samples(samples, template, encode, template_flags)
    if not rows:
        raise ValueError("samples: nothing to export")
    factory = client_factory or (lambda: ExtractorClient(target, timeout=timeout,
                                                         security=security))
    with factory() as client:
        contract = client.model_info()
    if layer_ids is None:
        layer_ids = default_layer_ids(layout, contract.num_layers, drafter_config)
    spec = ExportSpec(format, layout,
                      tuple(check_layer_ids(layout, layer_ids, contract.num_layers)), dtype)
    ids, final_norm = spec.states(contract.num_layers)
    out = Path(out_dir)
    (out / "hidden_states" if format == "speculators" else out).mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    ds = FeatureDataset(None, [{"input_ids": r["input_ids"]} for r in rows], ids,
                        final_norm=final_norm, dtype=dtype,
                        sequences_per_request=sequences_per_request, retry=retry,
                        expect=ContractExpectation.from_contract(contract), rank=0,
                        world_size=1, client_factory=factory)
    written = 0
    skipped = [i for i, r in enumerate(rows) if not trainable(spec, r["loss_mask"])]
    for item in ds:
        i = item["sample_index"]
        if item["input_ids"].tolist() != rows[i]["input_ids"]:
            raise RuntimeError(f"sample {i}: the extractor returned other token ids")
        written += 1
        if not trainable(spec, rows[i]["loss_mask"]):
            continue
        tensors = sample_tensors(spec, contract.num_layers, item["input_ids"],
                                 torch.tensor(rows[i]["loss_mask"]), item["hidden_states"])
        write_sample(spec, sample_path(spec, out, i), tensors)
    if written != len(rows):
        raise RuntimeError(f"extracted {written} of {len(rows)} samples")
    if format == "speculators":
        write_speculators_rows(out, rows)
    m = manifest(spec, contract, rows, source, skipped)
    _atomic_write(out / MANIFEST, lambda p: p.write_text(json.dumps(m, indent=2) + "\n"))
    return ExportSummary(out, m["samples"], m["tokens"], m)


def read_jsonl(path: Union[str, Path]) -> list[Any]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m specwire_client.export",
        description="Export training features as SpecForge's or speculators' offline dataset.")
    p.add_argument("--extractor", default="127.0.0.1:50051")
    p.add_argument("--dataset", required=True,
                   help="JSONL: lines of input_ids (+ loss_mask) or messages")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--layout", required=True, choices=LAYOUTS)
    p.add_argument("--layers", default="", help="layer ids k (output of layer k), comma-separated")
    p.add_argument("--drafter", default="", help="drafter directory whose config.json names "
                   "the layers")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--chat_template", default="",
                   help="model directory whose chat template renders lines with messages")
    p.add_argument("--tokenizer", default="", help="tokenizer.json (default: the model "
                   "directory's)")
    p.add_argument("--template_flag", action="append", default=[],
                   help="template flag NAME=JSON_VALUE, e.g. enable_thinking=false (repeatable)")
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args(argv)
    try:
        layers = [int(x) for x in a.layers.split(",") if x.strip()] or None
        drafter = (json.loads((Path(a.drafter) / "config.json").read_text())
                   if a.drafter else None)
        template = encode = None
        flags: dict[str, Any] = {}
        if a.chat_template:
            template = ChatTemplate.from_model_dir(a.chat_template)
            encode = tokenizer_encoder(a.tokenizer or Path(a.chat_template) / "tokenizer.json")
        for f in a.template_flag:
            name, _, value = f.partition("=")
            flags[name] = json.loads(value)
        summary = export_features(a.extractor, read_jsonl(a.dataset), a.out, format=a.format,
                                  layout=a.layout, layer_ids=layers, drafter_config=drafter,
                                  dtype=a.dtype, template=template, encode=encode,
                                  template_flags=flags, timeout=a.timeout,
                                  source=str(a.dataset))
    except (ValueError, OSError) as e:
        print(f"export: {e}", file=sys.stderr)
        return 2
    except ExtractorError as e:
        print(f"export: {e}", file=sys.stderr)
        return 1
    left_out = summary.manifest["skipped"]
    print(f"wrote {summary.samples} samples ({summary.tokens} tokens) to {summary.out_dir} "
          f"as {a.format} {a.layout}" + (f"; left out {len(left_out)} ({UNTRAINABLE})"
                                         if left_out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
