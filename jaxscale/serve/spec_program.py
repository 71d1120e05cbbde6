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

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.serve import sampling
from jaxscale.serve.program import TOP_LOGPROBS
from jaxscale.serve.speculative import verify


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
    n_B, nxt_B = jax.vmap(verify)(p_BTV, q_BKV, drafts_BK, keys_BK[:, k])

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
    import numpy as np

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
