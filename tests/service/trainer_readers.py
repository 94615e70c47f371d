"""Reads specwire's exported datasets with SpecForge's and speculators' own readers, and runs a
few training steps of their model code on what they read. Run with .venv/trainer-oracles on
PYTHONPATH (their packages stay out of the test process):

    python trainer_readers.py ROOT TARGET_DIR DFLASH_DRAFTER_DIR OUT.json

ROOT holds specforge-dflash/, specforge-eagle3/, speculators-dflash/, speculators-eagle3/.
OUT.json gets, per export, the sha256 of every tensor each reader returned for each sample (in
the reader's own names, after its own normalisation), the training losses, and the largest
difference between the target's logits computed from the exported final states by the trainer's
own head and transformers' logits.
"""
from __future__ import annotations

import glob
import hashlib
import json
import sys
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")
torch.manual_seed(0)
torch.set_num_threads(1)

ROOT, TARGET, DRAFTER, OUT = (Path(a) for a in sys.argv[1:5])


def digest(t: torch.Tensor) -> str:
    return f"{t.dtype}:{list(t.shape)}:" + hashlib.sha256(
        t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def hf_logits(ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return HF(ids.reshape(1, -1)).logits[0]


from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

HF = AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()
report: dict[str, dict] = {}

# --- SpecForge ---------------------------------------------------------------------------------
from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel  # noqa: E402
from specforge.data.preprocessing import (build_offline_eagle3_dataset,  # noqa: E402
                                          process_offline_dflash_sample)
from specforge.modeling.draft.dflash import DFlashDraftModel  # noqa: E402
from specforge.runtime.data_plane.feature_store import load_feature_file  # noqa: E402
from specforge.runtime.data_plane.offline_reader import OfflineManifestReader  # noqa: E402

refs = OfflineManifestReader(str(ROOT / "specforge-dflash"), strategy="dflash",
                             feature_keys=("input_ids", "loss_mask", "hidden_states"),
                             validate_files=True).read()
samples = [process_offline_dflash_sample(load_feature_file(r.feature_store_uri[len("file://"):]),
                                         4096) for r in refs]
cfg = AutoConfig.from_pretrained(str(DRAFTER))
cfg._attn_implementation = "sdpa"
draft = DFlashDraftModel(cfg).float()
model = OnlineDFlashModel(draft, HF.lm_head, HF.model.embed_tokens,
                          mask_token_id=cfg.dflash_config["mask_token_id"], block_size=4,
                          attention_backend="sdpa", num_anchors=8)
for p in HF.parameters():
    p.requires_grad_(False)
opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-3)
losses = []
trainable = [s for s in samples if int((s["loss_mask"][0, :-1] * s["loss_mask"][0, 1:]).sum()) > 0]
for s in trainable[:3]:
    loss, _, _ = model(input_ids=s["input_ids"], hidden_states=s["hidden_states"].float(),
                       loss_mask=s["loss_mask"])
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(float(loss))
report["specforge-dflash"] = {
    "files": [Path(r.feature_store_uri).name for r in refs],
    "specs": [{k: [v.dtype, list(v.shape)] for k, v in r.feature_specs.items()} for r in refs],
    "tensors": [{k: digest(v) for k, v in s.items()} for s in samples],
    "losses": losses}

ds = build_offline_eagle3_dataset(str(ROOT / "specforge-eagle3"), max_len=4096)
items = [ds[i] for i in range(len(ds))]
# SpecForge's TargetHead is a bare lm_head over the stored hidden_state.
head = torch.nn.Linear(HF.config.hidden_size, HF.config.vocab_size, bias=False)
head.weight.data.copy_(HF.lm_head.weight.data)
worst = 0.0
for it in items:
    with torch.no_grad():
        got = head(it["target"][0].float())
    worst = max(worst, float((got - hf_logits(it["input_ids"])).abs().max()))
report["specforge-eagle3"] = {"tensors": [{k: digest(v) for k, v in it.items()} for it in items],
                              "logits_max_abs_diff": worst}

# --- speculators -------------------------------------------------------------------------------
from speculators.models.eagle3.core import Eagle3DraftModel  # noqa: E402
from speculators.models.eagle3.data import shift_batch  # noqa: E402
from speculators.train.data import ArrowDataset, CollateFn  # noqa: E402

for layout in ("dflash", "eagle3"):
    d = ArrowDataset(4096, str(ROOT / f"speculators-{layout}"), on_missing="raise")
    rows = [d[i] for i in range(len(d))]
    report[f"speculators-{layout}"] = {
        "tensors": [{k: digest(v) for k, v in r.items()} for r in rows],
        "approx_lengths": list(map(int, d.approx_lengths))}

manifest = json.loads((ROOT / "speculators-eagle3" / "specwire_export.json").read_text())
aux = manifest["format_layers"]["eagle_aux_hidden_state_layer_ids"]
vc = AutoConfig.from_pretrained(str(TARGET))
vc.num_hidden_layers = 1
drafter = Eagle3DraftModel.from_training_args(
    vc, verifier_name_or_path=str(TARGET), target_layer_ids=aux,
    draft_vocab_size=vc.vocab_size, norm_before_residual=True, ttt_steps=3, draft_attn_impl="sdpa",
    loss_fn="kl_div")
kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(ttt_steps=3, ttt_step_loss_decay=1.0,
                                                loss_fn="kl_div", loss_implementation="eager")
d = ArrowDataset(4096, str(ROOT / "speculators-eagle3"), on_missing="raise")
worst = 0.0
for i in range(len(d)):
    r = d[i]
    with torch.no_grad():
        got = drafter.verifier_lm_head(drafter.verifier_norm(r["verifier_last_hidden_states"].float()))
    worst = max(worst, float((got - hf_logits(r["input_ids"])).abs().max()))
collate = CollateFn(512, vc.hidden_size, len(aux), dtype=torch.float32, preprocess=shift_batch)
opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-3)
losses = []
for step in range(3):
    b = collate([d[(2 * step) % len(d)], d[(2 * step + 1) % len(d)]])
    _, loss, _ = drafter(hidden_states=b["hidden_states"], input_ids=b["input_ids"],
                         document_ids=b["document_ids"], loss_mask=b["loss_mask"],
                         position_ids=b["position_ids"],
                         verifier_last_hidden_states=b["verifier_last_hidden_states"], **kwargs)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(float(loss))
report["speculators-eagle3"].update({"losses": losses, "logits_max_abs_diff": worst})
report["files"] = sorted(str(Path(p).relative_to(ROOT)) for p in glob.glob(str(ROOT / "*" / "*")))
OUT.write_text(json.dumps(report))
