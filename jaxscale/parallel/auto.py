"""The auto path: one jitted training step whose collectives GSPMD places from the shardings.

State is a plain dict {"step", "params", "opt_state"}; batches are int32 [B, T+1] token windows.
The same functions, called with `sharder=None` on one device, are the single-device reference
that every strategy is checked against. The optimizer is parallel/optim.py's.
"""

from __future__ import annotations

from functools import cache

import jax
import jax.numpy as jnp
import optax

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.model import pieces
from jaxscale.model import state as model_state
from jaxscale.parallel.optim import clip_by_global_norm, lr_schedule, make_optimizer, opt_layout
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
    if tcfg.offload == "opt_state":  # between steps in host memory (the update moves it in)
        opt_sh = jax.tree.map(lambda s: s.with_memory_kind(HOST), opt_sh)
    return {"step": replicated, "params": param_sh, "opt_state": opt_sh}


HOST = "pinned_host"  # the memory kind offloaded state lives in


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
    opt_state = state["opt_state"]
    if tcfg.offload == "opt_state" and sharder is not None:
        # host -> device for the update (the step's out_shardings move the new state back)
        on_device = state_shardings(cfg, tcfg.replace(offload="none"), sharder)["opt_state"]
        opt_state = jax.device_put(opt_state, on_device)
    updates, opt_state = tx.update(clipped, opt_state, state["params"])
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
