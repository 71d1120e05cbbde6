"""The engine's speculative decode program (`serve --draft-ckpt DIR --speculative-tokens k`): for
every decoding row at once, the draft proposes k tokens, the target scores all k + 1 positions in
one pass, and serve/speculative.verify accepts or replaces them (Leviathan et al. 2023: the
output is distributed as the target's own samples; at temperature 0 it is its greedy output).

Both models' caches are page pools addressed by the same block table (the draft's pool has its
own shape, the pages the same indices), so the scheduler's pages serve both. A row's last
token (position q) is in neither cache. The draft's first step feeds two tokens, at q - 1 and q:
after a round that accepted all k drafts, the draft never saw the last of them; in every other
case position q - 1 is rewritten with the keys it already holds. Rejected positions in either
pool are overwritten by the next round before any query reaches them (the causal mask).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.serve import sampling
from jaxscale.serve import speculative as spec
from jaxscale.serve.events import Event
from jaxscale.serve.program import TOP_LOGPROBS


def distribution(logits_BTV, s: dict):
    """Each row's sampling distribution [B, T, V] under its settings `s` (per-row arrays): the
    filtered softmax, or one-hot at the argmax where the temperature is 0 (so greedy is the
    same accept rule)."""

    def each(x_BV):
        return sampling.filtered_logits(x_BV, s["temperature"], s["top_k"], s["top_p"])

    x_BTV = jax.vmap(each, in_axes=1, out_axes=1)(logits_BTV)
    greedy_BTV = jax.nn.one_hot(jnp.argmax(logits_BTV, -1), logits_BTV.shape[-1])
    hot = s["temperature"][:, None, None] > 0
    return jnp.where(hot, jax.nn.softmax(x_BTV, axis=-1), greedy_BTV)


@partial(jax.jit, static_argnames=("cfg", "draft_cfg", "k"), donate_argnames=("pool", "dpool"))
def run(params, pool, draft, dpool, feed, cfg: ModelConfig, draft_cfg: ModelConfig, k: int):
    """One speculative round on `feed` (host arrays: table [B, N], last2 [B, 2] the rows' last two
    tokens, q [B] the last one's position, index [B] the row's output count, settings).

    Returns (pool, dpool, (drafts [B, k], accepted n [B], the token after them [B], the
    log-probabilities of the k + 1 tokens the round can emit [B, k + 1] and their top
    TOP_LOGPROBS (ids, log-probabilities) [B, k + 1, 20])): the row's new tokens are
    drafts[:n] and then that token."""
    s, q_B = feed["settings"], feed["q"]
    table = feed["table"]
    keys_B = sampling.request_keys(s["seed"], feed["index"])
    keys_BK = jax.vmap(lambda key: jax.random.split(key, k + 1))(keys_B)  # k drafts, 1 verify
    dcache = kv_cache.paged(dpool, table)
    positions_B2 = q_B[:, None] + jnp.arange(-1, 1)[None, :]
    logits, dcache = kv_cache.forward(draft, feed["last2"], positions_B2, dcache, draft_cfg)

    def propose(logits_BV, i):
        q_BV = distribution(logits_BV[:, None], s)[:, 0]
        d_B = jax.vmap(jax.random.categorical)(keys_BK[:, i], jnp.log(q_BV)).astype(jnp.int32)
        return d_B, q_BV

    def draft_step(carry, i):  # draft token i (from the logits at position q + i - 1)
        logits_BV, dcache = carry
        d_B, q_BV = propose(logits_BV, i)
        logits, dcache = kv_cache.forward(
            draft, d_B[:, None], (q_B + i + 1)[:, None], dcache, draft_cfg
        )
        return (logits[:, 0], dcache), (d_B, q_BV)

    # k - 1 steps feed d_1 .. d_{k-1}; d_k comes from the last logits and is never fed
    (last_BV, dcache), (d_IB, q_IBV) = jax.lax.scan(
        draft_step, (logits[:, -1], dcache), jnp.arange(k - 1)
    )
    d_B, q_BV = propose(last_BV, k - 1)
    drafts_BK = jnp.concatenate([d_IB.T, d_B[:, None]], axis=1)
    q_BKV = jnp.concatenate([q_IBV.transpose(1, 0, 2), q_BV[:, None]], axis=1)

    cache = kv_cache.paged(pool, table)
    tokens_BT = jnp.concatenate([feed["last2"][:, 1:], drafts_BK], axis=1)  # [B, k + 1]
    positions_BT = q_B[:, None] + jnp.arange(k + 1)[None, :]
    logits_BTV, cache = kv_cache.forward(params, tokens_BT, positions_BT, cache, cfg)
    p_BTV = distribution(logits_BTV, s)
    n_B, nxt_B = jax.vmap(spec.verify)(p_BTV, q_BKV, drafts_BK, keys_BK[:, k])

    # the emitted tokens: drafts up to n, then nxt at n; each one's target log-probability
    j_T = jnp.arange(k + 1)[None, :]
    out_BT = jnp.where(j_T < n_B[:, None], jnp.pad(drafts_BK, ((0, 0), (0, 1))), nxt_B[:, None])
    logp_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
    logp_BT = jnp.take_along_axis(logp_BTV, out_BT[..., None], axis=-1)[..., 0]
    top_BTK, top_ids_BTK = jax.lax.top_k(logp_BTV, min(TOP_LOGPROBS, logp_BTV.shape[-1]))
    pool = {n: x for n, x in cache.items() if n != "block_table"}
    dpool = {n: x for n, x in dcache.items() if n != "block_table"}
    return pool, dpool, (drafts_BK, n_B, nxt_B, logp_BT, top_ids_BTK, top_BTK)


@partial(jax.jit, static_argnames="draft_cfg", donate_argnames="dpool")
def fill(draft, dpool, feed, draft_cfg: ModelConfig):
    """The draft's keys and values of a prefill program's tokens (the engine's `feed`, every
    token real: a speculative engine reads each step before the next)."""
    cache = kv_cache.paged(dpool, feed["table"])
    _, cache = kv_cache.forward(draft, feed["tokens"], feed["positions"], cache, draft_cfg)
    return {n: x for n, x in cache.items() if n != "block_table"}


def check(cfg: ModelConfig, draft_cfg: ModelConfig | None, k: int, mesh) -> None:
    """A speculative engine's draft must share the target's vocabulary (the engine's tokens are
    bytes: the same tokenizer) and reach its context; ValueError naming what differs."""
    if draft_cfg is None:
        raise ValueError(f"--speculative-tokens {k} needs a draft model (--draft-ckpt DIR)")
    if k < 1:
        raise ValueError(f"--speculative-tokens must be >= 1, got {k}")
    if draft_cfg.vocab != cfg.vocab:
        raise ValueError(
            f"the draft's vocabulary ({draft_cfg.vocab}) differs from the target's ({cfg.vocab})"
        )
    if draft_cfg.max_seq < cfg.max_seq:
        raise ValueError(
            f"the draft's context ({draft_cfg.max_seq}) is shorter than the target's "
            f"({cfg.max_seq})"
        )
    if mesh is not None:
        raise ValueError("speculative decoding runs on one device (no --mesh)")


def speculate(engine, rows: list, B: int):
    """Launch one round for the decoding `rows` (requests), padded to B rows, and read it back:
    (drafts, accepted, next token, log-probabilities, top ids, top log-probabilities) on the
    host."""
    feed = engine.padding(B, 2)
    feed["last2"] = feed.pop("tokens")
    feed["q"] = np.full(B, engine.cfg.max_seq, np.int32)
    params = [sampling.SamplingParams(0.0)] * B
    for b, req in enumerate(rows):
        feed["last2"][b] = req.tokens[-2:]
        feed["q"][b] = len(req.tokens) - 1
        feed["table"][b, : len(req.pages)] = req.pages
        feed["index"][b], params[b] = len(req.out), req.sampling
    feed["settings"] = sampling.as_arrays(params)
    feed = {n: feed[n] for n in ("table", "last2", "q", "index", "settings")}
    engine.pool, engine.dpool, out = run(
        engine.params,
        engine.pool,
        engine.draft_params,
        engine.dpool,
        feed,
        engine.cfg,
        engine.draft_cfg,
        engine.ecfg.speculative_tokens,
    )
    return tuple(np.asarray(x) for x in out)


def top_pairs(ids_K, logp_K) -> tuple:
    """((id, log-probability), ...) of a row's top tokens (host arrays)."""
    return tuple(zip(ids_K.tolist(), logp_K.tolist(), strict=True))


@partial(jax.jit, static_argnames="cfg", donate_argnames="pool")
def _one_row(params, pool, table_1N, tokens_1T, positions_1T, cfg: ModelConfig):
    """One row's tokens through a model's paged cache: (pool, logits [T, V])."""
    cache = kv_cache.paged(pool, table_1N)
    logits, cache = kv_cache.forward(params, tokens_1T, positions_1T, cache, cfg)
    return {n: x for n, x in cache.items() if n != "block_table"}, logits[0]


def constrained_round(engine, req) -> tuple[list[tuple[int, float, tuple]], int, int]:
    """One speculative round for a request a grammar constrains, on the host's schedule (the
    mask of each draft position depends on the drafts before it): the draft proposes up to k
    tokens one at a time, each from its distribution under the grammar's mask there (a copy
    of the grammar state advanced through the drafts), and the target's pass masks each
    position the same way (serve/speculative.generate's rule, on the engine's pools). Returns
    (the emitted tokens with their log-probabilities and top TOP_LOGPROBS, drafted, accepted);
    the caller feeds the tokens to the scheduler and the grammar."""
    c, k, s = req.constraint, engine.ecfg.speculative_tokens, req.sampling
    table = np.full((1, engine.n_table), 0, np.int32)
    table[0, : len(req.pages)] = req.pages
    q = len(req.tokens) - 1
    left = req.max_tokens - len(req.out)
    seed = np.asarray([s.seed], np.uint32)
    keys = jax.random.split(sampling.request_keys(seed, len(req.out))[0], k + 1)
    states, drafts, qs, masks = [req.grammar], [], [], []
    feed, at = req.tokens[-2:], [q - 1, q]
    for i in range(min(k, left)):
        if c.done(states[-1]):
            break
        mask = jnp.asarray(engine._allowed_at(req, states[-1], left - i))[None]
        args = (table, np.asarray([feed]), np.asarray([at]), engine.draft_cfg)
        engine.dpool, logits = _one_row(engine.draft_params, engine.dpool, *args)
        q_V = spec.distribution(logits[-1:], s, mask)[0]
        drafts.append(int(jax.random.categorical(keys[i], jnp.log(q_V))))
        qs.append(q_V)
        masks.append(mask)
        states.append(c.advance(states[-1], drafts[-1]))
        feed, at = [drafts[-1]], [q + i + 1]
    m = len(drafts)
    tokens = [req.tokens[-1], *drafts]
    args = (table, np.asarray([tokens]), np.arange(q, q + m + 1)[None], engine.cfg)
    engine.pool, logits_TV = _one_row(engine.params, engine.pool, *args)
    open_end = not c.done(states[-1]) and left > m
    end = np.ones(engine.cfg.vocab, bool)
    if open_end:
        end = engine._allowed_at(req, states[-1], left - m)
    p_TV = spec.distribution(logits_TV, s, jnp.concatenate([*masks, jnp.asarray(end)[None]]))
    d_M = jnp.asarray(drafts, jnp.int32)
    n, nxt = (int(x) for x in spec.verify(p_TV, jnp.stack(qs), d_M, keys[k]))
    out = [*drafts[:n], nxt]
    if n == m and not open_end:
        out.pop()  # the bonus position lies past the grammar's end or the budget
    logp_TV = jax.nn.log_softmax(logits_TV, axis=-1)
    top_TK, ids_TK = jax.lax.top_k(logp_TV, min(TOP_LOGPROBS, logp_TV.shape[-1]))
    logp_TV, top_TK, ids_TK = (np.asarray(x) for x in (logp_TV, top_TK, ids_TK))
    emitted = [
        (tok, float(logp_TV[j, tok]), top_pairs(ids_TK[j], top_TK[j])) for j, tok in enumerate(out)
    ]
    return emitted, m, n


def warm_constrained(engine) -> None:
    """Compile the one-row programs of constrained rounds (the draft's 1- and 2-token feeds, the
    target's 2 to k + 1), padding only: positions past the table write to page 0."""
    table = np.zeros((1, engine.n_table), np.int32)
    for T in (1, 2):
        at = np.full((1, T), engine.cfg.max_seq, np.int32)
        feed = (table, np.zeros((1, T), np.int32), at, engine.draft_cfg)
        engine.dpool, _ = _one_row(engine.draft_params, engine.dpool, *feed)
    for T in range(2, engine.ecfg.speculative_tokens + 2):
        at = np.full((1, T), engine.cfg.max_seq, np.int32)
        engine.pool, _ = _one_row(
            engine.params, engine.pool, table, np.zeros((1, T), np.int32), at, engine.cfg
        )


def step(engine, rows: list) -> list[Event]:
    """One speculative round for the decoding `rows`: each emits its accepted drafts and the
    token after them (up to EOS, max_tokens or its grammar's end), fed into the target's
    cache one by one. Rows a grammar constrains run one by one on the host's schedule."""
    free = [r for r in rows if r.constraint is None]
    rounds = []  # (request, [(token, logprob, top)], drafted, accepted)
    if free:
        B = next(s for s in engine.batch_sizes if s >= len(free))
        drafts, n_B, nxt_B, logp_BT, top_ids, top = speculate(engine, free, B)
        for b, req in enumerate(free):
            n = int(n_B[b])
            toks = [*drafts[b, :n].tolist(), int(nxt_B[b])]
            emitted = [
                (t, float(logp_BT[b, j]), top_pairs(top_ids[b, j], top[b, j]))
                for j, t in enumerate(toks)
            ]
            rounds.append((req, emitted, engine.k, n))
    for req in rows:
        if req.constraint is not None:
            rounds.append((req, *constrained_round(engine, req)))
    events = []
    for req, emitted, m, n in rounds:
        engine.spec.target_passes += 1
        engine.spec.drafted += m
        engine.spec.accepted += n
        engine.spec.rejected += n < m
        for tok, logp, top in emitted:
            engine.scheduler.advance(req, 1, tok, engine.ecfg.eos_id)
            text = engine._grammar_step(req, tok)
            if req.done:
                text += engine.texts.pop(req.id).finish()
            events.append(Event(req.id, tok, text, req.finish_reason, logp, top))
            if req.done:
                break
    return events
