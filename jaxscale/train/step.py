"""The auto path: one jitted training step whose collectives GSPMD places from the shardings.

State is a plain dict {"step", "params", "opt_state"}; batches are int32 [B, T+1] token windows.
The same functions, called with `sharder=None` on one device, are the single-device reference
that every strategy is checked against.
"""

from __future__ import annotations

from functools import cache

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.model import pieces
from jaxscale.model import state as model_state
from jaxscale.sharding import Sharder


def auto_pieces(sharder: Sharder | None) -> pieces.Pieces:
    """The model's pieces on the auto path: the single-device pieces plus sharding constraints
    at block boundaries (GSPMD places the collectives); `sharder=None` is the reference."""
    return pieces.DENSE if sharder is None else pieces.DENSE.replace(constrain=sharder.constrain)


def loss_fn(params, batch_BT1, cfg: ModelConfig, sharder: Sharder | None = None):
    return pieces.loss(params, batch_BT1, cfg, auto_pieces(sharder))


def loss_and_grads(params, batch_BT1, cfg, sharder=None, grad_accum: int = 1):
    """Mean loss and gradient over the batch, accumulated over `grad_accum` microbatches.

    Microbatch m takes rows m, m+M, m+2M, ... so each device's rows split evenly without moving
    data. The gradient is summed locally across microbatches; under data parallelism the one
    cross-device reduction happens once per step, on the sum (GSPMD places it after the scan).
    """
    if grad_accum == 1:
        return jax.value_and_grad(loss_fn)(params, batch_BT1, cfg, sharder)
    B = batch_BT1.shape[0]
    micro_MBT1 = batch_BT1.reshape(B // grad_accum, grad_accum, -1).swapaxes(0, 1)

    def body(carry, micro_BT1):
        loss_sum, grad_sum = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, micro_BT1, cfg, sharder)
        return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (loss_sum, grad_sum), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro_MBT1)
    return loss_sum / grad_accum, jax.tree.map(lambda g: g / grad_accum, grad_sum)


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


def init_state(cfg: ModelConfig, tcfg: TrainConfig, sharder: Sharder | None = None):
    """Fresh training state, initialised directly in its sharded layout."""
    tx = make_optimizer(tcfg, cfg)

    def init():
        params = model_state.init_params(cfg, tcfg.seed)
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    if sharder is None:
        return jax.jit(init)()
    return jax.jit(init, out_shardings=state_shardings(cfg, tcfg, sharder))()


@cache  # configs and the Sharder are hashable; compile the shardings probe once
def state_shardings(cfg: ModelConfig, tcfg: TrainConfig, sharder: Sharder):
    """Shardings of the whole state: optimizer moments follow their parameters (ZeRO-3 under
    fsdp: params, Adam m and v all sharded alike); scalars are replicated."""
    param_sh = model_state.param_shardings(cfg, sharder)
    replicated = sharder.named(())
    opt_sh = opt_layout(make_optimizer(tcfg, cfg), cfg, param_sh, replicated)
    return {"step": replicated, "params": param_sh, "opt_state": opt_sh}


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


def batch_sharding(sharder: Sharder):
    return sharder.named(("batch", None))


def train_step(
    state, batch_BT1, cfg: ModelConfig, tcfg: TrainConfig, sharder=None, with_grads: bool = False
):
    """One optimizer step. Returns (new state, metrics {loss, grad_norm, lr}); with_grads adds
    the step's (pre-clip) mean gradient, so one compiled program serves the equivalence check."""
    tx = make_optimizer(tcfg, cfg)
    loss, grads = loss_and_grads(state["params"], batch_BT1, cfg, sharder, tcfg.grad_accum)
    g_norm = optax.tree.norm(grads)
    clipped = clip_by_global_norm(grads, g_norm, tcfg.grad_clip)
    updates, opt_state = tx.update(clipped, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = {"loss": loss, "grad_norm": g_norm, "lr": lr_schedule(tcfg)(state["step"])}
    if with_grads:
        metrics["grads"] = grads
    return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics


@cache  # one compiled step per (model, run, mesh), reused by every caller
def jit_train_step(
    cfg: ModelConfig, tcfg: TrainConfig, sharder: Sharder | None = None, with_grads: bool = False
):
    """The compiled-once step; the old state's buffers are donated to the new one."""

    def step(state, batch):
        return train_step(state, batch, cfg, tcfg, sharder, with_grads)

    if sharder is None:
        return jax.jit(step, donate_argnums=0)
    state_sh = state_shardings(cfg, tcfg, sharder)
    rep = sharder.named(())
    metrics_sh = {"loss": rep, "grad_norm": rep, "lr": rep}
    if with_grads:
        metrics_sh["grads"] = state_sh["params"]
    return jax.jit(
        step,
        in_shardings=(state_sh, batch_sharding(sharder)),
        out_shardings=(state_sh, metrics_sh),
        donate_argnums=0,
    )


def greedy_sample(cfg: ModelConfig, params, prompt_ids, n_new: int):
    """Greedy continuation of `prompt_ids` (no KV cache: the tiny model recomputes the prefix).

    One fixed-shape buffer and a fori_loop, so it compiles once whatever the prompt."""
    total = min(len(prompt_ids) + n_new, cfg.max_seq)
    start = len(prompt_ids)
    if start == 0 or start >= total:
        raise ValueError(f"prompt of {start} tokens leaves no room below max_seq={cfg.max_seq}")
    buf_1T = jnp.zeros((1, total), jnp.int32).at[0, :start].set(jnp.asarray(prompt_ids))

    @jax.jit
    def run(params, buf_1T):
        def body(i, buf_1T):
            logits_1TV = pieces.logits(params, buf_1T, cfg)
            return buf_1T.at[0, i].set(jnp.argmax(logits_1TV[0, i - 1]).astype(jnp.int32))

        return jax.lax.fori_loop(start, total, body, buf_1T)

    return [int(t) for t in run(params, buf_1T)[0, start:]]
