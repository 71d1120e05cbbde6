"""The manual path: one `jax.shard_map` over the whole mesh with every collective written.

Composed in a fixed order, as picotron composes `apply_tensor_parallel -> PipelineParallel ->
DataParallel`: each axis module substitutes its model pieces through the one interface
(`pieces(pc, comp)`: tensor, experts, the data axes' ZeRO-3 gathers, the pipe axis), the pipe
axis's schedule replaces the microbatch loop, and the data axes wrap the local gradient in their
reduction and optimizer update (parallel/zero.py, DP being stage 0). The predictions of the axes
(`predict_comm(shape, comp)`) are summed the same way.

Shapes: the batch [B, T+1] enters as [B_data, T+1] per device (split over the data axes and
`expert`); parameters, gradients and optimizer state in the ZeRO stage's layout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale import compat
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.model import pieces
from jaxscale.model import state as model_state
from jaxscale.parallel import buckets, common, cp, ep, optim, pp, tp, zero
from jaxscale.sharding import REPLICATED_RULES, ZERO_RULES, Sharder

AXIS_MODULES = (tp, ep, cp, zero, pp)  # the order their pieces compose in


@dataclass(frozen=True, eq=False)
class Manual:
    """A manual strategy on its mesh: the composition, the model pieces it makes, and the
    layouts (PartitionSpecs) of what the step reads and writes."""

    comp: common.Composition
    tcfg: TrainConfig
    pc: pieces.Pieces
    tx: object  # the optax optimizer
    state_specs: dict
    grad_specs: dict  # the layout the update sees
    batch_axes: tuple  # the data axes, and `expert` when it splits the batch

    @property
    def batch_spec(self) -> P:
        return P(self.batch_axes if self.batch_axes else None, None)


def compose(strategy, mesh, ways: dict, cfg: ModelConfig, tcfg: TrainConfig) -> Manual:
    """Check the model against the axes, lay out the state and chain the axes' pieces."""
    if strategy.schedule:
        pp.check_layers(cfg, ways["pipe"], strategy.virtual_stages)
    if strategy.tensor:
        tp.check_tp_layout(cfg, ways["tensor"], mode=strategy.tensor, seq_len=tcfg.seq_len)
    if strategy.context:
        c, form, split = ways["context"], strategy.context, strategy.cp_split
        cp.check(cfg, c, form, split, tcfg.seq_len, ways["tensor"])
    axes = common.data_axes(mesh)  # the ZeRO group; the batch is also split over `expert`
    dp_specs = common.param_specs(cfg, Sharder(mesh, REPLICATED_RULES))
    z_specs = common.param_specs(cfg, Sharder(mesh, ZERO_RULES))
    plan = strategy.schedule and pp.make_plan(
        ways["pipe"], strategy.microbatches, strategy.schedule, strategy.virtual_stages
    )
    comp = common.Composition(
        cfg,
        ways,
        strategy.zero,
        strategy.tensor,
        axes,
        z_specs,
        plan or None,
        strategy.context,
        strategy.cp_split,
        strategy.grad_buckets,
    )
    pc = pieces.DENSE
    for axis in AXIS_MODULES:
        pc = axis.pieces(pc, comp)
    pc = buckets.pieces(pc, comp)  # where DP's all-reduce sits; its bytes are zero.py's
    stage, tx = strategy.zero, optim.make_optimizer(tcfg, cfg)
    state_specs = {
        "step": P(),
        "params": z_specs if stage == 3 else dp_specs,
        "opt_state": optim.opt_layout(tx, cfg, dp_specs if stage == 0 else z_specs, P()),
    }
    grad_specs = dp_specs if stage in (0, 1) else z_specs
    batch_axes = (*axes, ep.AXIS) if comp.ep > 1 else axes
    return Manual(comp, tcfg, pc, tx, state_specs, grad_specs, batch_axes)


# --- the step, one shard's view -----------------------------------------------------------------


def local_loss(m: Manual, params, rows_BT1):
    """This data shard's mean loss (the mean over the expert and context axes' shards: one
    all-reduce of the scalar each); tensor parallelism's collectives are inside the pieces."""
    loss_fn = ep.local_loss(lambda p, r: pieces.loss(p, r, m.comp.cfg, m.pc), m.comp.ep)
    return cp.local_loss(loss_fn, m.comp.cp)(params, rows_BT1)


def local_grads(m: Manual, params, batch_BT1, unreduced: bool):
    """This shard's mean loss and gradient: the microbatch loop, or the pipeline schedule."""
    comp = m.comp
    if comp.plan is None:
        loss_fn = partial(local_loss, m)
        reduced = buckets.REDUCED_IN_BACKWARD if comp.grad_buckets else ()
        return common.accumulate(
            loss_fn, params, batch_BT1, m.tcfg.grad_accum, comp.data_axes, unreduced, reduced
        )
    return _schedule(m, params, batch_BT1, comp.plan, unreduced, comp.zero_specs)


def _schedule(m: Manual, params, batch_BT1, plan, unreduced: bool, zero_specs=None):
    """The pipe axis's schedule `plan` on this shard's rows (parallel/pp/execute.py)."""
    comp = m.comp
    return pp.accumulate(
        params,
        batch_BT1,
        plan=plan,
        cfg=comp.cfg,
        pc=m.pc,
        data_axes=comp.data_axes,
        unreduced=unreduced,
        zero_specs=zero_specs,
        mean_over=tuple((a, n) for a, n in ((ep.AXIS, comp.ep), (cp.AXIS, comp.cp)) if n > 1),
    )


def loss_and_grads(m: Manual, params, batch_BT1):
    """The data axes' reduction around the local gradient (parallel/zero.py)."""
    comp = m.comp
    return zero.loss_and_grads(
        params,
        batch_BT1,
        stage=comp.stage,
        zero_specs=comp.zero_specs,
        axes=comp.data_axes,
        n=comp.n,
        local=partial(local_grads, m),
        reduced=buckets.REDUCED_IN_BACKWARD if comp.grad_buckets else (),
    )


def train_step(m: Manual, with_grads: bool, state, batch_BT1):
    """One step: gradients, their global norm (psums of per-leaf sums), clipping, and the
    update in the ZeRO stage's layout."""
    tcfg, comp = m.tcfg, m.comp
    params = state["params"]
    loss, grads = loss_and_grads(m, params, batch_BT1)
    g_norm = jnp.sqrt(common.global_sq_norm(grads, m.grad_specs))
    clipped = optim.clip_by_global_norm(grads, g_norm, tcfg.grad_clip)
    new_params, opt_state = zero.update(
        comp.stage, m.tx, clipped, state["opt_state"], params, comp.zero_specs, comp.data_axes
    )
    metrics = {"loss": loss, "grad_norm": g_norm, "lr": optim.lr_schedule(tcfg)(state["step"])}
    if with_grads:
        metrics["grads"] = grads
    return {"step": state["step"] + 1, "params": new_params, "opt_state": opt_state}, metrics


def mean_loss(m: Manual, params, batch_BT1):
    """The forward only; one all-reduce of the scalar."""
    comp = m.comp
    if comp.plan is None:
        return jax.lax.pmean(local_loss(m, params, batch_BT1), comp.data_axes)
    loss, _ = _schedule(m, params, batch_BT1, pp.forward_plan(comp.plan), unreduced=True)
    return jax.lax.pmean(loss, comp.data_axes) if comp.data_axes else loss


def local_terms(m: Manual, params, batch_BT1):
    """The loss's terms, averaged over every batch shard."""
    terms = pieces.loss_terms(params, batch_BT1, m.comp.cfg, m.pc)[1]
    axes = (*m.batch_axes, cp.AXIS) if m.comp.cp > 1 else m.batch_axes
    return jax.lax.pmean(terms, axes) if axes else terms


def init(m: Manual):
    params = model_state.init_params(m.comp.cfg, m.tcfg.seed)
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": m.tx.init(params)}


def predict(m: Manual, step_shape, cfg: ModelConfig, batch: int, seq_len: int):
    """({op: bytes per device}, None), the sum of every axis's prediction for `cfg` (the model
    the step runs, or a variant of it: remat, dtype); or (None, why)."""
    comp = dataclasses.replace(m.comp, cfg=cfg)
    if comp.plan is not None:
        return None, (
            "a pipeline's other collectives sit in the schedule's conditionals, where the "
            "census counts each branch once; its transfers are compared with their formula "
            "instead"
        )
    rows, seq_local = batch // (comp.n * comp.ep), seq_len // comp.cp
    shape = step_shape(cfg, rows, seq_local, t=comp.t, ep=comp.ep)
    any_split = (comp.stage in (2, 3) and comp.n > 1) or comp.t > 1 or comp.ep > 1
    parts = [axis.predict_comm(shape, comp) for axis in (zero, tp, ep, cp)]
    return common.add_comm(*parts, common.norm_comm(shape, any_split)), None


# --- jitted, on the mesh --------------------------------------------------------------------------


def functions(m: Manual, mesh, strategy, with_grads: bool) -> dict:
    """The jitted functions and layouts `compose.Built` carries."""

    def shard(fn, in_specs, out_specs):
        if strategy.virtual_stages > 1:  # interleaved: each device's chunks are circular
            return pp.circular_shard_map(fn, mesh, in_specs, out_specs, strategy.virtual_stages)
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)

    pspecs, bspec = m.state_specs["params"], m.batch_spec
    metric_specs = {"loss": P(), "grad_norm": P(), "lr": P()}
    if with_grads:
        metric_specs["grads"] = m.grad_specs
    step = partial(train_step, m, with_grads)
    state_io = ((m.state_specs, bspec), (m.state_specs, metric_specs))
    state_shardings = common.named_shardings(mesh, m.state_specs)
    # a schedule's programs (a conditional per tick) compile faster with XLA's default emitters
    options = compat.pipeline_compiler_options() if m.comp.plan else {}
    jit = partial(jax.jit, compiler_options=options) if options else jax.jit
    return {
        "init": jax.jit(partial(init, m), out_shardings=state_shardings),
        "step": jit(shard(step, *state_io), donate_argnums=0),
        "loss_and_grads": jit(
            shard(partial(loss_and_grads, m), (pspecs, bspec), (P(), m.grad_specs))
        ),
        "loss": jit(shard(partial(mean_loss, m), (pspecs, bspec), P())),
        "terms": None
        if m.comp.plan
        else jax.jit(shard(partial(local_terms, m), (pspecs, bspec), P())),
        "state_shardings": state_shardings,
        "grad_shardings": common.named_shardings(mesh, m.grad_specs),
        "batch_sharding": NamedSharding(mesh, bspec),
        "abstract_state": jax.eval_shape(partial(init, m)),
    }
