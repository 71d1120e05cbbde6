"""Speculative decoding with a real draft model: a smaller config of the same transformer drafts
k tokens, the target scores all k + 1 positions in one pass, and each draft token is accepted
with probability min(1, p/q); the first rejected one is replaced by a draw from
norm(max(0, p - q)), and when all k are accepted the target's last position adds a bonus token.
The output is distributed exactly as the target's own samples (Leviathan et al. 2023), and at
temperature 0 (one-hot p and q) it is the target's greedy output.

Rolling back a rejected draft costs nothing: both caches keep one key slot per position, so the
next pass overwrites the rejected positions before any query can see them (causal mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.serve.sampling import SamplingParams, filtered_logits


def distribution(logits_TV, s: SamplingParams, mask_TV=None):
    """The sampling distribution [T, V] of each row of logits under `s` (one-hot at temperature
    0, so that greedy decoding is the same rule), restricted to `mask` (a grammar's) if given.

    One compiled program per shape: called op by op from the host loops below, the top-k/top-p
    `lax.cond` of `filtered_logits` took fresh branch functions each call and compiled again
    (33 programs for every 32-token sampled generation)."""
    return _distribution(logits_TV, mask_TV, s.temperature == 0, s.temperature, s.top_k, s.top_p)


@partial(jax.jit, static_argnames="greedy")
def _distribution(logits_TV, mask_TV, greedy: bool, temperature, top_k, top_p):
    T = logits_TV.shape[0]
    if mask_TV is not None:
        logits_TV = jnp.where(mask_TV, logits_TV, -jnp.inf)
    if greedy:
        return jax.nn.one_hot(jnp.argmax(logits_TV, -1), logits_TV.shape[-1])
    x = filtered_logits(
        logits_TV, jnp.full((T,), temperature), jnp.full((T,), top_k), jnp.full((T,), top_p)
    )
    # top-k/top-p may cut every token the grammar allows: then the grammar's set alone
    x = jnp.where(
        jnp.isfinite(x).any(-1, keepdims=True), x, logits_TV / jnp.maximum(temperature, 1e-6)
    )
    return jax.nn.softmax(x, axis=-1)


@jax.jit
def verify(p_K1V, q_KV, draft_K, key):
    """(accepted count n, the token after them): accept draft i while u_i < p_i(d_i) / q_i(d_i);
    the next token is drawn from norm(max(0, p_n - q_n)), where q_k = 0 makes it the bonus draw
    from p_k when all k are accepted."""
    k = draft_K.shape[0]
    u_key, r_key = jax.random.split(key)
    p_d = jnp.take_along_axis(p_K1V[:k], draft_K[:, None], -1)[:, 0]
    q_d = jnp.take_along_axis(q_KV, draft_K[:, None], -1)[:, 0]
    accept = jax.random.uniform(u_key, (k,)) * q_d < p_d  # u < p/q without dividing by 0
    n = jnp.sum(jnp.cumprod(accept.astype(jnp.int32)))
    q_pad = jnp.concatenate([q_KV, jnp.zeros_like(q_KV[:1])])
    residual_V = jnp.maximum(p_K1V[n] - q_pad[n], 0.0)
    residual_V = jnp.where(residual_V.sum() > 0, residual_V, p_K1V[n])  # p == q: any draw is p
    nxt = jax.random.categorical(r_key, jnp.log(residual_V / residual_V.sum()))
    return n, nxt.astype(jnp.int32)


@dataclass
class SpecStats:
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0  # rounds that ended at a rejected draft (at most one per round)

    @property
    def acceptance(self) -> float:
        """Share of drafted tokens accepted (drafts after a rejection count as not accepted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def gamma(self) -> float:
        """Per-token acceptance probability, estimated from the drafts actually tested: each
        round tests its drafts up to the first rejection."""
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return (
            (self.accepted + self.target_passes) / self.target_passes if self.target_passes else 0
        )


@partial(jax.jit, static_argnames="cfg")
def _feed(params, tokens_1T, start, cache, cfg):
    positions_1T = start + jnp.arange(tokens_1T.shape[1])[None, :]
    return kv_cache.forward(params, tokens_1T, positions_1T, cache, cfg)


def generate(
    target,
    target_cfg: ModelConfig,
    draft,
    draft_cfg: ModelConfig,
    prompt: list[int],
    max_new: int,
    k: int = 4,
    sampling: SamplingParams | None = None,
    eos_id: int | None = None,
    constraint=None,
) -> tuple[list[int], SpecStats]:
    """`max_new` tokens after `prompt` (fewer at EOS), drafting k at a time (greedy unless
    `sampling` says otherwise). With a `constraint` (jaxscale/serve/constrained.py) the draft
    advances a copy of the grammar state through its drafts, and the draft's and the target's
    distributions at each position are masked by the state there: the output is the target's
    constrained distribution, and complete within max_new."""
    sampling = sampling or SamplingParams(0.0)
    g_state = constraint.initial() if constraint is not None else None
    if target_cfg.vocab != draft_cfg.vocab:
        raise ValueError("the draft and the target must share a vocabulary")
    if k < 1 or len(prompt) + max_new + k > min(target_cfg.max_seq, draft_cfg.max_seq):
        raise ValueError("need k >= 1 and prompt + max_new + k within both models' max_seq")
    t_cache, d_cache = kv_cache.init_cache(target_cfg, 1), kv_cache.init_cache(draft_cfg, 1)
    tokens, tc, dc, stats = list(prompt), 0, 0, SpecStats()
    key = jax.random.key(sampling.seed)
    while len(tokens) - len(prompt) < max_new:
        left = max_new - (len(tokens) - len(prompt))
        if constraint is not None and constraint.done(g_state):
            break
        key, *ks = jax.random.split(key, k + 2)
        drafts, qs, masks, states = [], [], [], [g_state]
        feed = tokens[dc:]
        for i in range(min(k, left)):  # the draft: its unseen tokens, then one at a time
            mask = None
            if constraint is not None:
                if constraint.done(states[-1]):
                    break
                mask = jnp.asarray(constraint.allowed(states[-1], left - i))[None]
                masks.append(mask)
            logits, d_cache = _feed(draft, jnp.asarray([feed], jnp.int32), dc, d_cache, draft_cfg)
            dc += len(feed)
            q_V = distribution(logits[0, -1:], sampling, mask)[0]
            drafts.append(int(jax.random.categorical(ks[i], jnp.log(q_V))))
            qs.append(q_V)
            feed = [drafts[-1]]
            if constraint is not None:
                states.append(constraint.advance(states[-1], drafts[-1]))
        m = len(drafts)
        if m == 0:
            break
        chunk = tokens[tc:] + drafts  # the target: its unseen tokens and the drafts, one pass
        logits, t_cache = _feed(target, jnp.asarray([chunk], jnp.int32), tc, t_cache, target_cfg)
        t_mask = None
        if constraint is not None:  # the grammar's mask at each of the m + 1 positions
            last, V = states[-1], logits.shape[-1]
            open_end = not constraint.done(last) and left > m
            end = constraint.allowed(last, left - m) if open_end else np.ones(V, bool)
            t_mask = jnp.concatenate([*masks, jnp.asarray(end)[None]])
        p = distribution(logits[0, -(m + 1) :], sampling, t_mask)
        n, nxt = verify(p, jnp.stack(qs), jnp.asarray(drafts, jnp.int32), ks[k])
        n, nxt = int(n), int(nxt)
        stats.target_passes += 1
        stats.drafted += m
        stats.accepted += n
        stats.rejected += n < m
        old = len(tokens)
        tokens += drafts[:n] + [nxt]
        tc, dc = old + n, old + min(n, m - 1)  # what each cache holds correctly
        if constraint is not None:
            g_state = states[n]
            if n == m and (constraint.done(g_state) or left <= m):
                tokens.pop()  # the bonus position lies past the grammar's end or the budget
            else:
                g_state = constraint.advance(g_state, nxt)
        if eos_id is not None and eos_id in tokens[old:]:
            tokens = tokens[: tokens.index(eos_id, old) + 1]
            break
    return tokens[len(prompt) : len(prompt) + max_new], stats
