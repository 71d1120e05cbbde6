"""The pipe axis by hand: a static pipeline schedule executed in one jitted SPMD program.

A stage is a contiguous slice of the stacked layers (`layers` -> `pipe` in the rules table): with
P devices on the pipe axis and v virtual stages per device, virtual stage j = chunk * P + device
holds layers [j L/(vP), (j+1) L/(vP)), so device d stores [L/P] layers as v chunks. The embedding
runs inside the first virtual stage and the final norm, unembedding and loss inside the last, so
the microbatch's tokens are all the first stage needs and a scalar loss is what the last makes.
Their parameters are replicated over `pipe` (only the first / last stage touches them) and their
gradients are summed over `pipe` after the schedule: one all-reduce.

The schedule is the simulator's grid (`jaxscale.sim.pipeline.schedule_grid`, t_B = 2 t_F; ZB-H1's
B and W each t_F): grid[device][tick] says which op starts where. `Plan` turns it into a static
program: per tick, each device runs one branch of a `lax.switch` on its pipe index -- idle, F, B
(input and weight gradients; under ZB-H1 the input gradient only) or W (ZB-H1's weight gradient)
-- for the first, a middle or the last virtual stage. The tick loop is unrolled, so each tick's
`ppermute`s name exactly the (source, target) pairs that send then, and the compiled program's
collective census counts every transfer:

  F(j, m) on device d     sends the stage output [B_m, T, D] to device d+1   (collective-permute)
  B(j, m) on device d     sends the input gradient [B_m, T, D] to device d-1 (collective-permute)

Interleaving wraps around: device P-1 sends chunk c's output to device 0's chunk c+1.

Backward by recompute: a stage keeps only its inputs (the stash, [v, S, B_m, T, D]) and B / W
re-run the stage's forward inside `jax.vjp`. The stash has S slots per chunk (microbatch m uses
slot m mod S), the fewest that the schedule never overwrites while live: M for GPipe, P for
1F1B. Received gradients wait in a second buffer of the same form. Every buffer has one shape on
every device (SPMD), so the stash is sized for the busiest stage. A transfer is stored at the
start of the next tick's branch, so each tick is one conditional that takes the previous tick's
transfers and the gradient accumulators together: the compiler cannot run the sends of later
ticks ahead of the gradient work and hold their inputs, which is what keeps 1F1B's compiled
temporaries flat as M grows (`jaxscale bench pipeline` measures it).

Under `check_vma`, the transpose of a replicated input inserts a psum; inside a branch that only
some pipe devices take, that would be a collective half the devices never reach. So the
parameters enter the schedule as *varying* over pipe and the data axes (`pcast`, no data moves)
and every cross-device sum is written after the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale import compat
from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model.pieces import Pieces
from jaxscale.parallel import common
from jaxscale.sim import pipeline as sim

AXIS = "pipe"
FIRST, MID, LAST = "first", "mid", "last"


@dataclass(frozen=True)
class Op:
    kind: str  # "F", "B" (full backward; input gradient only when `split`), "W"
    role: str  # FIRST / MID / LAST virtual stage
    microbatch: int
    chunk: int
    stash_slot: int
    grad_slot: int


@dataclass(frozen=True)
class Tick:
    index: int  # the grid column
    ops: tuple  # per device: Op or None (idle)
    fwd: tuple  # (source, target) pairs sending activations after this tick
    bwd: tuple  # (source, target) pairs sending input gradients
    fwd_recv: tuple  # per device: (chunk, slot) the received activation goes to, or None
    bwd_recv: tuple


@dataclass(frozen=True)
class Segment:
    start: int  # index into Plan.ticks
    period: int  # ticks in the repeated unit
    reps: int  # 1: one tick, unrolled


def tick_shape(tick: Tick) -> tuple:
    """What a tick compiles to: its kinds of op (sorted; a role is data) and its sends. Ticks
    of one shape are one program; only their numbers (`tick_data`) differ. "idle" is always a
    branch: a tick is then always one conditional, which the compiler cannot interleave with
    the next tick's work (a lone branch would be inlined, and later ticks' recomputes hoisted
    ahead, each holding its temporaries)."""
    kinds = tuple(sorted({"idle"} | {"idle" if op is None else op.kind for op in tick.ops}))
    return kinds, tick.fwd, tick.bwd


ROLES = (FIRST, MID, LAST)


def tick_data(tick: Tick, kinds: tuple) -> np.ndarray:
    """int32 [12, P]: per device, the branch index into `kinds`, the op's role (an index into
    ROLES), microbatch, chunk, stash and gradient slots, and where the activation and the
    gradient sent this tick land (valid, chunk, slot) on the receiving device."""
    index = {k: i for i, k in enumerate(kinds)}
    ops = tick.ops
    rows = [
        [index["idle" if op is None else op.kind] for op in ops],
        [0 if op is None else ROLES.index(op.role) for op in ops],
    ]
    rows += [
        [0 if op is None else getattr(op, f) for op in ops]
        for f in ("microbatch", "chunk", "stash_slot", "grad_slot")
    ]
    for recv in (tick.fwd_recv, tick.bwd_recv):
        rows += [
            [r is not None for r in recv],
            [0 if r is None else r[0] for r in recv],
            [0 if r is None else r[1] for r in recv],
        ]
    return np.asarray(rows, np.int32)


@dataclass(frozen=True)
class Plan:
    """The static program of one schedule: what every device does at every tick."""

    config: sim.PipelineConfig
    grid: tuple  # the simulator's grid (grid[device][tick] -> Slot | None)
    ticks: tuple  # the ticks at which some op starts
    stash_slots: int
    grad_slots: int

    @property
    def split(self) -> bool:
        return self.config.schedule == "zb-h1"

    def occupancy(self) -> dict:
        """Per device: busy and idle ticks of the executed grid, and the bubble (idle / total)."""
        rows = [sum(cell is not None for cell in row) for row in self.grid]
        total = len(self.grid[0])
        return {
            "ticks": total,
            "busy": rows,
            "idle": [total - b for b in rows],
            "bubble": (total * len(rows) - sum(rows)) / (total * len(rows)),
        }

    def segments(self) -> tuple[Segment, ...]:
        """The ticks as runs: a tick on its own (unrolled), or a unit of `period` ticks repeated
        `reps` times with the same shape (`tick_shape`) -- the steady state of 1F1B, ZB-H1 and
        interleaving, GPipe's full phases -- executed as one loop. Greedy from the start: at
        each tick, the repetition that folds the most ticks into a loop body."""
        shapes = [tick_shape(t) for t in self.ticks]
        n, i, out = len(shapes), 0, []
        while i < n:
            best = (0, 1, 1)  # (ticks saved, period, reps)
            for p in range(1, (n - i) // 2 + 1):
                unit, r = shapes[i : i + p], 1
                while shapes[i + r * p : i + (r + 1) * p] == unit:
                    r += 1
                if p * (r - 1) > best[0]:
                    best = (p * (r - 1), p, r)
            _, p, r = best
            out.append(Segment(i, p, r))
            i += p * r
        return tuple(out)

    def compiled_ticks(self) -> int:
        """Tick programs in the compiled step: one per unrolled tick, one per tick of each
        loop body -- what compile time follows (it grows with P, not with M)."""
        return sum(1 if seg.reps == 1 else seg.period for seg in self.segments())

    def sends(self) -> tuple[int, int]:
        """(activation sends, gradient sends) per step, summed over devices."""
        return sum(len(t.fwd) for t in self.ticks), sum(len(t.bwd) for t in self.ticks)


def make_plan(
    stages: int, microbatches: int, schedule: str, virtual_stages: int = 1, grid=None
) -> Plan:
    """The executor's program for `schedule`, from the simulator's grid (or a given `grid`, e.g.
    a deliberately broken one)."""
    cfg = sim.PipelineConfig(stages, microbatches, schedule, 1.0, 2.0, virtual_stages)
    if grid is None:
        grid = sim.schedule_grid(sim.simulate(cfg))
    grid = tuple(tuple(row) for row in grid)
    n_virtual = stages * virtual_stages
    starts = [[c if c is not None and c.first else None for c in row] for row in grid]
    # live intervals (write tick, last read tick) of each buffer entry, per (device, chunk)
    stash_live: dict = {}
    grad_live: dict = {}
    for d in range(stages):
        for t, s in enumerate(starts[d]):
            if s is None:
                continue
            target = (s.stage + 1) % stages if s.kind == "F" else (s.stage - 1) % stages
            if s.kind == "F" and s.stage < n_virtual - 1:
                stash_live.setdefault((target, (s.stage + 1) // stages, s.microbatch), [t, t])
            if s.kind == "B" and s.stage > 0:
                grad_live.setdefault((target, (s.stage - 1) // stages, s.microbatch), [t, t])
    for d in range(stages):  # an entry is read by its F, B and W; live until the last of them
        for t, s in enumerate(starts[d]):
            if s is not None:
                key = (d, s.stage // stages, s.microbatch)
                for live in (stash_live, grad_live):
                    if key in live:
                        live[key][1] = max(live[key][1], t)
    n_stash, n_grad = _slots(stash_live, microbatches), _slots(grad_live, microbatches)

    def role(j):
        return FIRST if j == 0 else LAST if j == n_virtual - 1 else MID

    ticks = []
    for t in range(len(grid[0])):
        ops, fwd, bwd = [], [], []
        fwd_recv, bwd_recv = [None] * stages, [None] * stages
        for d in range(stages):
            s = starts[d][t]
            if s is None:
                ops.append(None)
                continue
            ops.append(
                Op(
                    s.kind,
                    role(s.stage),
                    s.microbatch,
                    s.stage // stages,
                    s.microbatch % n_stash,
                    s.microbatch % n_grad,
                )
            )
            if s.kind == "F" and s.stage < n_virtual - 1:
                fwd.append((d, (d + 1) % stages))
                fwd_recv[(d + 1) % stages] = ((s.stage + 1) // stages, s.microbatch % n_stash)
            if s.kind == "B" and s.stage > 0:
                bwd.append((d, (d - 1) % stages))
                bwd_recv[(d - 1) % stages] = ((s.stage - 1) // stages, s.microbatch % n_grad)
        if any(op is not None for op in ops):
            ticks.append(
                Tick(t, tuple(ops), tuple(fwd), tuple(bwd), tuple(fwd_recv), tuple(bwd_recv))
            )
    return Plan(cfg, grid, tuple(ticks), n_stash, n_grad)


def forward_plan(plan: Plan) -> Plan:
    """The forwards alone (the loss without gradients): GPipe's F ops (the interleaved
    schedule's own, whose chunks GPipe's grid does not have), no B or W."""
    cfg = plan.config
    if cfg.virtual_stages == 1:
        cfg = sim.PipelineConfig(cfg.stages, cfg.microbatches, "gpipe", 1.0, 2.0)
    grid = [
        [c if c is not None and c.kind == "F" else None for c in row]
        for row in sim.schedule_grid(sim.simulate(cfg))
    ]
    c = plan.config
    return make_plan(c.stages, c.microbatches, c.schedule, c.virtual_stages, grid)


def _slots(live: dict, microbatches: int) -> int:
    """The fewest slots S such that microbatch m in slot m mod S is never overwritten while live
    (written after tick w, read up to tick r: the slot's next write must come at or after r)."""
    for n in range(1, microbatches + 1):
        taken: dict = {}
        ok = True
        for (d, c, m), (w, r) in sorted(live.items(), key=lambda kv: kv[1][0]):
            prev = taken.get((d, c, m % n))
            if prev is not None and w < prev:
                ok = False
                break
            taken[(d, c, m % n)] = r
        if ok:
            return n
    return microbatches


def check_layers(cfg: ModelConfig, stages: int, virtual_stages: int) -> None:
    if cfg.n_layers % (stages * virtual_stages):
        raise ValueError(
            f"n_layers={cfg.n_layers} does not split into {stages} pipeline stages x "
            f"{virtual_stages} virtual stages (needs a multiple of {stages * virtual_stages})"
        )
    per_chunk = cfg.n_layers // (stages * virtual_stages)
    if cfg.n_experts and per_chunk % cfg.moe_every:
        raise ValueError(
            f"a pipeline chunk of {per_chunk} layers does not hold whole groups "
            f"of moe_every={cfg.moe_every} (dense layers, then one MoE "
            "layer)"
        )


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
    expert_ways: int = 1,
):
    """Mean loss and gradient of this data shard's rows [B_data, T+1] over the plan's M
    microbatches, in `common.accumulate`'s contract: unreduced over the data axes (stages 0-2),
    or reduced as ZeRO-3's autodiff would (sharded leaves reduce-scattered by the transpose of
    their all-gathers, replicated leaves all-reduced here). Gradient accumulation IS the
    microbatching: there is no second loop."""
    v, M = plan.config.virtual_stages, plan.config.microbatches
    d = jax.lax.axis_index(AXIS)
    params = jax.tree.map(lambda x: _vary(x, (AXIS, *data_axes)), params)
    top, blocks = pieces.split_params(params)
    blocks_v = jax.tree.map(lambda a: a.reshape(v, a.shape[0] // v, *a.shape[1:]), blocks)
    B = batch_BT1.shape[0]
    micro_MBT1 = batch_BT1.reshape(B // M, M, -1).swapaxes(0, 1)  # rows m, m+M, ... = mb m
    positions_T = jnp.arange(micro_MBT1.shape[2] - 1)

    moe = bool(cfg.n_experts)

    def embed(top, tokens_BT1):  # the first virtual stage's input
        return pc.embed(pc.top_hook(top), tokens_BT1[:, :-1], cfg, pc)

    def head_loss(top, y_BTD, tokens_BT1):  # the last virtual stage's output
        return pc.loss(pc.head(pc.top_hook(top), y_BTD, cfg, pc), tokens_BT1[:, 1:])

    def layers(chunk, x_BTD):
        """The stage's layers, the same code for every role: the output and, with experts, its
        MoE layers' share of the router losses (`pieces.router_loss`)."""
        y_BTD, stats = pieces.run_layers(x_BTD, chunk, positions_T, cfg, pc)
        return (y_BTD, pieces.router_loss(stats, cfg)) if moe else (y_BTD, None)

    def chunk_at(c):
        return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, c, keepdims=False), blocks_v)

    # the buffers' types: what the first stage's forward makes, varying over pipe
    act = jax.eval_shape(lambda c, t, x: layers(c, embed(t, x))[0], chunk_at(0), top, micro_MBT1[0])
    act_axes = compat.varying_axes(act) | {AXIS}
    zero_act = _vary(jnp.zeros(act.shape, act.dtype), act_axes)
    loss_t = jax.eval_shape(lambda t, x, tok: head_loss(t, x, tok), top, zero_act, micro_MBT1[0])
    aux_t = jax.eval_shape(lambda c, x: layers(c, x)[1], chunk_at(0), zero_act)
    # the loss accumulator takes every stage's router losses too: one type for all of them
    loss_axes = (
        compat.varying_axes(loss_t) | {AXIS} | (compat.varying_axes(aux_t) if moe else set())
    )
    zero_loss = _vary(jnp.zeros((), jnp.float32), loss_axes)
    zero_top = jax.tree.map(jnp.zeros_like, top)
    carry = {
        "stash": _vary(jnp.zeros((v, plan.stash_slots, *act.shape), act.dtype), act_axes),
        "grad": _vary(jnp.zeros((v, plan.grad_slots, *act.shape), act.dtype), act_axes),
        "g_blocks": jax.tree.map(jnp.zeros_like, blocks_v),
        "g_top": zero_top,
        "loss": zero_loss,
    }
    # d(mean over microbatches and the expert axis's shards)/d(loss_m): expert parallelism's
    # shards are data shards whose non-expert gradients autodiff sums (parallel/ep.py)
    seed_cot = _vary(jnp.full((), 1.0 / (M * expert_ways), jnp.float32), loss_axes)

    def core(chunk, x):  # `layers`, typed for the carry (the router losses as the loss)
        y, aux = layers(chunk, x)
        return _vary(y, act_axes), (_vary(aux, loss_axes) if moe else None)

    def core_cot(dy):  # the router losses' cotangent: every stage's share enters the mean
        return (dy, seed_cot) if moe else (dy, None)

    def stage_input(first, top, x_in, tokens):  # F/B/W recompute it: the embedding is cheap
        return jax.lax.cond(first, lambda: _vary(embed(top, tokens), act_axes), lambda: x_in)

    def output_cot(last, top, y, cot_in, tokens, with_top: bool):
        """d(loss)/d(stage output): through the head and loss on the last stage (and the head's
        parameter gradient), else what the next stage sent."""

        def through_head():
            if not with_top:
                return jax.vjp(lambda y: head_loss(top, y, tokens), y)[1](seed_cot)[0], zero_top
            g_top, dy = jax.vjp(lambda t, y: head_loss(t, y, tokens), top, y)[1](seed_cot)
            return dy, g_top

        return jax.lax.cond(last, through_head, lambda: (cot_in, zero_top))

    def op(kind, small, x_in, cot_in, mb, c, role):
        """One op of this device, for any role: the embedding (first virtual stage) and the
        head and loss (last) are small conditionals around the stage's layers, so a tick
        compiles one copy of the layers per kind of op, whatever roles the devices play."""
        tokens = jax.lax.dynamic_index_in_dim(micro_MBT1, mb, keepdims=False)
        chunk = chunk_at(c)
        first, last = role == 0, role == 2
        if kind == "F":
            y, aux = core(chunk, stage_input(first, top, x_in, tokens))
            loss, send = jax.lax.cond(
                last,
                lambda: (_vary(head_loss(top, y, tokens), loss_axes), zero_act),
                lambda: (zero_loss, y),
            )
            loss = loss + aux if moe else loss
            return {**small, "loss": small["loss"] + loss / M}, send, zero_act
        if kind == "W" or not plan.split:  # weight gradients (and, for B, the input gradient)
            x, vjp_embed = jax.vjp(lambda t, x: stage_input(first, t, x, tokens), top, x_in)
            y, vjp_core = jax.vjp(lambda ch, x: core(ch, x), chunk, x)
            dy, g_head = output_cot(last, top, y[0], cot_in, tokens, with_top=True)
            g_chunk, dx = vjp_core(core_cot(dy))
            g_embed, dx_in = vjp_embed(dx)
            small = dict(small)
            small["g_blocks"] = jax.tree.map(
                lambda acc, g: acc.at[c].add(g), small["g_blocks"], g_chunk
            )
            small["g_top"] = jax.tree.map(
                lambda acc, a, b: acc + a + b, small["g_top"], g_head, g_embed
            )
            return small, zero_act, zero_act if kind == "W" else _vary(dx_in, act_axes)

        def input_grad():  # ZB-H1's B: the input gradient only (the first stage has none)
            y, vjp_core = jax.vjp(lambda x: core(chunk, x), x_in)
            dy, _ = output_cot(last, top, y[0], cot_in, tokens, with_top=False)
            return _vary(vjp_core(core_cot(dy))[0], act_axes)

        return small, zero_act, jax.lax.cond(first, lambda: zero_act, input_grad)

    def branch(kind):
        def run(carry, got, where):
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
                return {**carry, "stash": stash, "grad": grad}, zero_act, zero_act
            role, mb, c, s_slot, g_slot = where["op"]
            small = {k: carry[k] for k in ("g_blocks", "g_top", "loss")}
            small, fwd, bwd = op(kind, small, stash[c, s_slot], grad[c, g_slot], mb, c, role)
            return {**small, "stash": stash, "grad": grad}, fwd, bwd

        return run

    def tick(carry, recv, shape, data_FP):
        """One tick: this device's branch of the tick's `shape` (kinds, sends), storing last
        tick's receives first, then the tick's sends. `data_FP` [FIELDS, P]: the tick's
        per-device numbers (a constant when unrolled, a slice of the scanned array when not)."""
        kinds, fwd_pairs, bwd_pairs = shape
        row = data_FP[:, d]  # this device's column
        where = {"op": tuple(row[i] for i in range(1, 6))}
        got = {}
        for direction in ("fwd", "bwd"):
            got[direction] = None if recv[direction] is None else recv[direction][0]
            where[direction] = None if recv[direction] is None else recv[direction][1:]
        fns = [branch(k) for k in kinds]
        carry, fwd, bwd = jax.lax.switch(row[0], fns, carry, got, where)
        sent = {"fwd": None, "bwd": None}
        if fwd_pairs:  # collective-permute: stage outputs to the next stage
            sent["fwd"] = (
                jax.lax.ppermute(fwd, AXIS, fwd_pairs),
                row[6].astype(bool),
                row[7],
                row[8],
            )
        if bwd_pairs:  # collective-permute: input gradients to the previous stage
            sent["bwd"] = (
                jax.lax.ppermute(bwd, AXIS, bwd_pairs),
                row[9].astype(bool),
                row[10],
                row[11],
            )
        return carry, sent

    def nothing():  # an empty receive, typed as a real one (for a scan's carry)
        flag = jnp.zeros((plan.config.stages,), jnp.int32)[d]
        return (zero_act, flag.astype(bool), flag, flag)

    recv = {"fwd": None, "bwd": None}
    for seg in plan.segments():
        ticks = plan.ticks[seg.start : seg.start + seg.period * seg.reps]
        shapes = [tick_shape(t) for t in ticks[: seg.period]]
        data = np.stack([tick_data(t, shapes[i % seg.period][0]) for i, t in enumerate(ticks)])
        if seg.reps == 1:
            carry, recv = tick(carry, recv, shapes[0], jnp.asarray(data[0]))
            continue

        # the steady state: `period` ticks that repeat `reps` times with the same branches and
        # sends, differing only in numbers (microbatch, slots) -- one loop body, compiled once;
        # the census multiplies its collective-permutes by the trip count
        def body(state, data_KFP, shapes=shapes):
            carry, recv = state
            for shape, data_FP in zip(shapes, data_KFP, strict=True):
                carry, recv = tick(carry, recv, shape, data_FP)
                recv = {k: nothing() if r is None else r for k, r in recv.items()}
            return (carry, recv), None

        recv = {k: nothing() if r is None else r for k, r in recv.items()}
        data = jnp.asarray(data.reshape(seg.reps, seg.period, *data.shape[1:]))
        (carry, recv), _ = jax.lax.scan(body, (carry, recv), data)
    # the schedule ends on the first stage's backward, which sends nothing: no receive is left
    last = plan.ticks[-1]
    assert not last.fwd and not last.bwd, "the plan's last tick sends"

    g_blocks = jax.tree.map(lambda g: g.reshape(-1, *g.shape[2:]), carry["g_blocks"])
    # all-reduce over pipe: the embedding's gradient is on the first stage, the head's on the last
    g_top = jax.lax.psum(carry["g_top"], AXIS)
    loss = jax.lax.psum(carry["loss"], AXIS)  # all-reduce of the scalar: only the last has it
    if expert_ways > 1:  # the mean over the expert axis's shards (one all-reduce of the scalar)
        loss = jax.lax.psum(loss / expert_ways, "expert")
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


def circular_shard_map(fn, mesh, in_specs, out_specs, virtual_stages: int):
    """`jax.shard_map` for the interleaved schedule: device d must hold the layers of virtual
    stages d, d+P, ..., but the stored layout (the one every strategy shares, so a checkpoint
    restores anywhere) gives it a contiguous [L/P] slice. Each leaf split over pipe along
    `layers` is viewed as [v, P, L/(vP), ...] with P over pipe -- the circular assignment -- and
    GSPMD moves the layers between the two layouts around the step (an all-to-all of the
    stage parameters, and of their gradients and optimizer state, each step: the price of
    keeping one stored layout). Inside, each device sees its v chunks as [v L/(vP), ...]."""
    v, p = virtual_stages, mesh.shape[AXIS]

    def layered(spec):
        return isinstance(spec, P) and len(spec) > 0 and spec[0] == AXIS

    def outer_spec(spec):
        return P(None, AXIS, None, *spec[1:]) if layered(spec) else spec

    def over(fn_leaf, specs, tree):
        return jax.tree.map(
            lambda s, x: fn_leaf(x) if layered(s) else x,
            specs,
            tree,
            is_leaf=lambda s: isinstance(s, P),
        )

    def inner(*args):
        args = over(lambda x: x.reshape(-1, *x.shape[3:]), in_specs, args)
        out = fn(*args)
        return over(lambda x: x.reshape(v, 1, x.shape[0] // v, *x.shape[1:]), out_specs, out)

    mapped = jax.shard_map(
        inner,
        mesh=mesh,
        in_specs=jax.tree.map(outer_spec, in_specs, is_leaf=lambda s: isinstance(s, P)),
        out_specs=jax.tree.map(outer_spec, out_specs, is_leaf=lambda s: isinstance(s, P)),
    )

    def outer(*args):
        args = over(lambda x: x.reshape(v, p, x.shape[0] // (v * p), *x.shape[1:]), in_specs, args)
        out = mapped(*args)
        # back to the stored layout (contiguous [L/P] per device), pinned: left free, GSPMD may
        # return the state replicated
        return jax.tree.map(
            lambda s, x: (
                jax.lax.with_sharding_constraint(
                    x.reshape(-1, *x.shape[3:]), NamedSharding(mesh, s)
                )
                if layered(s)
                else x
            ),
            out_specs,
            out,
            is_leaf=lambda s: isinstance(s, P),
        )

    return outer


def _store(buf, got, where):
    """Store a received [B_m, T, D] into buf[chunk, slot] on the devices that receive it."""
    valid, c, s = where
    return buf.at[c, s].set(jnp.where(valid, got, buf[c, s]))


def _vary(x, axes):
    """pcast `x` to varying over those of `axes` it does not vary over yet (identity forward)."""
    missing = tuple(a for a in axes if a not in compat.varying_axes(jax.typeof(x)))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def predict_comm(plan: Plan, act_bytes: float) -> dict:
    """Bytes of the schedule's transfers, summed over devices: every activation crossing a stage
    boundary forward and every input gradient crossing it backward, M (vP - 1) of each."""
    p, v, m = plan.config.stages, plan.config.virtual_stages, plan.config.microbatches
    return {"collective-permute": 2 * m * (p * v - 1) * act_bytes}
