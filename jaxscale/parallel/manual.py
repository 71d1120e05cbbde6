"""Build a manual training step: DP or ZeRO-1/2/3 over the data axes, composed with Megatron
tensor parallelism over `tensor` when the mesh has it. One shard_map, every collective explicit.

    step(state, batch [B_data, T+1]) -> (state, {"loss", "grad_norm", "lr"})

The state is the auto path's ({"step", "params", "opt_state"}) in the strategy's own layout, so
the same reference, checkpoints and reports apply.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.model import state as model_state
from jaxscale.parallel import common, dp, zero
from jaxscale.sharding import RULES, Sharder
from jaxscale.train import step as train_step

DP_RULES = tuple({**RULES, "embed": ()}.items())  # params whole on every data shard


def build(cfg: ModelConfig, tcfg: TrainConfig, mesh, *, stage: int = 0,
          tp_mode: str | None = None, dp_variant: str = "explicit",
          with_grads: bool = False) -> common.ManualStep:  # fmt: skip
    if stage not in zero.STAGES:
        raise ValueError(f"unknown ZeRO stage {stage}; choose from {sorted(zero.STAGES)}")
    axes = common.data_axes(mesh)
    n = common.data_size(mesh)
    rows = tcfg.global_batch // max(n, 1)
    if tcfg.global_batch % n or rows % tcfg.grad_accum:
        raise ValueError(
            f"global_batch {tcfg.global_batch} must split into {n} data shards of a multiple of "
            f"grad_accum={tcfg.grad_accum} rows"
        )
    tensor = mesh.shape.get("tensor", 1)
    if tensor > 1 and tp_mode is None:
        tp_mode = "megatron"
    if dp_variant != "explicit" and (stage != 0 or tensor > 1 or tcfg.grad_accum > 1):
        raise ValueError("DP variants other than 'explicit' are for plain DP without accumulation")
    dp_specs = common.param_specs(cfg, Sharder(mesh, DP_RULES))
    z_specs = common.param_specs(cfg, Sharder(mesh, common.ZERO_RULES))
    tx = common.manual_optimizer(tcfg, cfg)
    param_specs = z_specs if stage == 3 else dp_specs
    state_specs = {
        "step": P(),
        "params": param_specs,
        "opt_state": common.opt_specs(tx, cfg, dp_specs if stage == 0 else z_specs),
    }
    batch_spec = P(axes if axes else None, None)
    grad_specs = dp_specs if stage in (0, 1) else z_specs  # the layout the update sees
    metric_specs = {"loss": P(), "grad_norm": P(), "lr": P()}
    if with_grads:
        metric_specs["grads"] = grad_specs
    loss_fn = _loss_fn(cfg, tp_mode, stage, z_specs, axes)
    schedule = train_step.lr_schedule(tcfg)

    def body(state, batch_BT1):
        params = state["params"]
        if stage == 0 and dp_variant != "explicit":
            loss, grads = dp.dp_loss_and_grads(params, batch_BT1, cfg, axes, dp_variant)
        elif stage == 3:
            # params are shards: autodiff of the per-layer all-gathers reduce-scatters the
            # gradients (a sum over the data axes), so only the 1/N remains to apply
            loss, grads = _accumulate(loss_fn, params, batch_BT1, tcfg.grad_accum, axes, False)
            loss, grads = jax.lax.pmean(loss, axes), jax.tree.map(lambda g: g / n, grads)
        else:
            loss, local = _accumulate(loss_fn, params, batch_BT1, tcfg.grad_accum, axes, True)
            loss, grads = jax.lax.pmean(loss, axes), zero.reduce_grads(stage, local, z_specs,
                                                                       axes, n)  # fmt: skip
        g_norm = jnp.sqrt(common.global_sq_norm(grads, grad_specs))
        raw_grads = grads
        grads = common.clip_by_global_norm(grads, g_norm, tcfg.grad_clip)
        new_params, opt_state = zero.update(stage, tx, grads, state["opt_state"], params,
                                            z_specs, axes)  # fmt: skip
        metrics = {"loss": loss, "grad_norm": g_norm, "lr": schedule(state["step"])}
        if with_grads:
            metrics["grads"] = raw_grads
        return {"step": state["step"] + 1, "params": new_params, "opt_state": opt_state}, metrics

    sharded = jax.shard_map(body, mesh=mesh, in_specs=(state_specs, batch_spec),
                            out_specs=(state_specs, metric_specs), check_vma=True)  # fmt: skip
    name = ("dp" if stage == 0 else f"zero{stage}") + (f"+tp:{tp_mode}" if tp_mode else "")
    shardings = common.named_shardings(mesh, state_specs)

    def init():
        params = model_state.init_params(cfg, tcfg.seed)
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    return common.ManualStep(
        name, mesh, state_specs, batch_spec,
        step=jax.jit(sharded, donate_argnums=0),
        init=jax.jit(init, out_shardings=shardings),
        grad_specs=grad_specs,
    )  # fmt: skip


def _loss_fn(cfg, tp_mode, stage, z_specs, axes):
    hooks = {}
    if stage == 3:
        hooks["layer_hook"] = zero.layer_gather_hook(zero.layer_specs_of(z_specs), axes)
        top_specs = {k: v for k, v in z_specs.items() if k != "blocks"}
        hooks["top_hook"] = zero.top_gather_hook(top_specs, axes)
    if tp_mode is None:
        return lambda p, b: common.local_loss(p, b, cfg, **hooks)
    from jaxscale.parallel import tp

    return lambda p, b: tp.tp_loss(p, b, cfg, axis="tensor", mode=tp_mode, **hooks)


def _accumulate(loss_fn, params, batch_BT1, grad_accum, axes, unreduced: bool):
    """Per-shard loss and gradient summed over microbatches. `unreduced`: differentiate w.r.t. a
    varying copy of the (replicated) params so no collective is inserted until the caller's."""
    if unreduced:
        return dp.local_grads(params, batch_BT1, None, axes, grad_accum, loss_fn=loss_fn)
    if grad_accum == 1:
        return jax.value_and_grad(loss_fn)(params, batch_BT1)
    B = batch_BT1.shape[0]
    micro_MBT1 = batch_BT1.reshape(B // grad_accum, grad_accum, -1).swapaxes(0, 1)

    def body(carry, micro_BT1):
        return jax.tree.map(jnp.add, carry, jax.value_and_grad(loss_fn)(params, micro_BT1)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    loss0 = jax.lax.pcast(jnp.zeros((), jnp.float32), axes, to="varying")
    (loss, grads), _ = jax.lax.scan(body, (loss0, zeros), micro_MBT1)
    return loss / grad_accum, jax.tree.map(lambda g: g / grad_accum, grads)
