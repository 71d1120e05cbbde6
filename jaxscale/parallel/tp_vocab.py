"""Vocabulary parallelism: the embedding table and the logits split along V over the tensor axis.

Call inside `jax.shard_map(..., check_vma=True)`. Device i of the `axis` group holds vocab rows
[i*V_t, (i+1)*V_t), V_t = V/t, exactly as `Sharder(mesh).spec(("vocab", "embed"))` lays them out.
Neither the table nor the [B, T, V] logits are ever gathered:

  embedding       masked local lookup (rows this device does not own contribute zeros), then
                  one all-reduce of the [B, T, D] activation (or, under sequence parallelism, one
                  reduce-scatter along T that leaves each device its [B, T/t, D] slice);
  cross-entropy   one all-reduce (max) of [B, T] row maxima, then one all-reduce (sum) carrying
                  both the [B, T] sums of exponentials and the [B, T] target logits.

With a tied embedding the unembedding is the local table transposed, [D, V_t]: the same vocab
split, so tying needs nothing extra.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _owned(ids, v_local: int, axis: str):
    """(local row index clipped into range, mask of ids in this device's vocab slice)."""
    local = ids - jax.lax.axis_index(axis) * v_local
    mine = (local >= 0) & (local < v_local)
    return jnp.where(mine, local, 0), mine


def vocab_parallel_embed(embed_local_VD, tokens_BT, axis: str, *, dtype=None, scatter_seq=False):
    """x [B, T, D] (or [B, T/t, D] with `scatter_seq`) = embed[tokens] from the local rows [V_t, D].

    Each token is owned by exactly one device, so the sum over devices of the masked lookups is
    the lookup itself (an exact sum: every other term is zero)."""
    v_local = embed_local_VD.shape[0]
    local_BT, mine_BT = _owned(tokens_BT, v_local, axis)
    rows_BTD = jnp.take(embed_local_VD, local_BT, axis=0)
    partial_BTD = jnp.where(mine_BT[..., None], rows_BTD, 0)
    if dtype is not None:  # cast before the collective: it moves compute-dtype bytes
        partial_BTD = partial_BTD.astype(dtype)
    if scatter_seq:
        # one reduce-scatter along T (sequence parallelism keeps the residual split over T)
        return jax.lax.psum_scatter(partial_BTD, axis, scatter_dimension=1, tiled=True)
    return jax.lax.psum(partial_BTD, axis)  # one all-reduce of [B, T, D]


def vocab_parallel_cross_entropy(logits_local_BTV, targets_BT, axis: str):
    """Mean next-token cross-entropy (f32 nats) from logits split along V: equals
    `jaxscale.model.pieces.cross_entropy` on the gathered [B, T, V] logits.

    nll = log sum_v exp(z_v - m) + m - z_target, with m the global row maximum."""
    logits_BTV = logits_local_BTV.astype(jnp.float32)
    # The maximum only keeps exp() in range and cancels in nll, so it carries no gradient (pmax
    # has no derivative rule): one all-reduce (max) of [B, T].
    m_BT = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits_BTV, axis=-1)), axis)
    sumexp_BT = jnp.sum(jnp.exp(logits_BTV - m_BT[..., None]), axis=-1)
    local_BT, mine_BT = _owned(targets_BT, logits_BTV.shape[-1], axis)
    picked_BT = jnp.take_along_axis(logits_BTV, local_BT[..., None], axis=-1)[..., 0]
    target_BT = jnp.where(mine_BT, picked_BT, 0.0)  # only the owner of the target contributes
    # one all-reduce (sum) of both [B, T] arrays: a single psum of a tuple is one collective
    sumexp_BT, target_BT = jax.lax.psum((sumexp_BT, target_BT), axis)
    nll_BT = jnp.log(sumexp_BT) + m_BT - target_BT
    return jnp.mean(nll_BT)
