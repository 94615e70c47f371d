"""The dflash oracle for the scorer: tiny drafters in z-lab's format, dflash's own loop, DDTree.

dflash 0.1.0 (`dflash/model.py`) defines the drafter forward (DFlashDraftModel), the drafting
loop (`dflash_generate`) and therefore τ; it runs here under the project's transformers (5.23;
its `transformers` extra pins 4.57.1, which we do not install). The DDTree oracle is a plain
Python transcription of liranringel/ddtree's `build_ddtree_tree` + greedy tree walk.

Everything here is small enough to build inside a test: a 4-layer Qwen3 target (hidden 64,
vocab 512) and 2-layer drafters ([sliding_attention, full_attention]).
"""
from __future__ import annotations

import heapq
import json
import os
import random
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

import dflash.model as dflash_model
from dflash.model import DFlashDraftModel, dflash_generate, extract_context_feature

import hf_fixtures

REPO = Path(__file__).resolve().parents[2]

# dflash's timers call torch.cuda.synchronize(), which raises on a machine without a GPU; its
# return_stats path (the only one that returns acceptance_lengths) needs a CPU clock instead.
dflash_model._cuda_time = time.perf_counter

TARGET = dict(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128,
              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              tie_word_embeddings=False, rope_theta=1_000_000.0,
              # a 10x larger init than the default, so that greedy trajectories move
              initializer_range=0.2)


def replay_binary() -> Path:
    return hf_fixtures.built_binary("services/scorer/specwire-replay")


def eagle_draft(drafter: Path, cases: dict, ends: list[int], block_len: int, out: Path,
                *extra: str, key: str = "draft_logits"):
    """specwire-replay draft on an EAGLE-style case file (case.0.features and case.0.tokens, the
    reference's token after each row): the block of `block_len` after each context end in
    `ends`, as {end: [block_len - 1, Vd]} (`key`: which output of the step), or the failed
    process."""
    from safetensors.torch import load_file, save_file

    meta = {"cases": json.dumps([{"steps": [{"context_end": e, "len": block_len}
                                            for e in ends]}])}
    inp = out.with_suffix(".in.safetensors")
    # The reference's tokens[j] is the token after row j; specwire's are the trajectory itself
    # (row j's next token is trajectory[j + 1]), one longer than the rows.
    nxt = cases["case.0.tokens"]
    traj = torch.cat([torch.zeros(1, dtype=nxt.dtype), nxt]).contiguous()
    save_file({"case.0.features": cases["case.0.features"], "case.0.tokens": traj}, str(inp),
              metadata=meta)
    res = out.with_suffix(".out.safetensors")
    r = subprocess.run([str(replay_binary()), "draft", f"--drafter={drafter}",
                        f"--cases={inp}", f"--out={res}", "--threads=1", *extra],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return r
    got = load_file(str(res))
    return {e: got[f"case.0.step.{j}.{key}"] for j, e in enumerate(ends)}


def run_replay(args: list[str]) -> dict:
    cmd = [str(replay_binary())] + args
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


ORACLES = REPO / ".venv" / "trainer-oracles"


def require_oracles(*packages: str) -> None:
    """Fails the test (not skips it) when a reference package is not installed."""
    missing = [p for p in packages if not (ORACLES / p).is_dir()]
    if missing:
        import pytest
        pytest.fail(f"{' / '.join(missing)} not in .venv/trainer-oracles (scripts/setup.sh "
                    "installs requirements-trainers.txt there)", pytrace=False)


def run_oracle_script(script: str, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """tests/parity/`script` in a subprocess with .venv/trainer-oracles on the path (their pins
    clash with the project's); it must succeed."""
    import sys

    env = dict(os.environ, PYTHONPATH=str(ORACLES), TORCHDYNAMO_DISABLE="1")
    r = subprocess.run([sys.executable, str(Path(__file__).parent / script), *args],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


def assert_refused(r, what: str, words: Sequence[str] = (), code: int | None = None) -> str:
    """A draft run (a dict when it succeeded, else its CompletedProcess) that must have been
    refused: a non-zero exit (`code` when given), no traceback, every word in its message. The
    message."""
    assert not isinstance(r, dict), f"{what} was accepted"
    if code is None:
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    else:
        assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in r.stderr, (what, w, r.stderr[-2000:])
    return r.stderr


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def error_beside_float64(got: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor, tol: float,
                         label: str, failures: list[str]) -> float:
    """`got`'s relative error from the reference's `ref`; past `tol` it counts as 0 when `got` is
    no further from the float64 forward `exact` than 1.5 times the reference is, and otherwise is
    recorded in `failures` under `label`."""
    err = relative(got, ref)
    if err <= tol:
        return err
    ours = relative(got.double(), exact)
    theirs = relative(ref.double(), exact)
    if ours <= 1.5 * theirs + 1e-6:
        return 0.0
    failures.append(f"{label}: {err:.3e} from the reference; from float64 ours {ours:.3e}, the "
                    f"reference's {theirs:.3e}")
    return err


def block_draft(oracle: dict, name: str, drafter: Path, length: int, context: int,
                greedy: bool = False):
    """specwire-replay draft of one block of `length` (the anchor and its drafts) after a
    block-family case's `context`: teacher-forced by the case's tokens, or (greedy) with the
    tokens after the anchor unknown (−1), so the block feeds its own drafts. (process, case,
    outputs or None)."""
    from safetensors.torch import load_file, save_file

    c = load_file(str(oracle["root"] / "out" / f"{name}.cases.safetensors"))
    tokens = c["case.0.tokens"].clone()
    if greedy:
        tokens[context + 1:] = -1
    tag = f"{drafter.name}{'-greedy' if greedy else ''}"
    inp = oracle["root"] / f"{tag}.in.safetensors"
    save_file({"case.0.features": c["case.0.features"], "case.0.tokens": tokens.contiguous()},
              str(inp), metadata={"cases": json.dumps(
                  [{"steps": [{"context_end": context, "len": length}]}])})
    res = oracle["root"] / f"{tag}.out.safetensors"
    r = subprocess.run([str(replay_binary()), "draft", f"--drafter={drafter}",
                        f"--target_checkpoint={oracle['target']}", f"--cases={inp}",
                        f"--out={res}", "--threads=1"], capture_output=True, text=True,
                       timeout=300)
    return r, c, (load_file(str(res)) if r.returncode == 0 else None)


def drafted_variants(oracle: dict, draft, **kw):
    """Every variant of `oracle` drafted by specwire: `draft(oracle, name, its checkpoint, **kw)`
    (a test's own block_draft call) must exit 0. Yields (name, variant, case, outputs)."""
    for name, v in oracle["variants"].items():
        r, c, got = draft(oracle, name, oracle["root"] / "out" / name, **kw)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        yield name, v, c, got


def broken_copy(src: Path, dst: Path, tensors=None, config=None) -> Path:
    """A copy of the checkpoint `src` at `dst`, its model.safetensors edited in place by
    `tensors(dict)` and its config.json by `config(dict)` where given."""
    import shutil
    from safetensors.torch import load_file, save_file

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    if tensors is not None:
        t = load_file(str(dst / "model.safetensors"))
        tensors(t)
        save_file(t, str(dst / "model.safetensors"))
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def error_after_end(logits: torch.Tensor, cases: dict, end: int, tol: float, name: str,
                    failures: list[str]) -> float:
    """The worst relative error of a chain family's drafts after context end `end` (`logits`
    [K, V]) from the reference's ref.end.<end>, each draft checked beside ref64.end.<end>
    (error_beside_float64, failures recorded under `name`)."""
    worst = 0.0
    for k in range(logits.shape[0]):
        ref = cases[f"ref.end.{end}"][k]
        worst = max(worst, error_beside_float64(
            logits[k], ref, cases[f"ref64.end.{end}"][k], tol, f"{name} end {end} draft {k}", failures))
    return worst


def draw_speculators_switches(rng: random.Random, v: dict) -> None:
    """The switches of a random speculators-format EAGLE-3 / P-EAGLE variant `v` beyond its
    sizes, drawn from `rng` into `v`: fc_norm or norm_before_fc (or neither), a sliding window,
    and on Llama layers attention (and MLP) biases."""
    norm = rng.choice(["none", "fc_norm", "norm_before_fc"])
    if norm != "none":
        v[norm] = True
    if rng.random() < 0.4:
        v["window"] = rng.randint(2, 8)
    if v["arch"] == "llama" and rng.random() < 0.3:
        v.update(attention_bias=True, mlp_bias=rng.random() < 0.5)


def seeded_variants(family: str, variants: dict, random_variants, n: int) -> tuple[int, dict]:
    """The fixed `variants` plus `n` drawn by `random_variants(seed, n)`: the seed is the day's
    (printed; SPECWIRE_<FAMILY>_SEED repeats a run). (seed, variants)."""
    key = f"SPECWIRE_{family.upper()}_SEED"
    seed = int(os.environ.get(key, time.strftime("%Y%m%d")))
    print(f"{family} random variants: seed {seed} ({key}={seed} repeats them)")
    return seed, {**variants, **random_variants(seed, n)}


def chain_family_oracle(root: Path, family: str, packages: tuple[str, ...], variants: dict,
                        random_variants, n: int, **spec: Any) -> tuple[Path, dict]:
    """The reference side of a chain family's parity test (MTP, P-EAGLE), run once: the fixed
    `variants` plus `n` seeded random ones, written by tests/parity/<family>_reference.py with
    `spec`'s fields (length, drafts, ...) into `root`. (root, variants)."""
    require_oracles(*packages)
    seed, variants = seeded_variants(family, variants, random_variants, n)
    path = write_json(root / "spec.json", {"out": str(root), "variants": variants, "seed": seed,
                                           **spec})
    run_oracle_script(f"{family}_reference.py", str(path))
    return root, variants


def block_family_oracle(root: Path, family: str, reference: str, variants: dict,
                        random_variants, context: int) -> dict:
    """The reference side of a DFlash-based family's parity test, run once: a tiny target in
    `root`, the fixed `variants` plus six seeded random ones (SPECWIRE_<FAMILY>_SEED repeats a
    day's), and tests/parity/`reference` on them in a subprocess with .venv/trainer-oracles on
    the path (their pins clash with the project's). {"root", "target", "variants"}."""
    target = make_target(root)
    seed, variants = seeded_variants(family, variants, random_variants, 6)
    spec = root / "spec.json"
    spec.write_text(json.dumps({"target": str(target), "out": str(root / "out"),
                                "context": context, "seed": seed, "variants": variants}))
    run_oracle_script(reference, str(spec), timeout=600)
    return {"root": root, "target": target, "variants": variants}


def make_target(out_dir: Path, seed: int = 0, overrides: dict | None = None) -> Path:
    cfg = dict(TARGET)
    cfg.update(overrides or {})
    return hf_fixtures.make_checkpoint("dflash_target", out_dir, seed=seed, overrides=cfg)


def drafter_config(target: transformers.PretrainedConfig, *, block_size: int,
                   target_layer_ids: list[int], layer_types: list[str], sliding_window: int,
                   mask_token_id: int | None = None, rope_scaling: dict | None = None,
                   initializer_range: float = 0.02) -> transformers.Qwen3Config:
    """A drafter config as z-lab publishes them (Qwen3 layers + dflash_config)."""
    cfg = transformers.Qwen3Config(
        vocab_size=target.vocab_size, hidden_size=target.hidden_size,
        intermediate_size=2 * target.hidden_size, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        max_position_embeddings=4096, rope_theta=1_000_000.0, layer_types=layer_types,
        use_sliding_window=True, sliding_window=sliding_window, tie_word_embeddings=False,
        initializer_range=initializer_range, block_size=block_size,
        num_target_layers=target.num_hidden_layers,
        dflash_config={"mask_token_id": (target.vocab_size - 1 if mask_token_id is None
                                         else mask_token_id),
                       "target_layer_ids": target_layer_ids})
    if rope_scaling is not None:
        cfg.rope_parameters = dict(rope_scaling, rope_theta=1_000_000.0)
    cfg.architectures = ["DFlashDraftModel"]
    return cfg


def new_drafter(config: transformers.Qwen3Config, seed: int, perturb: bool = True) -> DFlashDraftModel:
    torch.manual_seed(seed)
    model = DFlashDraftModel(config).float()
    if perturb:  # norms at 1 would hide their handling
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def save_drafter(model: DFlashDraftModel, out: Path, zlab_rope: dict | None = None) -> Path:
    """save_pretrained, then config.json rewritten in z-lab's published style (rope_theta +
    rope_scaling at the top level, as in z-lab/Qwen3-8B-DFlash-b16) when zlab_rope is given
    (use {} for rope_scaling null)."""
    model.save_pretrained(out, safe_serialization=True)
    if zlab_rope is not None:
        path = out / "config.json"
        cfg = json.loads(path.read_text())
        params = cfg.pop("rope_parameters", None) or {}
        cfg["rope_theta"] = params.get("rope_theta", 1_000_000.0)
        cfg["rope_scaling"] = zlab_rope or None
        path.write_text(json.dumps(cfg, indent=2))
    return out


def load_drafter(path: Path) -> DFlashDraftModel:
    return DFlashDraftModel.from_pretrained(path, dtype=torch.float32).eval()


def hf_target(path: Path) -> transformers.PreTrainedModel:
    return hf_fixtures.load_hf_model(path, torch.float32)


# --- dflash's draft step, exactly as dflash_generate runs it -----------------------------------

@torch.inference_mode()
def dflash_draft_steps(drafter: DFlashDraftModel, target, features: torch.Tensor,
                       steps: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Runs dflash's drafting code path for a sequence of steps sharing one draft cache.

    features: [T, n*H] context features of positions [0, T). Each step {context_end, anchor,
    len} feeds the context rows not yet in the cache, drafts the block [anchor, MASK x (len-1)]
    at positions [context_end, context_end + len) and crops the cache back to context_end, as
    dflash_generate does. Returns (final hidden states [len, H], logits [len-1, V]) per step.
    """
    cache = dflash_model._make_cache(drafter.config)
    mask = drafter.mask_token_id
    B = drafter.block_size
    position_ids = torch.arange(features.shape[0] + 2 * B).unsqueeze(0)
    cached = 0
    out = []
    for step in steps:
        start, length = step["context_end"], step.get("len") or B
        target_hidden = features[cached:start].unsqueeze(0)
        block = torch.full((1, length), mask, dtype=torch.long)
        block[0, 0] = step["anchor"]
        noise = dflash_model._raw_input_embeddings(target, block)
        hidden = drafter(target_hidden=target_hidden, noise_embedding=noise,
                         position_ids=position_ids[:, start - target_hidden.shape[1]:start + length],
                         past_key_values=cache, use_cache=True)
        dflash_model._crop_to(cache, start)
        cached = start
        logits = drafter.compute_logits(hidden[:, 1 - length:, :], dflash_model._output_head(target))
        out.append((hidden[0].float(), logits[0].float()))
    return out


def dflash_reference(drafter: DFlashDraftModel, target, prompt: list[int], max_new_tokens: int,
                     stop: list[int] | None) -> tuple[list[int], list[int]]:
    """dflash's own greedy loop: (completion tokens, acceptance_lengths per step)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    res = dflash_generate(drafter, target, ids, max_new_tokens, stop, temperature=0.0,
                          return_stats=True)
    return res.output_ids[0, len(prompt):].tolist(), list(res.acceptance_lengths)


@torch.inference_mode()
def context_features(target, drafter: DFlashDraftModel, sequence: list[int]) -> torch.Tensor:
    """dflash's extract_context_feature on one transformers forward over the whole sequence."""
    out = target(torch.tensor([sequence]), output_hidden_states=True, use_cache=False)
    return extract_context_feature(out.hidden_states, drafter.target_layer_ids)[0].float()


# --- DDTree: a plain transcription of the algorithm -------------------------------------------

def topk_rows(log_probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row the k best (value, token), equal values ranked by the lower token id."""
    k = min(k, log_probs.shape[1])
    ids = np.arange(log_probs.shape[1])
    # lexsort: the last key is the primary one (value descending), then the token id.
    tokens = np.stack([np.lexsort((ids, -row))[:k] for row in log_probs])
    values = np.take_along_axis(log_probs, tokens, axis=1).astype(np.float64)
    return values, tokens


def ddtree_accepted(log_probs: np.ndarray, truth: list[int], budget: int) -> int:
    """Accepted draft tokens of DDTree with `budget` non-root nodes (ddtree's build_ddtree_tree:
    best-first heap over prefixes, score = sum of per-position log-probs; greedy walk)."""
    depth_limit = log_probs.shape[0]
    if budget <= 0 or depth_limit == 0:
        return 0
    lp, tok = topk_rows(log_probs.astype(np.float32), budget)
    k = lp.shape[1]
    heap = [(-lp[0, 0], (0,), 0, 1, 0, lp[0, 0])]
    children: list[dict[int, int]] = [{}]
    nodes = 0
    while heap and nodes < budget:
        _, ranks, parent, depth, rank, logw = heapq.heappop(heap)
        current = nodes + 1
        children.append({})
        children[parent][int(tok[depth - 1, rank])] = current
        nodes += 1
        if rank + 1 < k:
            w = logw - lp[depth - 1, rank] + lp[depth - 1, rank + 1]
            heapq.heappush(heap, (-w, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, w))
        if depth < depth_limit:
            w = logw + lp[depth, 0]
            heapq.heappush(heap, (-w, ranks + (0,), current, depth + 1, 0, w))
    node, accepted = 0, 0
    while accepted < depth_limit and accepted < len(truth) and truth[accepted] in children[node]:
        node = children[node][truth[accepted]]
        accepted += 1
    return accepted


@torch.inference_mode()
def reference_replay(drafter: DFlashDraftModel, target, trajectory: list[int], prompt_len: int,
                     max_length: int, ddtree_budget: int = 0) -> list[int]:
    """The greedy replay loop on dflash's drafter code path, with DFlash (budget 0) or DDTree
    acceptance: the same loop as dflash_generate (block shortened near max_length, the last step
    cut at the trajectory's end), with the target's verification replaced by the trajectory."""
    features = context_features(target, drafter, trajectory)
    T, B = len(trajectory), drafter.block_size
    mask = drafter.mask_token_id
    cache = dflash_model._make_cache(drafter.config)
    position_ids = torch.arange(max_length + B).unsqueeze(0)
    head = dflash_model._output_head(target)
    start, cached, lengths = prompt_len, 0, []
    while start + 1 < T:
        length = min(B, max_length - start)
        target_hidden = features[cached:start].unsqueeze(0)
        block = torch.full((1, length), mask, dtype=torch.long)
        block[0, 0] = trajectory[start]
        noise = dflash_model._raw_input_embeddings(target, block)
        hidden = drafter(target_hidden=target_hidden, noise_embedding=noise,
                         position_ids=position_ids[:, cached:start + length],
                         past_key_values=cache, use_cache=True)[:, 1 - length:, :]
        dflash_model._crop_to(cache, start)
        cached = start
        logits = drafter.compute_logits(hidden, head)[0].float()
        truth = [trajectory[start + k] if start + k < T else -1 for k in range(1, length)]
        if ddtree_budget <= 0:
            drafts = torch.argmax(logits, dim=-1).tolist()
            a = 0
            while a < length - 1 and drafts[a] == truth[a]:
                a += 1
        else:
            log_probs = (logits - torch.logsumexp(logits, dim=-1, keepdim=True)).numpy()
            a = ddtree_accepted(log_probs, truth, ddtree_budget)
        produced = min(a + 1, T - 1 - start)
        lengths.append(produced)
        start += produced
    return lengths


# --- A drafter that predicts something: trained on the target's own greedy outputs ------------

def _block_masks(config, T: int, anchors: list[int], B: int) -> list[torch.Tensor]:
    """Per drafter layer, the bool mask [Q, T + Q] (True = visible) of all blocks of one
    sequence at once: block j (anchor a_j) sees context rows < a_j (within the window on sliding
    layers) and its own block (causally on causal layers); never other blocks."""
    Q = len(anchors) * B
    q_pos = torch.tensor([a + i for a in anchors for i in range(B)])
    q_anchor = torch.tensor([a for a in anchors for _ in range(B)])
    q_block = torch.arange(Q) // B
    q_slot = torch.arange(Q) % B
    ctx_pos = torch.arange(T)
    masks = []
    for layer_type in config.layer_types:
        sliding = layer_type == "sliding_attention"
        window = config.sliding_window if sliding else None
        ctx = ctx_pos[None, :] < q_anchor[:, None]
        if window is not None:
            ctx &= (q_pos[:, None] - ctx_pos[None, :]) < window
        blk = q_block[:, None] == q_block[None, :]
        if sliding:  # dflash: sliding layers are causal without an is_causal key
            blk &= q_slot[None, :] <= q_slot[:, None]
            if window is not None:
                blk &= (q_slot[:, None] - q_slot[None, :]) < window
        masks.append(torch.cat([ctx, blk], dim=1)[None, None])
    return masks


def train_drafter(drafter: DFlashDraftModel, target, sequences: list[list[int]], prompt_len: int,
                  steps: int = 300, anchors_per_seq: int = 8, batch: int = 4, lr: float = 3e-3,
                  seed: int = 0) -> list[float]:
    """A few hundred AdamW steps of DFlash's training objective (SpecForge-style: random
    anchors, block [x_a, MASK...], context = target features of positions < a, labels x_{a+k})
    on the target's greedy trajectories. Embedding and lm_head are the target's, frozen."""
    g = torch.Generator().manual_seed(seed)
    B = drafter.block_size
    T = len(sequences[0])
    with torch.no_grad():
        feats = torch.stack([context_features(target, drafter, s) for s in sequences])
    tokens = torch.tensor(sequences)
    embed = target.get_input_embeddings().weight.detach()
    head = target.lm_head.weight.detach()
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        rows = torch.randint(0, len(sequences), (batch,), generator=g).tolist()
        inputs, labels, positions, masks = [], [], [], []
        for r in rows:
            anchors = torch.randint(prompt_len, T - 1, (anchors_per_seq,), generator=g).tolist()
            block = torch.full((anchors_per_seq, B), drafter.mask_token_id)
            block[:, 0] = tokens[r, anchors]
            lab = torch.full((anchors_per_seq, B), -100)
            for j, a in enumerate(anchors):
                n = min(B, T - a)
                lab[j, 1:n] = tokens[r, a + 1:a + n]
            inputs.append(block.reshape(-1))
            labels.append(lab.reshape(-1))
            positions.append(torch.cat([torch.arange(T),
                                        torch.tensor([a + i for a in anchors for i in range(B)])]))
            masks.append(_block_masks(drafter.config, T, anchors, B))
        noise = torch.nn.functional.embedding(torch.stack(inputs), embed)
        pos = torch.stack(positions)
        layer_masks = [torch.cat([m[i] for m in masks]) for i in range(len(drafter.layers))]
        h = noise
        ctx = drafter.hidden_norm(drafter.fc(feats[rows]))
        pe = drafter.rotary_emb(h, pos)
        for i, layer in enumerate(drafter.layers):
            h = layer(hidden_states=h, target_hidden=ctx, attention_mask=layer_masks[i],
                      position_embeddings=pe)
        logits = torch.nn.functional.linear(drafter.norm(h), head)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.stack(labels).reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    drafter.eval()
    return losses


@torch.inference_mode()
def hf_trajectories(target, prompts: torch.Tensor, max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy generate of a [N, T] batch of prompts, exactly max_new_tokens each
    (no stop token): the trajectories a drafter is trained on."""
    return target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                           max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                           eos_token_id=None, pad_token_id=0).tolist()


def seen_pair(hf, prompt_len: int, max_new_tokens: int, block: int, target_layer_ids,
              g: torch.Generator):
    """The start of a trained pair: 8 random prompts (ids < 500) drawn from g, their greedy
    trajectories and a fresh 2-layer drafter (a sliding layer, window 12, then a full one) of
    that block size, to train on them."""
    seen = torch.randint(0, 500, (8, prompt_len), generator=g)
    sequences = hf_trajectories(hf, seen, max_new_tokens)
    cfg = drafter_config(hf.config, block_size=block, target_layer_ids=target_layer_ids,
                         layer_types=["sliding_attention", "full_attention"], sliding_window=12)
    return seen, sequences, new_drafter(cfg, seed=1, perturb=False)


@torch.inference_mode()
def greedy_batch(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy trajectories (prompt + completion, no stop token) of equal-length prompts, batched."""
    ids = torch.tensor(prompts)
    for _ in range(max_new_tokens):
        logits = target(ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids.tolist()


def greedy_aux_data(root: Path, seed: int, prompt_len: int, max_new_tokens: int) -> tuple:
    """The data of an EAGLE-style replay test: a tiny random target in `root`, six prompts of
    `prompt_len` random tokens (random.Random(seed)), their greedy trajectories and the target's
    states at aux_ids [1, 2, 3] (HF hidden_states indices: layers 0, 1, 2 before the final norm)
    in root/data.safetensors (save_aux_data). (target dir, prompts, trajectories, aux_ids)."""
    target_dir = make_target(root)
    hf = hf_target(target_dir)
    rng = random.Random(seed)
    prompts = [[rng.randrange(500) for _ in range(prompt_len)] for _ in range(6)]
    aux_ids = [1, 2, 3]
    with torch.no_grad():
        trajs = greedy_batch(hf, prompts, max_new_tokens)
        hs = hf(torch.tensor(trajs), output_hidden_states=True).hidden_states
    save_aux_data(root / "data.safetensors", trajs, hs, aux_ids)
    return target_dir, prompts, trajs, aux_ids


def save_aux_data(path: Path, trajectories: list[list[int]], states, aux_ids: list[int]) -> Path:
    """An EAGLE-style replay's data file (eagle3_reference.py replay): traj.{i}, the trajectory
    [T_i], and aux.{i}, states[k][i] of every k in `aux_ids` concatenated [T_i, A·H]."""
    from safetensors.torch import save_file

    data = {}
    for i, t in enumerate(trajectories):
        data[f"traj.{i}"] = torch.tensor(t, dtype=torch.int64)
        data[f"aux.{i}"] = torch.cat([states[k][i] for k in aux_ids], -1).contiguous()
    save_file(data, str(path))
    return path


def assert_chain_replay(ours: dict, ref: dict, trajectories: list[list[int]], prompt_len: int,
                        what: Any = None) -> tuple[list, list[int]]:
    """specwire-replay's replay `ours` against the replay `ref` written on a chain family's
    reference package: the completions are the trajectories' (past `prompt_len`), the step
    lengths the reference's, some long and some one token (the check has power); `what` labels a
    failure. (step lengths per response, every step length)."""
    assert [r["completion"] for r in ours["responses"]] == \
        [t[prompt_len:] for t in trajectories], what
    got = [r["step_lengths"] for r in ours["responses"]]
    assert got == ref["step_lengths"], (what, got, ref["step_lengths"])
    flat = [a for steps in got for a in steps]
    assert max(flat) >= 3 and min(flat) == 1, (what, flat)
    return got, flat


def assert_replays_as_reference(got: list, reference: list, backbone: list, family: str) -> None:
    """A family's replay (step lengths per response) against the replay written on its reference
    package: the same steps; not the steps of its backbone alone (the family's own part changed
    drafts); some steps long, some one token (the check has power). Prints the τ."""
    assert got == reference
    assert got != backbone, f"{family}: the same steps as the backbone alone"
    flat = [a for steps in got for a in steps]
    assert max(flat) >= 3 and min(flat) == 1, flat
    print(f"{family} replay: tau {sum(flat) / len(flat):.3f} over {len(flat)} steps")


def write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path
