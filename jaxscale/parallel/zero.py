"""The data axes by hand: DP and ZeRO-1/2/3 over the data-like mesh axes (the ZeRO group of N
devices), inside the manual step's shard_map.

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
Under tensor and expert parallelism M below is this device's share of the matrices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxscale.model.pieces import Pieces
from jaxscale.parallel import common

STAGES = {
    0: "DP: everything replicated, gradients all-reduced",
    1: "ZeRO-1: optimizer state sharded",
    2: "ZeRO-2: optimizer state and gradients sharded",
    3: "ZeRO-3 / FSDP: optimizer state, gradients and parameters sharded",
}
F32 = common.F32


def pieces(pc: Pieces, comp: common.Composition) -> Pieces:
    """ZeRO-3 gathers each layer's shards inside the layer loop just before the layer runs (one
    all-gather per split leaf; autodiff's transpose reduce-scatters the gradients), and the
    embedding, final norm and unembedding before use. Other stages change nothing in the model."""
    if comp.stage != 3:
        return pc
    axes, zero_specs = comp.data_axes, comp.zero_specs
    layer_specs = {k: P(*s[1:]) for k, s in zero_specs["blocks"].items()}  # minus `layers`
    top_specs = {k: v for k, v in zero_specs.items() if k != "blocks"}

    def gather(tree, specs):
        return {k: common.gather_leaf(v, specs[k], axes) for k, v in tree.items()}

    return pc.replace(
        layer_hook=lambda layer: gather(layer, layer_specs),
        top_hook=lambda top: gather(top, top_specs),
    )


def loss_and_grads(params, batch_BT1, *, stage, zero_specs, axes, n, local, reduced=()):
    """Mean loss and mean gradient over the global batch, in the layout the stage updates in.
    `local(params, rows, unreduced)` is this shard's mean loss and gradient (the microbatch loop
    of `common.accumulate`, or a pipeline schedule), unreduced over the data axes or, for
    ZeRO-3, reduced by autodiff's reduce-scatters. `reduced`: top-level keys whose gradients
    arrive all-reduced already (DP's gradient buckets, parallel/buckets.py). (Plain DP's other
    forms, and the classic extra-pmean bug, are in jaxscale/lessons/data_parallel.py.)"""
    loss, grads = local(params, batch_BT1, stage != 3)
    loss = jax.lax.pmean(loss, axes)  # one all-reduce of the scalar loss
    if stage in (0, 1):
        # all-reduce over the data axes: every device gets the full mean gradient
        return loss, {
            k: jax.tree.map(lambda g, k=k: (g if k in reduced else jax.lax.psum(g, axes)) / n, v)
            for k, v in grads.items()
        }
    if stage == 2:
        # reduce-scatter: each device receives only the summed slice it owns
        return loss, jax.tree.map(
            lambda g, s: common.scatter_leaf(g, s, axes) / n, grads, zero_specs
        )
    # stage 3: params are shards, so autodiff of the per-layer all-gathers already
    # reduce-scattered the gradients (a sum over the data axes): only the 1/N remains
    return loss, jax.tree.map(lambda g: g / n, grads)


def update(stage: int, tx, grads, opt_state, params, zero_specs, axes):
    """One optimizer step in the stage's layout; returns the params in their stored layout."""
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


def predict_comm(shape: common.StepShape, comp: common.Composition) -> dict:
    """{op: bytes per device} over the data axes (M = this device's share of the matrices,
    `shape.matrix_params`, after the tensor and expert splits; Nn = norm params)."""
    n, stage = comp.n, comp.stage
    if n == 1:
        return {}
    M, Nn = shape.matrix_params, shape.norm_params
    out = {"all-reduce": F32}  # the loss pmean
    if stage in (0, 1):
        out["all-reduce"] += F32 * (M + Nn)
    elif stage == 2:
        out["reduce-scatter"] = F32 * M
        out["all-reduce"] += F32 * Nn
    else:  # 3: forward all-gathers (each layer once), autodiff's reduce-scatter, norm grads
        out["all-gather"], out["reduce-scatter"] = F32 * M, F32 * M
        out["all-reduce"] += F32 * Nn
    if stage in (1, 2):  # the updated params, gathered back
        out["all-gather"] = F32 * M
    return out


def _map(fn, tree, specs, axes):
    return jax.tree.map(lambda x, s: fn(x, s, axes), tree, specs)
