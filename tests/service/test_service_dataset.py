"""FeatureDataset against real servers: every item once, in order, with the exact values of the
same requests sent directly; DataLoader workers; a server killed and restarted mid-epoch."""
from __future__ import annotations

import threading

import pytest
import torch
from extractor_harness import random_sequences, wait_for

from specwire_client import (ContractExpectation, ContractMismatch, ExtractorClient,
                             FeatureDataset, RetryPolicy)

LAYERS = [0, 2]
SEQS = random_sequences([3, 8, 5, 12, 7, 4, 9, 6, 11, 2, 10, 5, 7], seed=11)


def reference(address: str, seqs: list[list[int]], per_request: int, **kw) -> list[dict]:
    """The states of each sequence, requested in the same batches as the dataset sends them
    (values depend on the padded batch in the last bits)."""
    out = []
    with ExtractorClient(address, timeout=60) as c:
        for i in range(0, len(seqs), per_request):
            out += [dict(s) for s in c.extract(seqs[i:i + per_request], LAYERS, **kw)]
    return out


def assert_items(items: list[dict], seqs: list[list[int]], ref: list[dict]) -> None:
    assert [it["input_ids"].tolist() for it in items] == seqs
    for i, (it, want) in enumerate(zip(items, ref)):
        assert it["input_ids"].dtype == torch.long
        assert it["hidden_states"].keys() == want.keys()
        for name in want:
            assert torch.equal(it["hidden_states"][name], want[name]), f"item {i} {name}"


def test_dataset_yields_every_item_in_order(fp32_server):
    ref = reference(fp32_server.address, SEQS, 3, dtype="fp32", final_norm=True)
    data = [{"input_ids": s, "id": i} for i, s in enumerate(SEQS)]
    ds = FeatureDataset(fp32_server.address, data, LAYERS, final_norm=True, dtype="fp32",
                        sequences_per_request=3, prefetch_depth=2,
                        expect=ContractExpectation(num_layers=3, hidden_size=64,
                                                   target_layer_ids=LAYERS))
    for _epoch in range(2):
        items = list(ds)
        assert [it["id"] for it in items] == list(range(len(SEQS)))
        assert_items(items, SEQS, [{**r} for r in ref])
    assert ds.retries == 0


def test_dataset_checks_the_contract(fp32_server):
    ds = FeatureDataset(fp32_server.address, SEQS, LAYERS,
                        expect=ContractExpectation(num_layers=36))
    with pytest.raises(ContractMismatch, match="num_layers"):
        next(iter(ds))


def test_dataloader_workers_keep_dataset_order(fp32_server):
    """DataLoader(num_workers=2, batch_size=None): worker w takes items w, w+2, ...; the loader
    alternates workers, so items come out in dataset order (spawned workers: no gRPC state is
    inherited across fork)."""
    ref = reference(fp32_server.address, SEQS[0::2], 2, dtype="bf16")
    ref_odd = reference(fp32_server.address, SEQS[1::2], 2, dtype="bf16")
    merged = [None] * len(SEQS)
    merged[0::2], merged[1::2] = ref, ref_odd
    ds = FeatureDataset(fp32_server.address, SEQS, LAYERS, dtype="bf16",
                        sequences_per_request=2, prefetch_depth=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn")
    items = list(loader)
    assert_items(items, SEQS, merged)


def test_dataset_survives_a_server_kill_and_restart(server_factory, checkpoint):
    """SIGKILL the server mid-epoch, restart it on the same port: every item exactly once, in
    order, values identical; the failed requests were retried."""
    server = server_factory(checkpoint, metrics=False)
    seqs = random_sequences([6 + (i * 5) % 11 for i in range(30)], seed=12)
    ref = reference(server.address, seqs, 2, dtype="fp32")
    ds = FeatureDataset(server.address, seqs, LAYERS, dtype="fp32", sequences_per_request=2,
                        prefetch_depth=1,
                        retry=RetryPolicy(max_retries=30, backoff_initial=0.05,
                                          backoff_multiplier=1.5, backoff_max=0.4), timeout=20)
    items = []
    restarted = threading.Event()

    def restart() -> None:
        # Restarted once the dataset has seen the port closed: the request cut by the kill
        # and at least one retry have failed.
        wait_for(lambda: ds.retries >= 2, 60, "the dataset's retries to fail on the closed port")
        server.start()
        restarted.set()

    for item in ds:
        items.append(item)
        if len(items) == 7:
            # The prefetched batch can still be delivered; what follows needs the new server.
            server.kill()
            threading.Thread(target=restart, daemon=True).start()
    assert restarted.is_set() and server.starts == 2
    assert ds.retries >= 2
    assert_items(items, seqs, ref)
