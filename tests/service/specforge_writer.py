"""SpecForge's own writer on the CPU: the features of its online capture (EAGLE-3: hidden_state =
the aux layers concatenated, target = the final-norm state, as its target_repr "hidden_state";
DFlash: hidden_states) computed by transformers, checked by SpecForge's verify_capture against the
CaptureConfig its strategies declare, and written by its LocalFeatureStore's dump_dir, the files
an online rollout leaves. Only the engine that computes the states differs (SGLang on a GPU in a
real run). Run with .venv/trainer-oracles on PYTHONPATH:

    python specforge_writer.py TARGET_DIR SEQUENCES.json OUT_DIR AUX_IDS

AUX_IDS are SpecForge's (id k: the output of layer k, hidden_states[k + 1]). OUT_DIR gets
eagle3/ and dflash/, one .ckpt per sequence.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from specforge.inference.capture import CaptureConfig, verify_capture
from specforge.runtime.data_plane.feature_store import LocalFeatureStore
from specforge.training.strategies.base import DFlashTrainStrategy, Eagle3TrainStrategy

target, seqs_path, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
aux_ids = tuple(int(x) for x in sys.argv[4].split(","))
model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
hidden = model.config.hidden_size
stores = {"eagle3": LocalFeatureStore(dump_dir=str(out / "eagle3")),
          "dflash": LocalFeatureStore(dump_dir=str(out / "dflash"))}
captures = {
    "eagle3": CaptureConfig.from_strategy(Eagle3TrainStrategy.required_features, aux_ids,
                                          target_repr="hidden_state",
                                          target_hidden_size=hidden),
    "dflash": CaptureConfig.from_strategy(DFlashTrainStrategy.required_features, aux_ids,
                                          target_repr=None, target_hidden_size=hidden),
}
for i, seq in enumerate(json.loads(seqs_path.read_text())):
    ids = torch.tensor([seq])
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    aux = torch.cat([hs[k + 1] for k in aux_ids], -1)
    common = {"input_ids": ids, "loss_mask": torch.ones_like(ids)}
    feats = {
        "eagle3": common | {"attention_mask": torch.ones_like(ids), "hidden_state": aux,
                            "target": hs[-1]},
        "dflash": common | {"hidden_states": aux},
    }
    for kind, store in stores.items():
        sample_id = f"sample{i:04d}"
        verify_capture(feats[kind], captures[kind], sample_id=sample_id,
                       recorded_aux_layer_ids=aux_ids)
        store.put(feats[kind], sample_id=sample_id,
                  metadata={"strategy": kind, "num_tokens": len(seq),
                            "target_repr": captures[kind].target_repr})
print(json.dumps({k: len(list((out / k).glob("*.ckpt"))) for k in stores}))
