"""Data parallelism by hand, the teaching forms (seed 002 ch5): replicated params, batch split
over the data axes, one gradient all-reduce per step. The trainer's DP is ZeRO stage 0
(jaxscale/parallel/zero.py), which is the "explicit" form below.

The check_vma subtlety (JAX's shard_map documentation, on check_vma). Inside shard_map, a replicated
parameter is "invariant" over the data axes; when a varying (per-shard) loss is differentiated with
respect to it, autodiff transposes the implicit broadcast into a psum -- the gradient comes back
ALREADY SUMMED over the shards. So there are two correct forms and one classic bug:

  * "mean_in_loss": pmean the loss, differentiate -> the mean gradient, no gradient collective
    written (autodiff inserts the all-reduce);
  * "explicit" (the trainer's, as ZeRO stage 0): differentiate with respect to a *varying*
    copy of the params (`pcast`), so each shard keeps its own unreduced gradient; accumulate
    microbatches locally (common.accumulate); then ONE psum per step -- the DDP all-reduce,
    written where it happens;
  * "extra_pmean" (the bug): differentiate the local loss w.r.t. the invariant params (already
    summed: N x the mean), then pmean again as pmap-era code did -> N x too large.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscale.parallel import common

FORMS = ("explicit", "mean_in_loss", "extra_pmean")


def dp_loss_and_grads(loss_fn, params, batch_BT1, axes, form="explicit"):
    """Mean loss and mean gradient over the global batch, by one of the FORMS above;
    `loss_fn(params, rows)` is the loss of this shard's rows (no collective of its own)."""
    n = 1
    for a in axes:
        n *= jax.lax.axis_size(a)
    if form == "explicit":
        loss, grads = common.accumulate(loss_fn, params, batch_BT1, 1, axes, unreduced=True)
        # one all-reduce over the data axes per step, however many microbatches
        return jax.lax.pmean(loss, axes), jax.tree.map(lambda g: jax.lax.psum(g, axes) / n, grads)
    if form == "mean_in_loss":

        def global_loss(p):
            return jax.lax.pmean(loss_fn(p, batch_BT1), axes)

        return jax.value_and_grad(global_loss)(params)  # autodiff places the all-reduce
    if form == "extra_pmean":
        loss, grads = jax.value_and_grad(loss_fn)(params, batch_BT1)
        return jax.lax.pmean(loss, axes), jax.lax.pmean(grads, axes)  # the bug: N x too large
    raise ValueError(f"unknown DP form {form!r}; choose from {FORMS}")


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
