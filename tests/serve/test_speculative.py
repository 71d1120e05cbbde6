"""Speculative decoding: the acceptance rule keeps the target's distribution (chi-square) and
accepts at the closed-form rate; with real models, greedy output equals the target's alone."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.config import ModelConfig
from jaxscale.model import state as ms
from jaxscale.serve import generate as gen
from jaxscale.serve import speculative as spec
from jaxscale.serve.sampling import SamplingParams

P_V = jnp.array([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02])
Q_V = jnp.array([0.10, 0.10, 0.30, 0.10, 0.10, 0.10, 0.10, 0.10])
K = 3
N = 20_000


def _rounds():
    """N independent rounds: k drafts from q, verified against p (the same p, q at every
    position). Returns (accepted n, first emitted token) per round."""

    def one(key):
        dkey, vkey = jax.random.split(key)
        drafts = jax.random.categorical(dkey, jnp.log(Q_V), shape=(K,)).astype(jnp.int32)
        n, nxt = spec.verify(jnp.tile(P_V, (K + 1, 1)), jnp.tile(Q_V, (K, 1)), drafts, vkey)
        return n, jnp.where(n > 0, drafts[0], nxt)

    return jax.vmap(one)(jax.random.split(jax.random.key(0), N))


def test_the_first_token_is_distributed_as_the_target():
    """Pearson's chi-square over the 8 outcomes: df = 7; the 0.999 quantile of chi-square(7) is
    24.32, so a correct rule fails this 1 time in 1000."""
    _, first = _rounds()
    counts = np.bincount(np.asarray(first), minlength=8)
    expected = N * np.asarray(P_V)
    assert ((counts - expected) ** 2 / expected).sum() < 24.32


def test_every_emitted_position_is_distributed_as_the_target():
    """Whole sequences, round after round: position t has its own target p_t and draft q_t
    (independent of the tokens before it, so each position's marginal must be p_t). A round
    starting at t verifies p_t..p_t+k against q_t..q_t+k-1 and the next round starts after its
    last emitted token; a residual or bonus drawn from the wrong position's p, or a round that
    restarts at the wrong offset, moves these marginals. Pearson's chi-square summed over the
    first 4 positions (8 outcomes each): df = 28, 0.999 quantile 56.89."""
    V, n_out = 8, 4
    rng = np.random.default_rng(1)
    T = n_out * (K + 1) + K + 1  # room for every round's window
    P_TV = jnp.asarray(rng.dirichlet(np.ones(V), T), jnp.float32)
    Q_TV = jnp.asarray(rng.dirichlet(np.ones(V), T), jnp.float32)

    def sequence(key):
        out, t = jnp.full((T,), -1, jnp.int32), 0
        for _ in range(n_out):  # each round emits at least one token
            key, dkey, vkey = jax.random.split(key, 3)
            p_K1V = jax.lax.dynamic_slice(P_TV, (t, 0), (K + 1, V))
            q_KV = jax.lax.dynamic_slice(Q_TV, (t, 0), (K, V))
            drafts = jax.random.categorical(dkey, jnp.log(q_KV)).astype(jnp.int32)
            n, nxt = spec.verify(p_K1V, q_KV, drafts, vkey)
            i = jnp.arange(K + 1)
            emitted = jnp.where(i < n, jnp.append(drafts, 0), nxt)
            out = jax.lax.dynamic_update_slice(out, emitted, (t,))  # beyond n: rewritten later
            t = t + n + 1
        return out[:n_out]

    seqs = np.asarray(jax.jit(jax.vmap(sequence))(jax.random.split(jax.random.key(2), N)))
    stat = 0.0
    for t in range(n_out):
        counts = np.bincount(seqs[:, t], minlength=V)
        expected = N * np.asarray(P_TV[t], np.float64)
        stat += ((counts - expected) ** 2 / expected).sum()
    assert stat < 56.89


def test_tokens_per_target_pass_follow_the_closed_form():
    """alpha = sum(min(p, q)); E[tokens per pass] = (1 - alpha^(k+1)) / (1 - alpha). Within 4
    standard errors of the N-round mean."""
    n, _ = _rounds()
    alpha = float(jnp.minimum(P_V, Q_V).sum())
    want = (1 - alpha ** (K + 1)) / (1 - alpha)
    got = np.asarray(n) + 1
    assert abs(got.mean() - want) < 4 * got.std() / np.sqrt(N)


TARGET = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=64)
DRAFT = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq=64)


@functools.cache
def _models():  # on first use, not at collection (every xdist worker collects)
    return ms.init_params(TARGET, 0), ms.init_params(DRAFT, 1)


PROMPT = [100, 101, 102, 32, 120]


@pytest.mark.slow
@pytest.mark.first_line
def test_greedy_speculative_output_is_the_targets_own():
    want = gen.generate(_models()[0], [PROMPT], TARGET, 20).row(0)
    got, stats = spec.generate(_models()[0], TARGET, _models()[1], DRAFT, PROMPT, 20, k=4)
    assert got == want
    assert stats.accepted + stats.target_passes >= 20  # each pass: its accepted drafts + 1


@pytest.mark.slow
@pytest.mark.first_line
def test_a_perfect_draft_is_always_accepted():
    """The target drafting for itself: p == q, so every draft passes and each target pass
    yields k + 1 tokens, sampled or greedy."""
    for s in (SamplingParams(0.0), SamplingParams(1.0, seed=3)):
        got, stats = spec.generate(
            _models()[0], TARGET, _models()[0], TARGET, PROMPT, 15, k=4, sampling=s
        )
        assert stats.accepted == stats.drafted and stats.tokens_per_pass == 5
        assert len(got) == 15
    want = gen.generate(_models()[0], [PROMPT], TARGET, 15).row(0)
    assert spec.generate(_models()[0], TARGET, _models()[0], TARGET, PROMPT, 15, k=4)[0] == want


@pytest.mark.slow
@pytest.mark.first_line
def test_constrained_speculative_decoding_keeps_the_grammar_and_the_greedy_output():
    """The draft advances a copy of the JSON automaton's state; the target's positions are masked
    by the state there. Greedy: exactly the constrained output without speculation."""
    import json

    from jaxscale.serve import constrained

    c = constrained.JsonConstraint()
    want = constrained.generate(_models()[0], TARGET, PROMPT, c, max_new=30)
    got, stats = spec.generate(
        _models()[0], TARGET, _models()[1], DRAFT, PROMPT, 30, k=3, constraint=c
    )
    assert got == want
    json.loads(bytes(got))
    for seed in range(3):
        got, _ = spec.generate(
            _models()[0],
            TARGET,
            _models()[1],
            DRAFT,
            PROMPT,
            30,
            k=3,
            constraint=c,
            sampling=SamplingParams(1.0, seed=seed),
        )
        assert len(got) <= 30
        json.loads(bytes(got))


def _tiny():
    """(cfg, params) of a one-layer model small enough to compile in a blink."""
    cfg = ModelConfig(
        vocab=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq=24
    )
    rng = np.random.default_rng(0)  # any parameters will do: numpy's are quicker than init's
    params = jax.tree.map(
        lambda a: jnp.asarray(rng.normal(0, 0.5, a.shape), a.dtype), ms.abstract_params(cfg)
    )
    return cfg, params


COMPILES: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, _s, **_: (
        COMPILES.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
    )
)


def test_a_sampled_generation_compiles_nothing_the_second_time():
    """The host loop's sampling distribution is one compiled program per shape. Op by op, the
    top-k/top-p cut's `lax.cond` took fresh branch functions at every draft and compiled again:
    33 programs for each 32-token sampled generation. With the target as its own draft every
    round has the same shapes, whatever the seed."""
    cfg, target = _tiny()
    s = SamplingParams(1.0, top_k=5, seed=1)
    first, _ = spec.generate(target, cfg, target, cfg, [5], 9, k=2, sampling=s)
    before = len(COMPILES)
    again, _ = spec.generate(target, cfg, target, cfg, [5], 9, k=2, sampling=s)
    assert len(COMPILES) == before and again == first
    spec.generate(target, cfg, target, cfg, [5], 9, k=2, sampling=SamplingParams(0.7, seed=2))
    assert len(COMPILES) == before  # another temperature and seed: the same program


def test_the_top_k_top_p_cut_run_op_by_op_compiles_once():
    """`filtered_logits` outside jit (a notebook's call): its cond's branches are the same
    functions every call, so the second call finds the first's program."""
    from jaxscale.serve import sampling

    x_BV = jnp.linspace(0.0, 1.0, 64)[None]
    args = (jnp.ones(1), jnp.full((1,), 5), jnp.full((1,), 0.9))
    first = sampling.filtered_logits(x_BV, *args)
    before = len(COMPILES)
    assert np.array_equal(sampling.filtered_logits(x_BV, *args), first)
    assert len(COMPILES) == before
    assert int(jnp.isfinite(first).sum()) == 5  # the cut is applied: top-5 of 64


def test_a_perfect_drafts_cache_count_leaves_no_position_unfed(monkeypatch):
    """The target drafting for itself (p == q, greedy): all k = 2 drafts pass, each round emits
    3 tokens. The draft never feeds its own last draft, so after round r (prompt P, P + 3r
    tokens) its cache holds P + 3r - 2 positions and the next round starts feeding there: the
    feeds, (start, length), are (0, P) (P, 1), then (P + 3r - 2, 2) (P + 3r, 1) for r = 1, 2.
    Every position is written with the sequence's token before any feed starts past it."""
    cfg, target = _tiny()
    draft = dict(target)  # the same weights, told apart by identity
    feeds, feed = [], spec._feed

    def recording_feed(params, tokens_1T, start, cache, cfg):
        if params is draft:
            feeds.append((int(start), [int(t) for t in tokens_1T[0]]))
        return feed(params, tokens_1T, start, cache, cfg)

    monkeypatch.setattr(spec, "_feed", recording_feed)
    prompt = [5]  # one token: the feeds come in three shapes, 1, 2 and 3 (fewer compiles)
    got, stats = spec.generate(target, cfg, draft, cfg, prompt, 9, k=2)
    P, seq = len(prompt), prompt + got
    assert len(seq) == P + 9
    written: set[int] = set()
    for start, tokens in feeds:
        assert set(range(start)) <= written  # no hole behind where this feed starts
        assert tokens == seq[start : start + len(tokens)]
        written |= set(range(start, start + len(tokens)))
    want = [(0, P), (P, 1), (P + 1, 2), (P + 3, 1), (P + 4, 2), (P + 6, 1)]
    assert [(start, len(tokens)) for start, tokens in feeds] == want
    assert (stats.target_passes, stats.drafted, stats.accepted) == (3, 6, 6)
