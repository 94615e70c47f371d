"""FeatureDataset under torchrun: 2 ranks x 2 DataLoader workers read one epoch while the
extractor is SIGKILLed and restarted on the same port; the union of what the ranks saw is the
dataset exactly once and every sample's features equal an Extract of it, bit for bit. A second
run resumes the epoch from a sample offset and sees exactly the rest."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extractor_harness import free_port, random_sequences, wait_for

from specwire_client import ExtractorClient, FeatureDataset

HERE = Path(__file__).resolve().parent
LAYERS = [0, 2]
N = 48


def torchrun() -> list[str]:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def launch(address: str, seqs: Path, out: Path, start: int = 0) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen(
        [*torchrun(), "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={free_port()}",
         str(HERE / "torchrun_features.py"), address, str(seqs), str(out), str(start)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def seen(out: Path) -> list[dict]:
    rows = []
    for f in sorted(out.glob("rank*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def reference_digests(address: str, seqs: list[list[int]]) -> list[dict]:
    out = []
    with ExtractorClient(address, timeout=60) as c:
        for s in seqs:
            states = c.extract([s], LAYERS, final_norm=True, dtype="fp32")[0]
            out.append({k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()
                        for k, v in sorted(states.items())})
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import hf_fixtures  # the faults tier's tiny target
    return hf_fixtures.make_checkpoint("qwen3_gqa2_tied", tmp_path_factory.mktemp("dist-target"))


def test_two_ranks_two_workers_exactly_once_across_a_restart(extractor_factory, checkpoint,
                                                             tmp_path):
    server = extractor_factory(checkpoint, metrics=False)
    seqs = random_sequences([5 + (i * 7) % 13 for i in range(N)], seed=21)
    (tmp_path / "seqs.json").write_text(json.dumps(seqs))
    ref = reference_digests(server.address, seqs)
    out = tmp_path / "run1"
    out.mkdir()
    proc = launch(server.address, tmp_path / "seqs.json", out)
    try:
        wait_for(lambda: len(seen(out)) >= 8 or proc.poll() is not None, 120,
                 "the ranks to read some samples")
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        server.kill()
        at_kill = len(seen(out))
        time.sleep(1.0)
        server.start()
        log, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log[-4000:]
    rows = seen(out)
    indices = sorted(r["sample_index"] for r in rows)
    assert indices == list(range(N)), "not every sample exactly once"
    assert 8 <= at_kill < N, "the kill did not land mid-epoch"
    for r in rows:
        i = r["sample_index"]
        assert r["input_ids"] == seqs[i]
        assert r["digests"] == ref[i], f"sample {i}: features differ from an Extract of it"
    # Both ranks read (a balanced split) and the order was the seeded shuffle.
    per_rank = [len((out / f"rank{k}.jsonl").read_text().splitlines()) for k in range(2)]
    assert per_rank == [N // 2, N // 2]
    order = FeatureDataset(None, seqs, LAYERS, rank=0, world_size=1, shuffle=True, seed=5,
                           epoch=1, client_factory=lambda: None).epoch_order()
    rank0 = [json.loads(x)["sample_index"] for x in (out / "rank0.jsonl").read_text().splitlines()]
    assert rank0 == order[0::2]


def test_resume_from_a_sample_offset_sees_exactly_the_rest(extractor_factory, checkpoint,
                                                           tmp_path):
    server = extractor_factory(checkpoint, metrics=False)
    seqs = random_sequences([4 + (i * 5) % 9 for i in range(30)], seed=8)
    (tmp_path / "seqs.json").write_text(json.dumps(seqs))
    start = 12  # 6 samples per rank consumed before the restart of training
    out = tmp_path / "resumed"
    out.mkdir()
    proc = launch(server.address, tmp_path / "seqs.json", out, start)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-4000:]
    order = FeatureDataset(None, seqs, LAYERS, rank=0, world_size=1, shuffle=True, seed=5,
                           epoch=1, client_factory=lambda: None).epoch_order()
    got = sorted(r["sample_index"] for r in seen(out))
    assert got == sorted(order[start:])
    assert not set(got) & set(order[:start])
