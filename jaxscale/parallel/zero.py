"""ZeRO by hand: three distinct modes over the data-like axes (the ZeRO group of N devices).

What each device stores and sends per step (P parameters, f32, Adam m and v):

  stage  params   grads    Adam m,v  gradient collective            after the update
  0 DP   P        P        2P        all-reduce (P)                 -
  1      P        P        2P/N      all-reduce (P), keep a slice   all-gather params (P)
  2      P        P/N      2P/N      reduce-scatter (P)             all-gather params (P)
  3      P/N      P/N      2P/N      reduce-scatter (by autodiff)   - (params stay sharded; each
                                                                    layer is all-gathered just
                                                                    before use, fwd and bwd)

"Sharded" means split along each leaf's `embed` dimension over all data-like axes (ZERO_RULES);
norm scales have no embed dimension and stay replicated (their gradients are all-reduced).
Functions here run inside the manual step's shard_map.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscale.parallel import common

STAGES = {
    0: "DP: everything replicated, gradients all-reduced",
    1: "ZeRO-1: optimizer state sharded",
    2: "ZeRO-2: optimizer state and gradients sharded",
    3: "ZeRO-3 / FSDP: optimizer state, gradients and parameters sharded",
}


def reduce_grads(stage: int, local_grads, zero_specs, axes, n: int):
    """Mean gradient from unreduced per-shard gradients, in the layout the stage updates in."""
    if stage in (0, 1):
        # all-reduce over the data axes: every device gets the full mean gradient
        return jax.tree.map(lambda g: jax.lax.psum(g, axes) / n, local_grads)
    if stage == 2:
        # reduce-scatter: each device receives only the summed slice it owns
        # (specs are matched up to the grads' structure, so each PartitionSpec arrives whole)
        return jax.tree.map(
            lambda g, s: common.scatter_leaf(g, s, axes) / n, local_grads, zero_specs
        )
    raise ValueError(f"stage {stage}: ZeRO-3 gradients come reduce-scattered from autodiff")


def update(stage: int, tx, grads, opt_state, params, zero_specs, axes):
    """One AdamW step in the stage's layout; returns the params in their stored layout."""
    if stage in (0, 3):  # DP: everything whole; ZeRO-3: everything already this device's shard
        updates, opt_state = tx.update(grads, opt_state, params)
        return jax.tree.map(jnp.add, params, updates), opt_state
    # ZeRO-1/2: update only the slice this device owns, then rebuild the replicated params
    params_shard = _map(common.slice_leaf, params, zero_specs, axes)
    grads_shard = grads if stage == 2 else _map(common.slice_leaf, grads, zero_specs, axes)
    updates, opt_state = tx.update(grads_shard, opt_state, params_shard)
    new_shard = jax.tree.map(jnp.add, params_shard, updates)
    # all-gather over the data axes (P bytes per device); the result is the same everywhere
    gathered = jax.tree.map(
        lambda x, s: common.gather_leaf(x, s, axes, to="invarying"), new_shard, zero_specs
    )
    return gathered, opt_state


def layer_gather_hook(layer_specs, axes):
    """ZeRO-3's forward hook: all-gather one layer's shards just before the layer runs."""

    def hook(layer):
        return {k: common.gather_leaf(v, layer_specs[k], axes) for k, v in layer.items()}

    return hook


def top_gather_hook(top_specs, axes):
    """ZeRO-3: all-gather the embedding, final norm and unembedding before use."""

    def hook(top):
        return {k: common.gather_leaf(v, top_specs[k], axes) for k, v in top.items()}

    return hook


def layer_specs_of(param_specs) -> dict:
    """Specs of one layer's slice: the stacked specs minus their leading layers entry."""
    return {k: jax.sharding.PartitionSpec(*s[1:]) for k, s in param_specs["blocks"].items()}


def _map(fn, tree, specs, axes):
    return jax.tree.map(lambda x, s: fn(x, s, axes), tree, specs)
