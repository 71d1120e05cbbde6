"""Data parallelism by hand: replicated params, batch split over the data axes, one gradient
all-reduce per step.

The check_vma subtlety (jax-ecosystem-notes §4.4). Inside shard_map, a replicated parameter is
"invariant" over the data axes; when a varying (per-shard) loss is differentiated with respect to
it, autodiff transposes the implicit broadcast into a psum -- the gradient comes back ALREADY
SUMMED over the shards. So there are three correct forms and one classic bug:

  * "mean_in_loss": pmean the loss, differentiate -> the mean gradient, no gradient collective
    written (autodiff inserts the all-reduce);
  * "explicit" (used by the trainer): differentiate with respect to a *varying* copy of the
    params (`pcast`), so each shard keeps its own unreduced gradient; accumulate microbatches
    locally; then ONE psum per step -- the DDP all-reduce, written where it happens;
  * "extra_pmean" (the bug): differentiate the local loss w.r.t. the invariant params (already
    summed: N x the mean), then pmean again as pmap-era code did -> N x too large.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscale.parallel import common

VARIANTS = ("explicit", "mean_in_loss", "extra_pmean")


def local_grads(params, batch_BT1, cfg, axes, grad_accum: int = 1, loss_fn=None):
    """Unreduced (per-shard) mean loss and gradient over this shard's rows [B_data, T+1].

    The params are pcast to varying, so autodiff inserts no collective; microbatches are summed
    locally and the caller reduces once."""
    loss_fn = loss_fn or (lambda p, b: common.local_loss(p, b, cfg))
    varying = jax.tree.map(lambda p: jax.lax.pcast(p, axes, to="varying"), params)
    if grad_accum == 1:
        return jax.value_and_grad(loss_fn)(varying, batch_BT1)
    B = batch_BT1.shape[0]
    micro_MBT1 = batch_BT1.reshape(B // grad_accum, grad_accum, -1).swapaxes(0, 1)

    def body(carry, micro_BT1):
        loss, grads = jax.value_and_grad(loss_fn)(varying, micro_BT1)
        return jax.tree.map(jnp.add, carry, (loss, grads)), None

    zero = jax.tree.map(jnp.zeros_like, (jnp.zeros((), jnp.float32), varying))
    zero = (jax.lax.pcast(zero[0], axes, to="varying"), zero[1])
    (loss, grads), _ = jax.lax.scan(body, zero, micro_MBT1)
    return loss / grad_accum, jax.tree.map(lambda g: g / grad_accum, grads)


def dp_loss_and_grads(params, batch_BT1, cfg, axes, variant="explicit", grad_accum=1):
    """Mean loss and mean gradient over the global batch, by one of the VARIANTS above."""
    n = 1
    for a in axes:
        n *= jax.lax.axis_size(a)
    if variant == "explicit":
        loss, grads = local_grads(params, batch_BT1, cfg, axes, grad_accum)
        # one all-reduce over the data axes per step, however many microbatches
        return jax.lax.pmean(loss, axes), jax.tree.map(lambda g: jax.lax.psum(g, axes) / n, grads)
    if variant == "mean_in_loss":

        def global_loss(p):
            return jax.lax.pmean(common.local_loss(p, batch_BT1, cfg), axes)

        return jax.value_and_grad(global_loss)(params)  # autodiff places the all-reduce
    if variant == "extra_pmean":
        loss, grads = jax.value_and_grad(lambda p: common.local_loss(p, batch_BT1, cfg))(params)
        return jax.lax.pmean(loss, axes), jax.lax.pmean(grads, axes)  # the bug: N x too large
    raise ValueError(f"unknown DP variant {variant!r}; choose from {VARIANTS}")


def bucketed_psum(grads, axes, bucket_bytes: int):
    """The seed's gradient-bucketing exercise: concatenate leaves into flat buckets of at most
    `bucket_bytes` and all-reduce each bucket (one collective per bucket instead of per leaf)."""
    leaves, treedef = jax.tree.flatten(grads)
    buckets, current, size = [], [], 0
    for i, g in enumerate(leaves):
        nbytes = g.size * g.dtype.itemsize
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        buckets.append(current)
    out = [None] * len(leaves)
    for bucket in buckets:
        flat = jnp.concatenate([leaves[i].reshape(-1) for i in bucket])
        flat = jax.lax.psum(flat, axes)  # one all-reduce per bucket
        offset = 0
        for i in bucket:
            out[i] = flat[offset : offset + leaves[i].size].reshape(leaves[i].shape)
            offset += leaves[i].size
    return jax.tree.unflatten(treedef, out), len(buckets)


def per_leaf_psum(grads, axes):
    """One all-reduce per gradient leaf (what the bucketed version improves on)."""
    return jax.tree.map(lambda g: jax.lax.psum(g, axes), grads)
