"""The device side of the pipe axis: a `Plan` executed in one jitted SPMD program.

Per tick, each device runs one branch of a `lax.switch` on its pipe index (the branch and its
numbers are the tick's `tick_data` column for this device). A tick's program is static -- unrolled,
or one tick of a loop body -- so each tick's `ppermute`s name exactly the (source, target) pairs
that send then, and the compiled program's collective census counts every transfer.

Backward by recompute: a stage keeps only its inputs (the stash) and B / W re-run the stage's
forward inside `jax.vjp`. Every buffer has one shape on every device (SPMD), so the stash is
sized for the busiest stage. A transfer is stored at the start of the next tick's branch, so each
tick is one conditional that takes the previous tick's transfers and the gradient accumulators
together: the compiler cannot run the sends of later ticks ahead of the gradient work and hold
their inputs, which is what keeps 1F1B's compiled temporaries flat as M grows (`jaxscale bench
pipeline` measures it).

Under `check_vma`, the transpose of a replicated input inserts a psum; inside a branch that only
some pipe devices take, that would be a collective half the devices never reach. So the
parameters enter the schedule as *varying* over pipe and the data axes (`pcast`, no data moves)
and every cross-device sum is written after the loop (`_reduce`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale import compat
from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model.pieces import Pieces
from jaxscale.parallel import common
from jaxscale.parallel.pp.plan import AXIS, Plan, Segment, tick_data, tick_shape


def accumulate(
    params,
    batch_BT1,
    *,
    plan: Plan,
    cfg: ModelConfig,
    pc: Pieces,
    data_axes,
    unreduced: bool,
    zero_specs=None,
    mean_over: tuple = (),
):
    """Mean loss and gradient of this data shard's rows [B_data, T+1] over the plan's M
    microbatches, in `common.accumulate`'s contract: unreduced over the data axes (stages 0-2),
    or reduced as ZeRO-3's autodiff would (sharded leaves reduce-scattered by the transpose of
    their all-gathers, replicated leaves all-reduced here). Gradient accumulation IS the
    microbatching: there is no second loop."""
    env, carry = _setup(params, batch_BT1, plan, cfg, pc, data_axes, mean_over)
    carry = _run_segments(env, carry)
    return _reduce(carry, data_axes, unreduced, zero_specs, mean_over)


@dataclass(frozen=True, eq=False)
class Env:
    """What every op of one step reads, fixed before the first tick: this device's parameters
    and microbatches, and the buffers' types (the zeros every branch returns in place of what
    it does not compute, so all branches of a switch have one type)."""

    plan: Plan
    cfg: ModelConfig
    pc: Pieces
    d: jax.Array  # this device's index on the pipe axis
    top: dict  # embedding, final norm, head: replicated over pipe, varying (pcast)
    blocks_v: dict  # this device's layers as v chunks: [v, L/(vP), ...] per leaf
    micro_MBT1: jax.Array  # the data shard's rows by microbatch
    act_axes: set  # what a stage output varies over
    loss_axes: set  # what the loss accumulator varies over
    zero_act: jax.Array  # [B_m, T, D]
    zero_loss: jax.Array
    zero_top: dict
    seed_cot: jax.Array  # d(mean loss)/d(one microbatch's loss)
    # one branch function per kind of op, shared by every tick: `lax.switch` then traces a
    # kind's branch once per step, not once per tick (its jaxpr cache is keyed on the function)
    branches: dict = field(default_factory=dict)

    def branch(self, kind: str):
        if kind not in self.branches:
            self.branches[kind] = partial(_branch, self, kind)
        return self.branches[kind]

    @property
    def moe(self) -> bool:
        return bool(self.cfg.n_experts)

    @property
    def microbatches(self) -> int:
        return self.plan.config.microbatches


# --- setup: the parameters' and buffers' forms ------------------------------------------------


def _setup(params, batch_BT1, plan, cfg, pc, data_axes, mean_over) -> tuple[Env, dict]:
    """The step's constants (`Env`) and the loop's initial state (`_zero_carry`). No collectives
    (`pcast` moves no data)."""
    v, M = plan.config.virtual_stages, plan.config.microbatches
    d = jax.lax.axis_index(AXIS)
    params = jax.tree.map(lambda x: _vary(x, (AXIS, *data_axes)), params)
    top, blocks = pieces.split_params(params)
    blocks_v = jax.tree.map(lambda a: a.reshape(v, a.shape[0] // v, *a.shape[1:]), blocks)
    B = batch_BT1.shape[0]
    micro_MBT1 = batch_BT1.reshape(B // M, M, -1).swapaxes(0, 1)  # rows m, m+M, ... = mb m
    act, act_axes, zero_act, loss_axes = _buffer_types(top, blocks_v, micro_MBT1, cfg, pc)
    zero_loss = _vary(jnp.zeros((), jnp.float32), loss_axes)
    zero_top = jax.tree.map(jnp.zeros_like, top)
    carry = _zero_carry(plan, act, act_axes, blocks_v, zero_top, zero_loss)
    # d(mean over microbatches and the expert and context axes' shards)/d(loss_m): their
    # shards' gradients of replicated parameters autodiff sums (parallel/ep.py, cp/)
    shards = math.prod(n for _, n in mean_over)
    seed_cot = _vary(jnp.full((), 1.0 / (M * shards), jnp.float32), loss_axes)
    env = Env(
        plan,
        cfg,
        pc,
        d,
        top,
        blocks_v,
        micro_MBT1,
        act_axes,
        loss_axes,
        zero_act,
        zero_loss,
        zero_top,
        seed_cot,
    )
    return env, carry


def _zero_carry(plan: Plan, act, act_axes, blocks_v, zero_top, zero_loss) -> dict:
    """The loop's state before the first tick: the stash and received-gradient buffers
    [v, S, B_m, T, D], the gradient accumulators and the loss, all zero."""
    v = plan.config.virtual_stages
    return {
        "stash": _vary(jnp.zeros((v, plan.stash_slots, *act.shape), act.dtype), act_axes),
        "grad": _vary(jnp.zeros((v, plan.grad_slots, *act.shape), act.dtype), act_axes),
        "g_blocks": jax.tree.map(jnp.zeros_like, blocks_v),
        "g_top": zero_top,
        "loss": zero_loss,
    }


def _buffer_types(top, blocks_v, micro_MBT1, cfg, pc):
    """The buffers' types, from what the first stage's forward makes (traced, not run): the
    stage output `act` and the axes it varies over (with pipe), a zero of it, and the axes the
    loss accumulator varies over."""
    chunk, tokens_BT1 = _chunk_at(blocks_v, 0), micro_MBT1[0]
    act, aux_t = jax.eval_shape(
        lambda c, t, tok: _stage(cfg, pc, True, t, c, None, tok),
        chunk,
        top,
        tokens_BT1,
    )
    act_axes = compat.varying_axes(act) | {AXIS}
    zero_act = _vary(jnp.zeros(act.shape, act.dtype), act_axes)
    loss_t = jax.eval_shape(
        lambda t, x, tok: _head_loss(t, x, tok, cfg, pc), top, zero_act, tokens_BT1
    )
    # the loss accumulator takes every stage's router losses too: one type for all of them
    loss_axes = (
        compat.varying_axes(loss_t)
        | {AXIS}
        | (compat.varying_axes(aux_t) if cfg.n_experts else set())
    )
    return act, act_axes, zero_act, loss_axes


# --- the model's parts, as a stage runs them --------------------------------------------------


def _stage(cfg, pc, first, top, chunk, x_BTD, tokens_BT1, act_axes=None):
    """A virtual stage as the model's one skeleton (`pieces.trunk`) on its chunk of layers,
    with its embed piece replaced: the embedding on the first virtual stage, what arrived on
    the others (`first`: a Python bool where it is known, else traced). ZeRO-3's gathers of the
    embedding run only where it is used. Returns (stage output [B_m, T, D], its MoE layers'
    share of the router losses or None)."""

    def embed(t, tokens_BT, *_):
        if first is True:
            return pc.embed(pc.top_hook(t), tokens_BT, cfg, pc)
        if first is False:
            return x_BTD
        return jax.lax.cond(
            first,
            lambda: _vary(pc.embed(pc.top_hook(t), tokens_BT, cfg, pc), act_axes),
            lambda: x_BTD,
        )

    stage_pc = pc.replace(embed=embed, top_hook=pieces.DENSE.top_hook)
    params = {**top, "blocks": chunk}
    inputs_BT, _, positions_T = pc.window(tokens_BT1)
    _, y_BTD, stats, _ = pieces.trunk(params, inputs_BT, positions_T, cfg, stage_pc)
    return (y_BTD, pieces.router_loss(stats, cfg)) if cfg.n_experts else (y_BTD, None)


def _head_loss(top, y_BTD, tokens_BT1, cfg, pc):
    """The last virtual stage's output: the microbatch's loss."""
    _, targets_BT, _ = pc.window(tokens_BT1)
    return pieces.head_loss(pc.top_hook(top), y_BTD, targets_BT, cfg, pc)


def _chunk_at(blocks_v, c):
    """Chunk `c`'s layers, [L/(vP), ...] per leaf (`c` may be traced)."""
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, c, keepdims=False), blocks_v)


# --- one op of one device ---------------------------------------------------------------------


def _core(env: Env, first, top, chunk, x_BTD, tokens_BT1):
    """`_stage`, typed for the carry (the router losses as the loss)."""
    y_BTD, aux = _stage(env.cfg, env.pc, first, top, chunk, x_BTD, tokens_BT1, env.act_axes)
    return _vary(y_BTD, env.act_axes), (_vary(aux, env.loss_axes) if env.moe else None)


def _core_cot(env: Env, dy_BTD):
    """The cotangent of `_core`'s outputs: every stage's share of the router losses enters the
    mean, so it is seeded like the loss."""
    return (dy_BTD, env.seed_cot) if env.moe else (dy_BTD, None)


def _output_cot(env: Env, last, top, y_BTD, cot_BTD, tokens_BT1, with_top: bool):
    """d(loss)/d(stage output): through the head and loss on the last stage (and the head's
    parameter gradient), else what the next stage sent."""
    through_head = partial(_through_head, env, top, y_BTD, tokens_BT1, with_top)
    return jax.lax.cond(last, through_head, lambda: (cot_BTD, env.zero_top))


def _through_head(env: Env, top, y_BTD, tokens_BT1, with_top: bool):
    """The last stage's output cotangent, and the head's parameter gradient (zero unless
    `with_top`)."""
    cfg, pc = env.cfg, env.pc
    if not with_top:
        vjp = jax.vjp(lambda y: _head_loss(top, y, tokens_BT1, cfg, pc), y_BTD)[1]
        return vjp(env.seed_cot)[0], env.zero_top
    vjp = jax.vjp(lambda t, y: _head_loss(t, y, tokens_BT1, cfg, pc), top, y_BTD)[1]
    g_top, dy_BTD = vjp(env.seed_cot)
    return dy_BTD, g_top


def _op(env: Env, kind, small, x_BTD, cot_BTD, mb, c, role):
    """One op of this device, for any role: the embedding (first virtual stage) and the head
    and loss (last) are small conditionals around the stage's layers, so a tick compiles one
    copy of the layers per kind of op, whatever roles the devices play. Returns the updated
    accumulators and what to send forward and backward (zeros where nothing is sent)."""
    tokens_BT1 = jax.lax.dynamic_index_in_dim(env.micro_MBT1, mb, keepdims=False)
    chunk = _chunk_at(env.blocks_v, c)
    first, last = role == 0, role == 2
    if kind == "F":
        return _forward(env, small, chunk, x_BTD, tokens_BT1, first, last)
    if kind == "W" or not env.plan.split:  # weight gradients (and, for B, the input gradient)
        return _weight_grad(env, kind, small, chunk, c, x_BTD, cot_BTD, tokens_BT1, first, last)
    # ZB-H1's B: the input gradient only (the first stage has none)
    input_grad = partial(_input_grad, env, chunk, x_BTD, cot_BTD, tokens_BT1, last)
    return small, env.zero_act, jax.lax.cond(first, lambda: env.zero_act, input_grad)


def _forward(env: Env, small, chunk, x_BTD, tokens_BT1, first, last):
    """F: the stage's forward; the last stage adds its loss, the others send their output."""
    y_BTD, aux = _core(env, first, env.top, chunk, x_BTD, tokens_BT1)
    loss, send_BTD = jax.lax.cond(
        last,
        lambda: (
            _vary(_head_loss(env.top, y_BTD, tokens_BT1, env.cfg, env.pc), env.loss_axes),
            env.zero_act,
        ),
        lambda: (env.zero_loss, y_BTD),
    )
    loss = loss + aux if env.moe else loss
    return {**small, "loss": small["loss"] + loss / env.microbatches}, send_BTD, env.zero_act


def _weight_grad(env: Env, kind, small, chunk, c, x_BTD, cot_BTD, tokens_BT1, first, last):
    """W, or B when the backward is not split: the stage's forward recomputed inside `jax.vjp`,
    its parameter gradients added to the accumulators and (for B) the input gradient sent."""
    y, vjp_stage = jax.vjp(
        lambda t, ch, x: _core(env, first, t, ch, x, tokens_BT1), env.top, chunk, x_BTD
    )
    dy, g_head = _output_cot(env, last, env.top, y[0], cot_BTD, tokens_BT1, with_top=True)
    g_embed, g_chunk, dx_in = vjp_stage(_core_cot(env, dy))
    small = dict(small)
    small["g_blocks"] = jax.tree.map(lambda acc, g: acc.at[c].add(g), small["g_blocks"], g_chunk)
    small["g_top"] = jax.tree.map(lambda acc, a, b: acc + a + b, small["g_top"], g_head, g_embed)
    return small, env.zero_act, env.zero_act if kind == "W" else _vary(dx_in, env.act_axes)


def _input_grad(env: Env, chunk, x_BTD, cot_BTD, tokens_BT1, last):
    """ZB-H1's B on a stage past the first: the input gradient alone, no parameter gradient."""
    y, vjp_core = jax.vjp(lambda x: _core(env, False, env.top, chunk, x, tokens_BT1), x_BTD)
    dy, _ = _output_cot(env, last, env.top, y[0], cot_BTD, tokens_BT1, with_top=False)
    return _vary(vjp_core(_core_cot(env, dy))[0], env.act_axes)


# --- ticks and segments -----------------------------------------------------------------------


def _branch(env: Env, kind, carry, got, where):
    """The `lax.switch` branch of one kind of op ("idle" too): store last tick's receives, then
    run the op on this device's stash and gradient slots. No collectives."""
    # last tick's receives are stored here, inside this tick's branch: every tick is then
    # one conditional that consumes the previous tick's transfers and the accumulators
    # together, so the compiler cannot run the sends ahead of the gradient work and
    # hold their inputs (optimisation barriers are dropped on CPU) -- what keeps 1F1B's
    # temporaries flat in M
    stash, grad = carry["stash"], carry["grad"]
    if got["fwd"] is not None:
        stash = _store(stash, got["fwd"], where["fwd"])
    if got["bwd"] is not None:
        grad = _store(grad, got["bwd"], where["bwd"])
    if kind == "idle":
        return {**carry, "stash": stash, "grad": grad}, env.zero_act, env.zero_act
    role, mb, c, s_slot, g_slot = where["op"]
    small = {k: carry[k] for k in ("g_blocks", "g_top", "loss")}
    small, fwd, bwd = _op(env, kind, small, stash[c, s_slot], grad[c, g_slot], mb, c, role)
    return {**small, "stash": stash, "grad": grad}, fwd, bwd


def _tick(env: Env, carry, recv, shape, data_FP):
    """One tick: this device's branch of the tick's `shape` (kinds, sends), storing last
    tick's receives first, then the tick's sends. `data_FP` [FIELDS, P]: the tick's
    per-device numbers (a constant when unrolled, a slice of the scanned array when not).
    Costs one collective-permute per direction that sends this tick (`_send`)."""
    kinds, fwd_pairs, bwd_pairs = shape
    row = data_FP[:, env.d]  # this device's column
    where = {"op": tuple(row[i] for i in range(1, 6))}
    got = {}
    for direction in ("fwd", "bwd"):
        got[direction] = None if recv[direction] is None else recv[direction][0]
        where[direction] = None if recv[direction] is None else recv[direction][1:]
    fns = [env.branch(k) for k in kinds]
    carry, fwd, bwd = jax.lax.switch(row[0], fns, carry, got, where)
    sent = {"fwd": None, "bwd": None}
    if fwd_pairs:  # stage outputs to the next stage
        sent["fwd"] = _send(fwd, fwd_pairs, row, 6)
    if bwd_pairs:  # input gradients to the previous stage
        sent["bwd"] = _send(bwd, bwd_pairs, row, 9)
    return carry, sent


def _send(x_BTD, pairs, row, at: int):
    """One collective-permute of [B_m, T, D] over `pairs`, with where it lands on the receiving
    device: (received, valid, chunk, slot) from `row[at : at + 3]`."""
    return jax.lax.ppermute(x_BTD, AXIS, pairs), row[at].astype(bool), row[at + 1], row[at + 2]


def _nothing(env: Env):
    """An empty receive, typed as a real one (for a scan's carry)."""
    flag = jnp.zeros((env.plan.config.stages,), jnp.int32)[env.d]
    return (env.zero_act, flag.astype(bool), flag, flag)


def _typed(env: Env, recv: dict) -> dict:
    """`recv` with every missing direction an empty receive (`_nothing`)."""
    return {k: _nothing(env) if r is None else r for k, r in recv.items()}


def _run_segments(env: Env, carry):
    """Every tick of the plan, in order: each segment unrolled or as one `lax.scan`."""
    recv = {"fwd": None, "bwd": None}
    for seg in env.plan.segments():
        carry, recv = _run_segment(env, seg, carry, recv)
    # the schedule ends on the first stage's backward, which sends nothing: no receive is left
    last = env.plan.ticks[-1]
    assert not last.fwd and not last.bwd, "the plan's last tick sends"
    return carry


def _run_segment(env: Env, seg: Segment, carry, recv):
    """One segment: a lone tick, or `period` ticks repeated `reps` times as a loop."""
    plan = env.plan
    ticks = plan.ticks[seg.start : seg.start + seg.period * seg.reps]
    shapes = [tick_shape(t) for t in ticks[: seg.period]]
    data = np.stack([tick_data(t, shapes[i % seg.period][0]) for i, t in enumerate(ticks)])
    if seg.reps == 1:
        return _tick(env, carry, recv, shapes[0], jnp.asarray(data[0]))
    # the steady state: `period` ticks that repeat `reps` times with the same branches and
    # sends, differing only in numbers (microbatch, slots) -- one loop body, compiled once;
    # the census multiplies its collective-permutes by the trip count
    recv = _typed(env, recv)
    data = jnp.asarray(data.reshape(seg.reps, seg.period, *data.shape[1:]))
    (carry, recv), _ = jax.lax.scan(partial(_loop_body, env, shapes), (carry, recv), data)
    return carry, recv


def _loop_body(env: Env, shapes, state, data_KFP):
    """The scanned unit: its ticks in order, each receive typed for the carry."""
    carry, recv = state
    for shape, data_FP in zip(shapes, data_KFP, strict=True):
        carry, recv = _tick(env, carry, recv, shape, data_FP)
        recv = _typed(env, recv)
    return (carry, recv), None


# --- after the schedule -----------------------------------------------------------------------


def _reduce(carry, data_axes, unreduced: bool, zero_specs, mean_over: tuple):
    """The loss and gradients out of the accumulators. Collectives: an all-reduce over pipe of
    the top-level gradients and of the loss, one over `expert` and `context` of the loss
    and, for ZeRO-3, all-reduces over the data axes of the replicated leaves' gradients."""
    g_blocks = jax.tree.map(lambda g: g.reshape(-1, *g.shape[2:]), carry["g_blocks"])
    # all-reduce over pipe: the embedding's gradient is on the first stage, the head's on the last
    g_top = jax.lax.psum(carry["g_top"], AXIS)
    loss = jax.lax.psum(carry["loss"], AXIS)  # all-reduce of the scalar: only the last has it
    for axis, n in mean_over:  # the mean over expert / context shards (all-reduce of the scalar)
        loss = jax.lax.psum(loss / n, axis)
    grads = {**g_top, "blocks": g_blocks}
    if not unreduced and data_axes:  # ZeRO-3: replicated leaves' gradients summed here
        grads = jax.tree.map(
            lambda g, s: (
                g if common.sharded_dim(s, data_axes) is not None else jax.lax.psum(g, data_axes)
            ),
            grads,
            zero_specs,
        )
    return loss, grads


def _store(buf, got, where):
    """Store a received [B_m, T, D] into buf[chunk, slot] on the devices that receive it."""
    valid, c, s = where
    return buf.at[c, s].set(jnp.where(valid, got, buf[c, s]))


def _vary(x, axes):
    """pcast `x` to varying over those of `axes` it does not vary over yet (identity forward)."""
    missing = tuple(a for a in axes if a not in compat.varying_axes(jax.typeof(x)))
    return jax.lax.pcast(x, missing, to="varying") if missing else x
