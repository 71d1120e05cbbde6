"""Pipeline-parallel schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1) as dependency-driven
simulations, and the schedule grid the executor (jaxscale/parallel/pp/) runs.

P devices (stages), M microbatches, t_F and t_B per stage and microbatch. Each device runs its
ops in the schedule's order; an op starts when its inputs exist and its device is free
(`jaxscale.sim.timeline`). Data flow: F(j, m) needs F(j-1, m); B(j, m) needs B(j+1, m) and
F(j, m), over the virtual stages j = chunk * P + device (one chunk per device unless interleaved).
ZB-H1 (zero bubble, Qi et al. 2023) splits each backward into B (input gradient, needs B(j+1, m))
and W (weight gradient, needs B(j, m)), each half of t_B, and defers W to fill the bubble.

Two bubble conventions are in use (one per seed) and both are exposed:
  "s2": idle / total time        = (P-1) / (v*M + P-1)   seed 002 ch7, "The Pipeline Bubble Problem"
  "s4": idle / ideal (busy) time = (P-1) / (v*M)         seed 004 §6, "Pipeline Parallelism"
with v = 1 except for the interleaved schedule (v model chunks per device, Megatron-LM).
"""

import heapq
from dataclasses import dataclass, field, replace

from jaxscale.checks import positive_fields
from jaxscale.sim import timeline
from jaxscale.sim.timeline import Op, Span

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
CONVENTIONS = ("s2", "s4")
COUNTS = ("stages", "microbatches", "virtual_stages")
BUBBLE_MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)  # seed 002 ch7's bubble table


@dataclass(frozen=True)
class PipelineConfig:
    stages: int = 4  # P, pipeline devices
    microbatches: int = 8  # M
    schedule: str = "1f1b"  # one of SCHEDULES
    forward_time: float = 1.0  # t_F of one whole stage for one microbatch
    backward_time: float = 1.0  # t_B, often ~2 t_F in practice
    virtual_stages: int = 1  # v, model chunks per device (interleaved needs v >= 2)

    def validate(self) -> None:
        positive_fields(self, *COUNTS, "forward_time", "backward_time")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose from {SCHEDULES}")
        if self.schedule == "interleaved":
            if self.virtual_stages < 2:
                raise ValueError("the interleaved schedule needs virtual_stages >= 2")
            if self.microbatches % self.stages:
                raise ValueError(
                    f"the interleaved schedule needs microbatches divisible by stages "
                    f"({self.microbatches} % {self.stages} != 0)"
                )
        elif self.virtual_stages != 1:
            raise ValueError(
                f"virtual_stages > 1 only applies to 'interleaved', not {self.schedule!r}"
            )


@dataclass(frozen=True)
class PipelineResult:
    config: PipelineConfig
    spans: dict = field(repr=False)  # op key -> timeline.Span
    makespan: float  # time until the last backward finishes
    work_per_stage: float  # busy time of every device: M * (t_F + t_B) (ZB-H1: B + W = t_B)
    peak_activations: tuple  # per device, in whole-stage microbatch activations (chunks / v)

    @property
    def bubble_s2(self) -> float:
        """Idle / total time (every device does the same work, so one number)."""
        return 1.0 - self.work_per_stage / self.makespan

    @property
    def bubble_s4(self) -> float:
        """Idle / ideal time."""
        return (self.makespan - self.work_per_stage) / self.work_per_stage

    @property
    def tick(self) -> float:
        """The schedule grid's time step: the largest that divides every op's duration."""
        return float(timeline.time_quantum([s.op.duration for s in self.spans.values()]))

    def grid(self, max_cells: int = 400) -> str:
        """`schedule_grid` as text: one row per device, an op's label ("F3"; "F3a" for chunk a
        when interleaved) in its first tick, '--' in its later ticks, '..' idle."""
        ticks = round(self.makespan / self.tick)
        if ticks > max_cells:
            return f"(grid omitted: {ticks} columns > {max_cells})"
        cells = [
            [
                ".."
                if s is None
                else "--"
                if not s.first
                else _label(s.kind, s.stage, s.microbatch, self.config)
                for s in row
            ]
            for row in schedule_grid(self)
        ]
        width = max(len(c) for row in cells for c in row)
        names = [f"GPU{d}" for d in range(self.config.stages)]
        name_width = max(map(len, names))
        return "\n".join(
            f"{name:<{name_width}}: " + " ".join(c.rjust(width) for c in row)
            for name, row in zip(names, cells, strict=True)
        )


@dataclass(frozen=True)
class Slot:
    """What a device does during one tick of the schedule: the forward ("F") or backward ("B")
    of `microbatch` on virtual stage `stage` (= chunk * P + device). `first` is False on the
    later ticks of an op that lasts several."""

    kind: str
    microbatch: int
    stage: int
    first: bool = True


def schedule_grid(result: PipelineResult) -> list[list[Slot | None]]:
    """The simulated schedule as grid[device][tick]: the Slot running there, or None (idle);
    one tick = `result.tick`. Pure: built from the simulated spans alone."""
    tick = result.tick
    ticks = round(result.makespan / tick)
    grid: list[list[Slot | None]] = [[None] * ticks for _ in range(result.config.stages)]
    for span in sorted(result.spans.values(), key=lambda s: s.start):
        kind, stage, microbatch = span.op.key
        first, last = round(span.start / tick), round(span.end / tick)
        for t in range(first, min(last, ticks)):
            grid[span.op.resource][t] = Slot(kind, microbatch, stage, t == first)
    return grid


def bubble_fraction(
    stages: int, microbatches: int, convention: str = "s2", virtual_stages: int = 1
) -> float:
    """Analytic bubble for equal per-stage work: "s2" idle/total, "s4" idle/ideal."""
    _check_counts(stages, microbatches, virtual_stages)
    if convention == "s2":
        return (stages - 1) / (virtual_stages * microbatches + stages - 1)
    if convention == "s4":
        return (stages - 1) / (virtual_stages * microbatches)
    raise ValueError(f"unknown bubble convention {convention!r}; choose from {CONVENTIONS}")


def predicted_bubble(cfg: PipelineConfig, convention: str = "s2") -> float:
    """The schedule's closed form: (P-1)/(v*M + P-1) ("s2") or (P-1)/(v*M) ("s4") for GPipe, 1F1B
    and interleaved (v = 1 but for interleaved); ZB-H1 (M >= P, t_B <= 2 t_F): the bubble is
    (P-1)(t_F + t_B/2 - t_W) = (P-1) t_F, so idle/total = (P-1) t_F / (M (t_F + t_B) + (P-1) t_F)
    -- (P-1)/(3M + P-1) for t_B = 2 t_F -- and idle/ideal = (P-1) t_F / (M (t_F + t_B))."""
    p, m = cfg.stages, cfg.microbatches
    if cfg.schedule != "zb-h1":
        return bubble_fraction(p, m, convention, cfg.virtual_stages)
    idle, work = (p - 1) * cfg.forward_time, m * (cfg.forward_time + cfg.backward_time)
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown bubble convention {convention!r}; choose from {CONVENTIONS}")
    return idle / (work + idle) if convention == "s2" else idle / work


def pipeline_efficiency(
    stages: int, microbatches: int, convention: str = "s2", virtual_stages: int = 1
) -> float:
    """1 - bubble, as a fraction.

    "s2" gives the exact busy fraction M/(M+P-1) (v=1). "s4" is seed 004's 1 - (P-1)/M
    (its pipeline_efficiency: 25.0 / 62.5 / 81.25 / 90.625 % for P=4, M=4/8/16/32): a
    first-order approximation of the same quantity, negative when M < P-1.
    """
    return 1.0 - bubble_fraction(stages, microbatches, convention, virtual_stages)


def _check_counts(stages, microbatches, virtual_stages):
    cfg = PipelineConfig(stages, microbatches, virtual_stages=virtual_stages)
    positive_fields(cfg, *COUNTS)


def bubble_table(
    stages: int,
    forward_time: float = 1.0,
    backward_time: float = 1.0,
    virtual_stages: int | None = None,
) -> list[dict]:
    """Bubble vs microbatches M (BUBBLE_MICROBATCHES) at P = `stages`: both conventions' bubble
    and efficiency, the simulated 1F1B bubble and, given `virtual_stages`, the simulated
    interleaved one (None where P does not divide M)."""
    rows = []
    for m in BUBBLE_MICROBATCHES:
        one_f_one_b = PipelineConfig(stages, m, "1f1b", forward_time, backward_time)
        row = {
            "microbatches": m,
            "bubble_s2": bubble_fraction(stages, m, "s2"),
            "efficiency_s2": pipeline_efficiency(stages, m, "s2"),
            "bubble_s4": bubble_fraction(stages, m, "s4"),
            "efficiency_s4": pipeline_efficiency(stages, m, "s4"),
            "simulated_1f1b_bubble": simulate(one_f_one_b).bubble_s2,
        }
        if virtual_stages is not None:
            inter = replace(one_f_one_b, schedule="interleaved", virtual_stages=virtual_stages)
            row["simulated_interleaved_bubble"] = None if m % stages else simulate(inter).bubble_s2
        rows.append(row)
    return rows


def _forward(j: int, m: int, cfg: PipelineConfig) -> Op:
    v, p = cfg.virtual_stages, cfg.stages
    deps = (("F", j - 1, m),) if j > 0 else ()
    return Op(("F", j, m), j % p, cfg.forward_time / v, deps, _label("F", j, m, cfg))


def _backward(j: int, m: int, cfg: PipelineConfig) -> Op:
    v, p = cfg.virtual_stages, cfg.stages
    deps = (("F", j, m),) + ((("B", j + 1, m),) if j < p * v - 1 else ())
    split = 2 if cfg.schedule == "zb-h1" else 1  # ZB-H1's B is the input-gradient half
    return Op(("B", j, m), j % p, cfg.backward_time / v / split, deps, _label("B", j, m, cfg))


def _weight(j: int, m: int, cfg: PipelineConfig) -> Op:
    """ZB-H1's W: the weight-gradient half of the backward, needing only B(j, m)."""
    return Op(
        ("W", j, m), j % cfg.stages, cfg.backward_time / 2, (("B", j, m),), _label("W", j, m, cfg)
    )


def _label(kind: str, j: int, m: int, cfg: PipelineConfig) -> str:
    # Interleaved: a letter names the device's chunk (a = first chunk it holds, b = second, ...).
    chunk = "" if cfg.virtual_stages == 1 else "abcdefghijklmnopqrstuvwxyz"[j // cfg.stages % 26]
    return f"{kind}{m}{chunk}"


def _one_f_one_b(stage: int, cfg: PipelineConfig) -> list[Op]:
    # Warm-up of P-s-1 forwards, then alternate F, B; then drain the remaining backwards
    # (the per-stage orders of seed 002 ch7, "1F1B Scheduling: The Solution", and of
    # pipeline_schedule_viz.py's "Run It" page).
    p, m = cfg.stages, cfg.microbatches
    warmup = min(p - stage - 1, m)
    ops = [_forward(stage, i, cfg) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [_forward(stage, warmup + i, cfg), _backward(stage, i, cfg)]
    ops += [_backward(stage, i, cfg) for i in range(m - warmup, m)]
    return ops


def _interleaved(device: int, cfg: PipelineConfig) -> list[Op]:
    # Megatron-LM's interleaved 1F1B: the k-th forward on a device takes microbatch group
    # k // (P*v), chunk (k % (P*v)) // P; backwards walk the chunks in reverse. Warm-up is
    # 2*(P-d-1) + (v-1)*P forwards, capped at the M*v chunk-forwards the device runs.
    p, v, m = cfg.stages, cfg.virtual_stages, cfg.microbatches
    total = m * v

    def op(k: int, forward: bool) -> Op:
        chunk = (k % (p * v)) // p
        if not forward:
            chunk = v - 1 - chunk
        mb = (k // (p * v)) * p + k % p
        j = chunk * p + device
        return _forward(j, mb, cfg) if forward else _backward(j, mb, cfg)

    warmup = min(2 * (p - device - 1) + (v - 1) * p, total)
    ops = [op(k, True) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [op(warmup + k, True), op(k, False)]
    ops += [op(k, False) for k in range(total - warmup, total)]
    return ops


def _zero_bubble_h1(cfg: PipelineConfig) -> dict[int, list[Op]]:
    # Greedy list scheduling on the time grid, per device and tick: a ready B first (it unblocks
    # the previous stage); else the oldest W once P are pending (bounds the inputs W still
    # holds); else a ready F while fewer than P-s microbatches wait for their B (1F1B's bound);
    # else a pending W (deferred W's fill the drain's bubble). With M >= P and t_B <= 2 t_F
    # (B = W <= F, the paper's setting) this reaches its makespan M (t_F + t_B) + (P-1) t_F;
    # slower backwards end later. A stage input is held until its W, at most (P-s) + (P-1) of
    # them on stage s, independent of M.
    p, m = cfg.stages, cfg.microbatches
    q = timeline.time_quantum([cfg.forward_time, cfg.backward_time / 2])
    # whole ticks, at least one (a hostile ratio of times may round a duration to nothing)
    t_f, t_half = (max(1, round(t / q)) for t in (cfg.forward_time, cfg.backward_time / 2))
    end: dict[tuple, int] = {}
    orders: dict[int, list[Op]] = {s: [] for s in range(p)}
    next_f, next_b, pending_w, free = [0] * p, [0] * p, [[] for _ in range(p)], [0] * p
    events: list[int] = []  # op end times still ahead: only then can a decision change
    tick = 0
    while any(len(orders[s]) < 3 * m for s in range(p)):
        for s in range(p):
            if free[s] > tick:
                continue
            b, f = next_b[s], next_f[s]
            if (
                b < m
                and _done(end, ("F", s, b), tick)
                and (s == p - 1 or _done(end, ("B", s + 1, b), tick))
            ):
                op, length, next_b[s] = _backward(s, b, cfg), t_half, b + 1
                pending_w[s].append(b)
            elif len(pending_w[s]) >= p:
                op, length = _weight(s, pending_w[s].pop(0), cfg), t_half
            elif f < m and f - b < p - s and (s == 0 or _done(end, ("F", s - 1, f), tick)):
                op, length, next_f[s] = _forward(s, f, cfg), t_f, f + 1
            elif pending_w[s]:
                op, length = _weight(s, pending_w[s].pop(0), cfg), t_half
            else:
                continue
            orders[s].append(op)
            end[op.key] = free[s] = tick + length
            heapq.heappush(events, tick + length)
        while events and events[0] <= tick:
            heapq.heappop(events)
        if not events:
            raise RuntimeError("ZB-H1 schedule stalled")  # unreachable: some op is always ready
        tick = heapq.heappop(events)
    return orders


def _done(end: dict, key: tuple, tick: int) -> bool:
    return end.get(key, tick + 1) <= tick


def stage_orders(cfg: PipelineConfig) -> dict[int, list[Op]]:
    """Each device's ops in the schedule's order."""
    cfg.validate()
    p, m = cfg.stages, cfg.microbatches
    if cfg.schedule == "gpipe":
        # Fill-drain: all forwards, then all backwards, backwards in microbatch order as in
        # seed 002 ch7's visualize_naive_schedule.
        return {
            s: [_forward(s, i, cfg) for i in range(m)] + [_backward(s, i, cfg) for i in range(m)]
            for s in range(p)
        }
    if cfg.schedule == "1f1b":
        return {s: _one_f_one_b(s, cfg) for s in range(p)}
    if cfg.schedule == "zb-h1":
        return _zero_bubble_h1(cfg)
    return {d: _interleaved(d, cfg) for d in range(p)}


def peak_activations(spans: dict, cfg: PipelineConfig) -> tuple:
    """Per device, the most microbatch activations held at once (held from F start to the end of
    its backward: B, or W under ZB-H1, whose weight gradient still needs the stage input)."""
    last = "W" if cfg.schedule == "zb-h1" else "B"
    peaks = []
    rows = timeline.by_resource(spans)
    for d in range(cfg.stages):
        events = []
        for span in rows.get(d, ()):
            if span.op.key[0] == "F":
                events.append((span.start, 1, +1))
            elif span.op.key[0] == last:
                events.append((span.end, 0, -1))  # at a tie, a finished backward frees first
        held = peak = 0
        for _, _, delta in sorted(events):
            held += delta
            peak = max(peak, held)
        peaks.append(peak / cfg.virtual_stages)
    return tuple(peaks)


def simulate(cfg: PipelineConfig) -> PipelineResult:
    spans: dict[tuple, Span] = timeline.run(stage_orders(cfg))
    return PipelineResult(
        config=cfg,
        spans=spans,
        makespan=timeline.makespan(spans),
        work_per_stage=cfg.microbatches * (cfg.forward_time + cfg.backward_time),
        peak_activations=peak_activations(spans, cfg),
    )
