"""Attention over one block of keys at a time, merged by log-sum-exp: the form ring attention
(parallel/cp/ring.py: the blocks travel the ring) and the KV cache (model/kv_cache.py: the
blocks are the cache's live slots) share. Each block's result is normalised within the block and
carries its log-sum-exp; `merge` joins two results over disjoint keys as one."""

from __future__ import annotations

import jax.numpy as jnp

NEG = jnp.finfo(jnp.float32).min  # the log-sum-exp of an empty set, kept finite


def block_attend(q_BTHK, k_BSGK, v_BSGK, q_pos, k_pos_S):
    """Causal GQA attention of one query block on one key block, un-merged: (out [B, T, H, K]
    f32, normalised within the block; lse [B, T, H], its log-sum-exp of scores). Query positions
    are [T], or [B, T] per row; key s is seen by query t iff k_pos[s] <= q_pos[t]."""
    B, T, H, K = q_BTHK.shape
    G = k_BSGK.shape[2]
    q_BTGRK = q_BTHK.reshape(B, T, G, H // G, K)
    scores_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BSGK).astype(jnp.float32)
    scores_BGRTS = scores_BGRTS * K**-0.5
    causal = q_pos[..., :, None] >= k_pos_S[None, :]  # [T, S] or [B, T, S]
    if causal.ndim == 3:
        causal = causal[:, None, None]  # [B, 1, 1, T, S] against [B, G, R, T, S]
    scores_BGRTS = jnp.where(causal, scores_BGRTS, NEG)
    m_BGRT = jnp.max(scores_BGRTS, axis=-1)
    p_BGRTS = jnp.exp(scores_BGRTS - m_BGRT[..., None])
    l_BGRT = jnp.sum(p_BGRTS, axis=-1)
    probs_BGRTS = (p_BGRTS / l_BGRT[..., None]).astype(q_BTHK.dtype)
    out_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", probs_BGRTS, v_BSGK).astype(jnp.float32)
    lse_BTH = jnp.transpose(m_BGRT + jnp.log(l_BGRT), (0, 3, 1, 2)).reshape(B, T, H)
    return out_BTGRK.reshape(B, T, H, K), lse_BTH


def merge(acc, part):
    """Two partial attentions over disjoint keys as one: the log-sum-exp rescaling."""
    (o1, lse1), (o2, lse2) = acc, part
    lse = jnp.logaddexp(lse1, lse2)
    return o1 * jnp.exp(lse1 - lse)[..., None] + o2 * jnp.exp(lse2 - lse)[..., None], lse


def empty(q_BTHK):
    """The merge's identity for a query block, typed like q (varying over q's axes)."""
    zero = (q_BTHK * 0).astype(jnp.float32)
    return zero, zero[..., 0] + NEG
