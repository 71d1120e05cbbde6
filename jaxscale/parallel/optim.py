"""The optimizer every strategy shares: AdamW (no weight decay on norm scales) or SGD, the
learning-rate schedule, clipping by a supplied global norm, and the optimizer state's layout.
One definition, so auto and manual states have the same structure and a checkpoint of one
restores into the other.
"""

from __future__ import annotations

import jax
import optax
from jax.sharding import PartitionSpec as P

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.model import state as model_state


def lr_schedule(tcfg: TrainConfig):
    """Linear warmup to `lr`, then cosine decay to lr * min_lr_ratio at the last step."""
    decay_steps = max(tcfg.steps - tcfg.warmup_steps, 1)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=tcfg.lr,
        warmup_steps=tcfg.warmup_steps,
        decay_steps=tcfg.warmup_steps + decay_steps,
        end_value=tcfg.lr * tcfg.min_lr_ratio,
    )


def make_optimizer(tcfg: TrainConfig, cfg: ModelConfig):
    """AdamW without weight decay on norm scales, or plain SGD. Clipping is not in here: every
    strategy clips with `clip_by_global_norm` after computing the norm its own way (the manual
    ones across shards), so auto and manual states have the same structure and a checkpoint of
    one restores into the other."""
    if tcfg.optimizer == "sgd":
        return optax.sgd(lr_schedule(tcfg))
    logical = model_state.logical_axes(cfg)
    decay_mask = jax.tree.map(
        lambda names: "norm" not in names, logical, is_leaf=lambda x: isinstance(x, tuple)
    )
    return optax.adamw(
        lr_schedule(tcfg), b1=tcfg.b1, b2=tcfg.b2, weight_decay=tcfg.weight_decay, mask=decay_mask
    )


def clip_by_global_norm(grads, g_norm, max_norm: float):
    """optax.clip_by_global_norm's formula, with the (pre-clip) global norm supplied."""
    if max_norm <= 0:
        return grads
    trigger = g_norm < max_norm
    return jax.tree.map(
        lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm), grads
    )


def opt_layout(tx, cfg: ModelConfig, param_layout, scalar_layout):
    """The optimizer state's layout (shardings or PartitionSpecs): every moment takes its
    parameter's, counters take `scalar_layout`. Set structurally: left to the compiler, an init
    that only calls zeros_like may come out replicated (8x the bytes under ZeRO-3)."""
    abstract = jax.eval_shape(tx.init, model_state.abstract_params(cfg))
    return optax.tree_map_params(
        tx,
        lambda _, layout: layout,
        abstract,
        param_layout,
        transform_non_params=lambda _: scalar_layout,
        is_leaf=lambda x: isinstance(x, P),
    )
