"""Live verification sessions (Extractor.Session) in a real specwire-extractor.

- Greedy sessions whose drafts are the target's own completion accept every draft and emit the
  completion Generate gives (dense and hybrid targets, fp32 and bf16).
- Rollback over the wire: after random drafts and partial commits, the next verification's
  states and target tokens equal, bit for bit, those of a fresh session that was only ever sent
  the committed tokens in the same blocks (dense and hybrid, greedy and sampled).
- Draws are seeded: the same seed and calls give the same answers; another seed other ones.
- Bad input: every refusal names its field and has the right code, and the session goes on
  exactly as a twin session that never saw the refused calls.
- Bounds: --max_sessions (RESOURCE_EXHAUSTED, freed when a stream ends by close, cancel or
  deadline), --session_idle_seconds (DEADLINE_EXCEEDED), --max_session_tokens.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import grpc
import pytest
import torch

import hybrid_fixtures as H  # noqa: E402  (tests/parity, on sys.path via extractor_harness)
from extractor_harness import metric_sum, wait_for, wait_for_metric
from specwire_client import ExtractorClient, ExtractorError

VOCAB = 512
LAYERS = [0, 2]


@pytest.fixture(scope="module")
def hybrid_checkpoint(tmp_path_factory) -> Path:
    return H.save_text(H.random_causal_lm("interval4", seed=5),
                       tmp_path_factory.mktemp("hybrid-live") / "interval4")


@pytest.fixture(scope="module")
def servers(server_factory, checkpoint, hybrid_checkpoint):
    return {("dense", "float32"): server_factory(checkpoint, dtype="float32"),
            ("hybrid", "float32"): server_factory(hybrid_checkpoint, dtype="float32"),
            ("dense", "bfloat16"): server_factory(checkpoint, dtype="bfloat16")}


def states_equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs (|Δ| {(a[k] - b[k]).abs().max()})"


@pytest.mark.parametrize("target,compute", [("dense", "float32"), ("hybrid", "float32"),
                                            ("dense", "bfloat16")])
def test_greedy_drafts_of_the_completion_reproduce_generate(servers, target, compute):
    server = servers[(target, compute)]
    g = random.Random(11)
    with ExtractorClient(server.address, timeout=120) as c:
        for case in range(3):
            prompt = [g.randrange(VOCAB) for _ in range(g.randint(1, 40))]
            want = c.generate([prompt], 30, ignore_model_eos=True)[0].completion_ids
            with c.session(prompt, LAYERS, dtype="fp32", max_new_tokens=40,
                           max_draft_tokens=7) as s:
                assert s.prompt_states["layer.0"].shape[0] == len(prompt)
                got = [s.next_token]
                step = 0
                while len(got) < 30:
                    k = min(g.randint(0, 7), 30 - len(got))
                    truth = want[len(got):len(got) + k]
                    step += 1
                    if step % 3 == 2 and k:
                        # A tree: a wrong sibling before each right node (nodes count as drafts).
                        k = min(k, 3)
                        truth = truth[:k]
                        tokens, parents = [], []
                        for t in truth:
                            parent = len(tokens) - 1 if tokens else -1
                            tokens += [(t + 1) % VOCAB, t]
                            parents += [parent, parent]
                        v = s.verify(tokens, parents=parents)
                        assert v.rule == "tree" and v.path == [2 * i + 1 for i in range(k)]
                    else:
                        v = s.verify(truth, commit=step % 3 == 0)
                        assert v.rule == "argmax_draft"
                    assert v.accepted == k, f"case {case}: the completion's drafts were refused"
                    assert v.accepted_tokens == truth
                    assert v.states["layer.2"].shape[0] == k + 1
                    if v.committed is None:
                        s.commit(v.accepted)
                    assert s.next_token == v.next_token
                    got += v.accepted_tokens + [v.next_token]
                assert got[:30] == want, f"{target} {compute} case {case}"


@pytest.mark.parametrize("target,compute", [("dense", "float32"), ("hybrid", "float32"),
                                            ("dense", "bfloat16")])
def test_rollback_leaves_the_state_of_the_committed_tokens(servers, target, compute):
    """Session a gets drafts (the target's greedy continuation, often corrupted) and commits a
    random part of what was accepted; session b is sent only what a committed, as whole blocks.
    Their next blocks must then agree bit for bit: a rolled back to exactly b's state."""
    server = servers[(target, compute)]
    g = random.Random(f"{target}-{compute}")
    opts = dict(dtype="fp32", max_new_tokens=80, max_draft_tokens=8)
    partial = 0
    with ExtractorClient(server.address, timeout=300) as c:
        for case in range(2):
            prompt = [g.randrange(VOCAB) for _ in range(g.randint(1, 80))]
            with c.session(prompt, LAYERS, **opts) as a, c.session(prompt, LAYERS, **opts) as b:
                states_equal(a.prompt_states, b.prompt_states, "prompt")
                sequence = prompt + [a.next_token]
                for step in range(8):
                    k = g.randint(0, 8)
                    draft = c.generate([sequence], k, ignore_model_eos=True)[0].completion_ids \
                        if k else []
                    if k and g.random() < 0.6:
                        draft[g.randrange(k)] = g.randrange(VOCAB)
                    va = a.verify(draft)
                    n = g.randint(0, va.accepted)
                    a.commit(n)
                    partial += n < k
                    vb = b.verify(draft[:n])
                    assert vb.accepted == n, f"step {step}: b refused a's committed drafts"
                    assert vb.target_argmax == va.target_argmax[:n + 1]
                    for name, t in vb.states.items():
                        assert torch.allclose(t, va.states[name][:n + 1], rtol=1e-2, atol=1e-2)
                    b.commit(n)
                    assert a.next_token == b.next_token
                    sequence += draft[:n] + [a.next_token]
                    # The next block: identical on both, bit for bit.
                    probe = [g.randrange(VOCAB) for _ in range(3)]
                    pa, pb = a.verify(probe), b.verify(probe)
                    assert pa.target_argmax == pb.target_argmax
                    assert (pa.accepted, pa.next_token) == (pb.accepted, pb.next_token)
                    states_equal(pa.states, pb.states, f"{target} {compute} step {step}")
                    # Committing none of it still commits the pending token.
                    a.commit(0)
                    b.commit(0)
                    assert a.next_token == b.next_token
                    sequence.append(a.next_token)
    assert partial > 2


def test_draws_follow_the_seed(servers):
    server = servers[("hybrid", "float32")]
    prompt = list(range(1, 20))

    def run(seed: int) -> list:
        with ExtractorClient(server.address, timeout=60) as c, \
                c.session(prompt, [], temperature=1.0, seed=seed, max_new_tokens=64) as s:
            out = [s.next_token]
            for _ in range(6):
                v = s.verify([7, 8, 9])
                s.commit(v.accepted)
                out += v.accepted_tokens + [v.next_token]
            return out

    assert run(5) == run(5)
    assert run(5) != run(6)


def expect_refused(call, code: grpc.StatusCode, *fields: str) -> None:
    with pytest.raises(ExtractorError) as e:
        call()
    assert e.value.code == code, e.value
    for f in fields:
        assert f in e.value.details, e.value


def test_refused_calls_name_their_field_and_change_nothing(servers):
    server = servers[("hybrid", "float32")]
    opts = dict(dtype="fp32", max_new_tokens=20, max_draft_tokens=4, temperature=0.8, seed=9)
    prompt = [5, 6, 7, 8]
    with ExtractorClient(server.address, timeout=60) as c, \
            c.session(prompt, LAYERS, **opts) as a, c.session(prompt, LAYERS, **opts) as b:
        g = random.Random(2)
        for step in range(4):
            draft = [g.randrange(VOCAB) for _ in range(3)]
            expect_refused(lambda: b.commit(0), grpc.StatusCode.FAILED_PRECONDITION, "commit")
            expect_refused(lambda: b.verify([1, VOCAB + 3]), grpc.StatusCode.INVALID_ARGUMENT,
                           "verify.draft_tokens[1]", str(VOCAB + 3))
            expect_refused(lambda: b.verify([-1]), grpc.StatusCode.INVALID_ARGUMENT,
                           "verify.draft_tokens[0]")
            expect_refused(lambda: b.verify([1] * 5), grpc.StatusCode.INVALID_ARGUMENT,
                           "verify.draft_tokens", "max_draft_tokens")
            expect_refused(lambda: b.verify([1, 2], parents=[-1, 3]),
                           grpc.StatusCode.INVALID_ARGUMENT, "verify.parents[1]")
            expect_refused(lambda: b.verify([1, 2], parents=[-1]),
                           grpc.StatusCode.INVALID_ARGUMENT, "verify.parents")
            expect_refused(lambda: b.verify([1, 2], rule="draft_distribution",
                                            draft_probs=torch.full((1, VOCAB), 1.0 / VOCAB)),
                           grpc.StatusCode.INVALID_ARGUMENT, "verify.draft_probs")
            bad_q = torch.full((2, VOCAB), 1.0 / VOCAB)
            bad_q[1, 2] = 0
            bad_q[1, 3] += 1.0 / VOCAB
            expect_refused(lambda: b.verify([1, 2], rule="draft_distribution", draft_probs=bad_q),
                           grpc.StatusCode.INVALID_ARGUMENT, "verify.draft_probs[1]")
            va, vb = a.verify(draft), b.verify(draft)
            assert (va.accepted, va.next_token, va.target_argmax) == \
                (vb.accepted, vb.next_token, vb.target_argmax)
            states_equal(va.states, vb.states, f"step {step}")
            expect_refused(lambda: b.verify(draft), grpc.StatusCode.FAILED_PRECONDITION, "commit")
            expect_refused(lambda: b.commit(va.accepted + 1), grpc.StatusCode.INVALID_ARGUMENT,
                           "commit.accepted", str(va.accepted + 1))
            a.commit(va.accepted)
            b.commit(va.accepted)
        # Past the capacity (prompt + 20 + 4 + 1 positions): OUT_OF_RANGE, nothing changed.
        while True:
            try:
                v = b.verify([1, 2, 3, 4])
            except ExtractorError as e:
                assert e.code == grpc.StatusCode.OUT_OF_RANGE, e
                assert "capacity" in e.details or "positions" in e.details
                break
            b.commit(v.accepted)
        v = b.verify([])  # one more token still fits, or the refusal above was the last word
        b.commit(v.accepted)
    metrics = server.metrics()
    assert metric_sum(metrics, "specwire_extractor_session_calls_total", call="verify",
                      outcome="refused") >= 4 * 6 + 1
    assert metric_sum(metrics, "specwire_extractor_session_calls_total", call="commit",
                      outcome="refused") >= 4 * 2
    assert metric_sum(metrics, "specwire_extractor_session_tokens_total", kind="drafted") > 0
    wait_for_metric(server, "specwire_extractor_open_sessions", 0, 10)


def test_bad_opens_end_the_stream_with_the_field(servers):
    server = servers[("dense", "float32")]
    with ExtractorClient(server.address, timeout=30) as c:
        for kwargs, code, field in [
            (dict(prompt=[1, VOCAB]), grpc.StatusCode.INVALID_ARGUMENT, "open.prompt[0].tokens"),
            (dict(prompt=[]), grpc.StatusCode.INVALID_ARGUMENT, "open.prompt"),
            (dict(prompt=[1], temperature=-1.0), grpc.StatusCode.INVALID_ARGUMENT,
             "open.sampling.temperature"),
            (dict(prompt=[1], top_p=1.5), grpc.StatusCode.INVALID_ARGUMENT, "open.sampling.top_p"),
            (dict(prompt=[1], max_draft_tokens=65), grpc.StatusCode.INVALID_ARGUMENT,
             "open.max_draft_tokens"),
            (dict(prompt=[1], max_new_tokens=20000), grpc.StatusCode.INVALID_ARGUMENT,
             "open.max_new_tokens"),
            (dict(prompt=[1], layer_ids=[99]), grpc.StatusCode.INVALID_ARGUMENT, "layer_ids[0]"),
        ]:
            prompt = kwargs.pop("prompt")
            layer_ids = kwargs.pop("layer_ids", [0])
            expect_refused(lambda: c.session(prompt, layer_ids, **kwargs), code, field)
        # A verify before any open ends the stream with FAILED_PRECONDITION.
        from specwire_client import extractor_pb2 as pb
        call = c.stub.Session(iter([pb.SessionRequest(verify=pb.SessionVerify(draft_tokens=[1]))]),
                              timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            list(call)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "open" in e.value.details()
        # Open twice on one stream: the second is refused, the session goes on.
        with c.session([1, 2, 3], []) as s:
            s._requests.put(pb.SessionRequest(open=pb.SessionOpen(
                prompt=pb.SequenceInput(tokens=pb.TokenIds(ids=[4])))))
            msg = next(s._call)
            assert msg.WhichOneof("message") == "refused"
            assert "open" in msg.refused.message
            s.commit  # the session still answers
            v = s.verify([1])
            s.commit(v.accepted)
    assert server.crashed() is None


def test_bounds_free_sessions_whenever_their_stream_ends(server_factory, checkpoint):
    server = server_factory(checkpoint, dtype="float32",
                            args=("--max_sessions", "2", "--session_idle_seconds", "1.5",
                                  "--max_session_tokens", "64"))
    with ExtractorClient(server.address, timeout=30) as c:
        a = c.session([1, 2, 3], [], max_new_tokens=16, max_draft_tokens=4)
        b = c.session([4, 5, 6], [], max_new_tokens=16, max_draft_tokens=4)
        expect_refused(lambda: c.session([7], [], max_new_tokens=16),
                       grpc.StatusCode.RESOURCE_EXHAUSTED, "--max_sessions")
        a.close()  # closed: its slot is free
        d = c.session([7], [], max_new_tokens=16)
        # Cancelled by the client: freed too.
        b._call.cancel()
        time.sleep(0.3)
        e = c.session([8], [], max_new_tokens=16)
        # Idle past --session_idle_seconds: the server ends it and frees it.
        time.sleep(2.5)
        expect_refused(lambda: d.verify([1]), grpc.StatusCode.DEADLINE_EXCEEDED,
                       "--session_idle_seconds")
        expect_refused(lambda: e.verify([1]), grpc.StatusCode.DEADLINE_EXCEEDED)
        # The client's own deadline ends a session.
        f = c.session([9], [], max_new_tokens=16, timeout=1.0)
        time.sleep(1.5)
        expect_refused(lambda: f.verify([1]), grpc.StatusCode.DEADLINE_EXCEEDED)
        g = c.session([1], [], max_new_tokens=16)
        h = c.session([2], [], max_new_tokens=16)
        # Too many positions for one session.
        g.close()
        expect_refused(lambda: c.session([1] * 20, [], max_new_tokens=40, max_draft_tokens=4),
                       grpc.StatusCode.INVALID_ARGUMENT, "--max_session_tokens")
        h.close()
    wait_for_metric(server, "specwire_extractor_open_sessions", 0, 10)
    assert server.crashed() is None


def test_a_session_is_free_once_its_stream_has_ended(server_factory, checkpoint):
    """The contract: a session is freed when its stream ends. N clients at --max_sessions=N,
    each opening its next session only after its previous stream ended (close() returns after
    the final status), are never refused."""
    import concurrent.futures

    n, rounds = 8, 120
    server = server_factory(checkpoint, dtype="float32", args=("--max_sessions", str(n)))
    refused: list[str] = []

    def client(k: int) -> int:
        rng = random.Random(k)
        opened = 0
        with ExtractorClient(server.address, timeout=30) as c:
            for _ in range(rounds):
                try:
                    s = c.session([rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 6))], [],
                                  max_new_tokens=4, max_draft_tokens=2)
                except ExtractorError as e:
                    refused.append(f"{e.code}: {e}")
                    continue
                opened += 1
                if rng.random() < 0.5:
                    s.verify([rng.randrange(1, VOCAB)])
                s.close()
        return opened

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        opened = sum(pool.map(client, range(n)))
    assert not refused, f"{len(refused)} of {n * rounds} opens refused, e.g. {refused[0]}"
    assert opened == n * rounds
    wait_for_metric(server, "specwire_extractor_open_sessions", 0, 10)
    assert server.crashed() is None


def test_the_sessions_cache_budget(server_factory, checkpoint):
    """--session_cache_bytes: each session reserves its whole capacity when it opens; an open
    that does not fit is refused naming the flag, and a closed session gives its bytes back."""
    # The dense test checkpoint holds 1,536 bytes per position: 420 positions take 643,584.
    server = server_factory(checkpoint, dtype="float32",
                            args=("--session_cache_bytes=1000000",))
    with ExtractorClient(server.address, timeout=30) as c:
        a = c.session([1, 2, 3], [], max_new_tokens=400, max_draft_tokens=15)
        expect_refused(lambda: c.session([4], [], max_new_tokens=400, max_draft_tokens=15),
                       grpc.StatusCode.RESOURCE_EXHAUSTED, "--session_cache_bytes")
        small = c.session([4], [], max_new_tokens=8, max_draft_tokens=2)  # still fits
        small.close()
        a.close()
        b = c.session([4], [], max_new_tokens=400, max_draft_tokens=15)
        b.close()
    assert server.crashed() is None


def test_sigterm_closes_open_sessions_and_the_server_exits(server_factory, checkpoint):
    """A draining extractor ends its open sessions (UNAVAILABLE) instead of waiting out
    --drain_seconds for them, refuses new ones, and exits 0."""
    import signal
    server = server_factory(checkpoint, dtype="float32", args=("--drain_seconds=120",))
    with ExtractorClient(server.address, timeout=60) as c:
        s = c.session([1, 2, 3], [0], max_new_tokens=16)
        v = s.verify([4, 5])
        s.commit(v.accepted)
        started = time.monotonic()
        server.signal(signal.SIGTERM)
        wait_for(lambda: "draining" in server.log(), 10, "the server to start draining")
        time.sleep(0.5)
        expect_refused(lambda: s.verify([6]), grpc.StatusCode.UNAVAILABLE)
        expect_refused(lambda: c.session([1], [0]), grpc.StatusCode.UNAVAILABLE)
    code = server.stop(timeout=60)
    assert code == 0, server.log()
    assert time.monotonic() - started < 60, "shutdown waited for the idle session"
