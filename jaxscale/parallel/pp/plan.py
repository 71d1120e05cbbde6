"""The host side of the pipe axis: a schedule's static program, in plain Python and numpy.

The schedule is the simulator's grid (`jaxscale.sim.pipeline.schedule_grid`, t_B = 2 t_F; ZB-H1's
B and W each t_F): grid[device][tick] says which op starts where. `Plan` turns it into a static
program: per tick, each device runs one branch -- idle, F, B (input and weight gradients; under
ZB-H1 the input gradient only) or W (ZB-H1's weight gradient) -- for the first, a middle or the
last virtual stage, and the tick names the (source, target) pairs that send after it:

  F(j, m) on device d     sends the stage output [B_m, T, D] to device d+1   (collective-permute)
  B(j, m) on device d     sends the input gradient [B_m, T, D] to device d-1 (collective-permute)

Interleaving wraps around: device P-1 sends chunk c's output to device 0's chunk c+1.

A stage keeps only its inputs (the stash, [v, S, B_m, T, D]): S slots per chunk (microbatch m
uses slot m mod S), the fewest that the schedule never overwrites while live: M for GPipe, P for
1F1B. Received gradients wait in a second buffer of the same form. Nothing here touches jax: the
executor (`execute.py`) compiles what this module decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.sim import pipeline as sim

AXIS = "pipe"  # the mesh axis whose positions are the plan's devices
FIRST, MID, LAST = "first", "mid", "last"
ROLES = (FIRST, MID, LAST)


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
    stash_live, grad_live = _live_intervals(starts, stages, n_virtual)
    n_stash, n_grad = _slots(stash_live, microbatches), _slots(grad_live, microbatches)
    ticks = []
    for t in range(len(grid[0])):
        tick = _tick(t, [row[t] for row in starts], n_virtual, n_stash, n_grad)
        if tick is not None:
            ticks.append(tick)
    return Plan(cfg, grid, tuple(ticks), n_stash, n_grad)


def _live_intervals(starts: list, stages: int, n_virtual: int) -> tuple[dict, dict]:
    """The live intervals [write tick, last read tick] of each stash and gradient buffer entry,
    keyed (device, chunk, microbatch): written when the op before it sends (an F to the next
    virtual stage, a B to the previous), read by its own F, B and W."""
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
    return stash_live, grad_live


def _role(j: int, n_virtual: int) -> str:
    return FIRST if j == 0 else LAST if j == n_virtual - 1 else MID


def _tick(t: int, starts_t: list, n_virtual: int, n_stash: int, n_grad: int) -> Tick | None:
    """Grid column `t` (per device, the op starting there or None) as a Tick: its ops, the pairs
    that send after it and where each transfer lands. None when every device is idle."""
    stages = len(starts_t)
    ops, fwd, bwd = [], [], []
    fwd_recv, bwd_recv = [None] * stages, [None] * stages
    for d, s in enumerate(starts_t):
        if s is None:
            ops.append(None)
            continue
        ops.append(
            Op(
                s.kind,
                _role(s.stage, n_virtual),
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
    if all(op is None for op in ops):
        return None
    return Tick(t, tuple(ops), tuple(fwd), tuple(bwd), tuple(fwd_recv), tuple(bwd_recv))


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


def pieces(pc, comp):
    """The pipe axis substitutes nothing in the model: its schedule replaces the microbatch
    loop (`execute.accumulate`), and a stage runs the model's skeleton on its chunk."""
    return pc


def activation(shape, comp) -> tuple[int, int, int]:
    """One microbatch's stage output on one device, [B_m, T, D] (T/t under sequence
    parallelism): what one transfer carries."""
    rows = shape.rows_local // comp.plan.config.microbatches
    seq = shape.seq_len // (comp.t if comp.mode == "sequence" else 1)
    return rows, seq, shape.d_model


def predict_comm(shape, comp) -> dict:
    """Bytes of the schedule's transfers, summed over the devices of one pipeline (the unit
    differs from the other axes', which are per device): every activation crossing a stage
    boundary forward and every input gradient crossing it backward, M (vP - 1) of each."""
    if comp.plan is None:
        return {}
    config = comp.plan.config
    p, v, m = config.stages, config.virtual_stages, config.microbatches
    act_bytes = float(np.prod(activation(shape, comp))) * shape.act_bytes
    return {"collective-permute": 2 * m * (p * v - 1) * act_bytes}
