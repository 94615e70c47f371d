"""One rank of the exactly-once check (tests/faults/test_distributed_features.py), started by
torchrun: FeatureDataset sharded over this rank and 2 DataLoader workers, every item's dataset
index and a digest of its feature bytes written to OUT/rank<r>.jsonl as it is consumed (the
test kills and restarts the extractor while the ranks read).

    torchrun --nproc_per_node 2 torchrun_features.py ADDRESS SEQS.json OUT [START]
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from specwire_client import FeatureDataset, RetryPolicy, pad_collate

LAYERS = [0, 2]


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def main() -> None:
    address, seqs_path, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    start = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    seqs = json.loads(seqs_path.read_text())
    ds = FeatureDataset(address, seqs, LAYERS, final_norm=True, dtype="fp32",
                        sequences_per_request=2, prefetch_depth=1, shuffle=True, seed=5,
                        epoch=1, start=start, timeout=30,
                        retry=RetryPolicy(max_retries=200, backoff_initial=0.05,
                                          backoff_multiplier=1.5, backoff_max=0.5))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    log = open(out / f"rank{dist.get_rank()}.jsonl", "a")
    for item in loader:
        states = item["hidden_states"]
        log.write(json.dumps({"sample_index": item["sample_index"],
                              "input_ids": item["input_ids"].tolist(),
                              "digests": {k: digest(v) for k, v in sorted(states.items())}})
                  + "\n")
        log.flush()
        time.sleep(0.02)  # a trainer's step: the kill lands mid-epoch
    # The collate on this rank's items: batched, padded, masks.
    batch = pad_collate([item for item, _ in zip(ds, range(2))])
    assert batch["input_ids"].shape[0] == 2 and batch["attention_mask"].sum() > 0
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
