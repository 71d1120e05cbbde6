"""The bench's pipeline rows: each schedule compiled and run, measured against its formulas.

For one schedule on one mesh, a row puts side by side
  bubble        idle ticks / all ticks of the executed plan (the executor runs exactly that grid)
                vs the closed form (`sim.pipeline.predicted_bubble`), in both seed conventions;
  permutes      the schedule's collective-permutes in the compiled HLO: their number and the
                bytes one pipeline moves (each op's buffer x its source->target pairs, divided
                by the pipeline's replicas over the data and tensor axes) vs 2 M (vP - 1) x one
                microbatch's activation [B_m, T, D] (each boundary crossed forward and backward);
  memory        the compiled step's temporaries (`memory_analysis`) and the stash slots;
  equivalence   the 10-step check against the single-device reference (jaxscale/verify.py).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import jax

from jaxscale import verify
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.parallel import compose, pp
from jaxscale.parallel.compose import Strategy, build
from jaxscale.sim import pipeline as sim
from jaxscale.sim import timeline

MESH, STAGES, DATA = "pp=2,dp=4", 2, 4  # the pipeline suite's mesh: two stages, four replicas
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))
SWEEP = (4, 8, 16, 32)  # M at which every schedule is compiled (the CLI default)
CHECKED_M = 8  # each schedule's row at this M also runs 10 steps against the reference
MICRO_ROWS = 4  # rows of one microbatch per data shard, whatever M (the batch grows with M)
CFG = verify.CFG  # with one layer per virtual stage (`point`)


@dataclass
class PipeRow:
    label: str
    mesh: str
    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int
    ticks: int
    bubble: float  # measured: idle / total ticks of the executed plan
    bubble_s2: float  # predicted idle / total
    bubble_s4: float  # predicted idle / ideal
    permutes: int  # collective-permute instructions in the compiled step
    permute_bytes: float  # bytes they move, summed over their source->target pairs
    permute_predicted: float
    stash_slots: int
    temp_bytes: float
    compile_s: float  # lowering + compiling, wall
    layout_bytes: float = 0.0  # per device: interleaving's moves between layouts (GSPMD's)
    passed: bool | None = None  # the 10-step equivalence check (None: not run)
    compile_cpu_s: float = 0.0  # the same in CPU seconds of this process (other work on the host
    # does not inflate it)
    compiled_ticks: int = 0  # tick programs in the compiled step (Plan.compiled_ticks)
    # --time: ms per step from a profile, mean of devices (bench/timing.py, analysis/trace.py)
    step_ms: float | None = None
    compute_ms: float | None = None
    collective_ms: float | None = None
    idle_ms: float | None = None

    @property
    def bubble_ok(self) -> bool:
        return abs(self.bubble - self.bubble_s2) < 1e-9

    @property
    def permute_ok(self) -> bool:
        return self.permute_bytes == self.permute_predicted


def step_shape(cfg: ModelConfig, tcfg: TrainConfig, built):
    """The step's shapes on one data shard (what the pipe axis's prediction reads)."""
    return compose.step_shape(cfg, tcfg.global_batch // built.data_ways, tcfg.seq_len)


def pipe_row(
    text: str,
    mesh: str,
    m: int,
    v: int,
    cfg: ModelConfig,
    tcfg: TrainConfig,
    ref: verify.Trajectory | None = None,
    time_steps: int = 0,
) -> PipeRow:
    """Compile (and, given the reference, run and check: losses and final parameters, as the
    mesh table; `jaxscale verify` also checks the first step's gradients) one pipeline
    strategy. Checked or not, the same program: the training step, without gradient outputs."""
    strategy = Strategy.parse(text, mesh, microbatches=m, virtual_stages=v)
    built = build(strategy, cfg, tcfg)
    cpu0 = time.process_time()
    with jax.set_mesh(built.mesh):
        compiled, report = compile_with_report(
            built.step, *built.abstract_args(tcfg.global_batch, tcfg.seq_len)
        )
    row = measure(built, report, cfg, tcfg)
    row.compile_cpu_s = time.process_time() - cpu0
    row.compiled_ticks = built.plan.compiled_ticks()
    if ref is not None:
        got = verify.run_built(built, tcfg, step=compiled, initial=ref.initial)
        row.passed = verify.compare(verify.Case(strategy), got, ref).passed
        if time_steps:
            from jaxscale.analysis.trace import summary
            from jaxscale.bench.timing import profile_devices

            s = summary(profile_devices(built, compiled, tcfg, ref.initial, time_steps))
            row.step_ms, row.compute_ms = s["step_s"] * 1e3, s["compute_s"] * 1e3
            row.collective_ms, row.idle_ms = s["exposed_s"] * 1e3, s["idle_s"] * 1e3
    return row


def measure(built, report, cfg: ModelConfig, tcfg: TrainConfig) -> PipeRow:
    """A pipelined strategy's compiled step against its plan and formulas."""
    plan, strategy = built.plan, built.strategy
    shape = step_shape(cfg, tcfg, built)
    act_shape = pp.activation(shape, built.comp)  # one transfer: [B_m, T, D] (T/t under SP)
    # the schedule's transfers carry [B_m, T, D]; any other collective-permute is GSPMD moving
    # the interleaved schedule's stage parameters between the stored and the circular layout
    permutes = [
        c
        for c in report.collectives
        if c.op == "collective-permute" and all(dims == act_shape for _, dims in c.shapes)
    ]
    layout = [
        c
        for c in report.collectives
        if c.op in ("collective-permute", "all-to-all") and c not in permutes
    ]
    n = len(built.mesh.devices.flat)
    occ = plan.occupancy()
    return PipeRow(
        built.label,
        str(strategy.mesh),
        strategy.schedule,
        plan.config.stages,
        strategy.microbatches,
        strategy.virtual_stages,
        occ["ticks"],
        occ["bubble"],
        sim.predicted_bubble(plan.config, "s2"),
        sim.predicted_bubble(plan.config, "s4"),
        sum(c.trips for c in permutes),  # executed: a scanned tick's permutes once per trip
        # per pipeline: the pipeline's replicas over the data and tensor axes send the same
        plan.config.stages / n * sum(c.bytes_per_device * c.num_groups * c.trips for c in permutes),
        pp.predict_comm(shape, built.comp)["collective-permute"],
        plan.stash_slots,
        report.memory.temp,
        report.compile_s,
        layout_bytes=sum(c.bytes_per_device * c.num_groups * c.trips for c in layout) / n,
    )


def point_configs(
    cfg: ModelConfig, tcfg: TrainConfig, m: int, v: int, micro_rows: int = MICRO_ROWS
) -> tuple[ModelConfig, TrainConfig]:
    """One layer per virtual stage; one microbatch of `micro_rows` rows x 32 tokens per data
    shard whatever M, so the stash of stage inputs -- not the microbatch's working set or the
    parameters -- is what M can move."""
    return (
        cfg.replace(n_layers=STAGES * v),
        tcfg.replace(global_batch=micro_rows * m * DATA, seq_len=32),
    )


_REFERENCES: dict = {}


def point(
    cfg: ModelConfig,
    tcfg: TrainConfig,
    schedule: str,
    m: int,
    v: int,
    check: bool,
    micro_rows: int = MICRO_ROWS,
    time_steps: int = 0,
) -> dict:
    """One schedule at M microbatches on MESH: compiled, measured against its plan and
    formulas, and (check) run against the single-device reference. Compile seconds are wall
    and CPU (the process's, which other work on the host does not inflate)."""
    c, t = point_configs(cfg, tcfg, m, v, micro_rows)
    ref = None
    if check:
        if (c, t) not in _REFERENCES:
            _REFERENCES[c, t] = verify.reference(c, t, with_grads=False)
        ref = _REFERENCES[c, t]
    row = pipe_row(f"manual:dp+{schedule}", MESH, m, v, c, t, ref, time_steps if check else 0)
    return dataclasses.asdict(row)


def _worker_init(n_devices: int, fast_compile: bool) -> None:
    jax.config.update("jax_num_cpu_devices", n_devices)
    jax.config.update("jax_disable_most_optimizations", fast_compile)


def _worker_point(job) -> dict:
    return point(*job)


def run_points(jobs: list[tuple], workers: int = 1, progress=None) -> list[dict]:
    """`point(*job)` for every job, in `workers` processes when more than one (a compile is
    one thread: one process per core): results in the jobs' order."""
    if workers <= 1:
        out = []
        for job in jobs:
            out.append(point(*job))
            if progress:
                progress.update(1, note=f"{job[2]} M={job[3]}")
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    init = (jax.device_count(), bool(jax.config.read("jax_disable_most_optimizations")))
    # the longest compiles first (interleaving's, then large M), so the workers end together
    order = sorted(range(len(jobs)), key=lambda i: (-jobs[i][4], -jobs[i][3]))
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=init,
    ) as pool:
        futures = {i: pool.submit(_worker_point, jobs[i]) for i in order}
        points = {}
        for i in order:
            points[i] = futures[i].result()
            if progress:
                progress.update(1, note=f"{jobs[i][2]} M={jobs[i][3]}")
    return [points[i] for i in range(len(jobs))]


def sweep(
    cfg: ModelConfig,
    tcfg: TrainConfig,
    ms=SWEEP,
    schedules=SCHEDULES,
    workers: int = 1,
    progress=None,
    check_m: int | None = CHECKED_M,
    micro_rows: int = MICRO_ROWS,
    time_steps: int = 0,
) -> tuple[list[PipeRow], list[dict]]:
    """Every schedule at every M: the checked rows (M = check_m, and GPipe at M = 1, seed 004's
    naive model parallelism) and, per M, each schedule's compile seconds, tick programs
    compiled (the steady state is one loop body, so both stop growing once M reaches it) and
    compiler temporaries (GPipe stashes all M microbatches' stage inputs, the others at most
    P)."""
    every_m = sorted(set(ms) | ({check_m} if check_m is not None else set()))
    jobs = [
        (cfg, tcfg, sched, m, v, m == check_m, micro_rows, time_steps)
        for m in every_m
        for sched, v in schedules
    ]
    if check_m is not None:
        jobs.append((cfg, tcfg, "gpipe", 1, 1, True, micro_rows, time_steps))
    points = run_points(jobs, workers, progress)
    by = {(job[2], job[3]): rec for job, rec in zip(jobs, points, strict=True)}
    fields = {f.name for f in dataclasses.fields(PipeRow)}
    rows = []
    if check_m is not None:
        for sched, m in [("gpipe", 1)] + [(s, check_m) for s, _ in schedules]:
            rows.append(PipeRow(**{k: v for k, v in by[sched, m].items() if k in fields}))
    swept = [{"microbatches": m, **{s: by[s, m] for s, _ in schedules}} for m in ms]
    return rows, swept


def executed_result(plan: pp.Plan) -> sim.PipelineResult:
    """The timeline the executor runs, rebuilt from its ticks alone (each op from the tick it
    starts for as many ticks as the grid gives it): drawn beside the simulator's, it shows that
    the program is the schedule."""
    q = sim.simulate(plan.config).tick  # one grid column in the simulator's time unit
    spans = {}
    for tick in plan.ticks:
        for d, op in enumerate(tick.ops):
            if op is None:
                continue
            row, t = plan.grid[d], tick.index + 1
            while t < len(row) and row[t] is not None and not row[t].first:
                t += 1
            j = op.chunk * plan.config.stages + d
            key = (op.kind, j, op.microbatch)
            op_ = timeline.Op(key, d, (t - tick.index) * q)
            spans[key] = timeline.Span(op_, tick.index * q, t * q)
    cfg = plan.config
    return sim.PipelineResult(
        cfg,
        spans,
        timeline.makespan(spans),
        cfg.microbatches * (cfg.forward_time + cfg.backward_time),
        (),
    )


def plot_grids(plans: list[pp.Plan], path: str) -> str:
    """Per schedule, the simulator's timeline above the executor's."""
    from jaxscale.sim import plots

    results, titles = [], []
    for plan in plans:
        results += [sim.simulate(plan.config), executed_result(plan)]
        titles += ["simulated ", "executed "]
    return plots.pipeline(results, path, titles)


def main(args) -> int:
    """`jaxscale bench pipeline`: the checked rows, the sweep over M, the grids' plot."""
    import json
    import os
    from pathlib import Path

    from jaxscale.progress import Progress

    tcfg = verify.TCFG
    ms = tuple(args.sweep) if args.sweep else ()
    if args.dry_run:  # what would be compiled (and run), nothing more
        for sched, v in SCHEDULES:
            every = sorted(set(ms) | {CHECKED_M} | ({1} if sched == "gpipe" else set()))
            print(f"manual:dp+{sched:<12} {MESH} v={v} M=" + ",".join(map(str, every)))
        return 0
    n = len(set(ms) | {CHECKED_M}) * len(SCHEDULES) + 1
    bar = Progress(n, desc="bench pipeline", enabled=not args.json, eta=False)
    # every point in its own worker, one per core (a compile is one thread)
    # --time profiles in the workers too: two at once share the cores as the rows' devices do
    time_steps = args.time_steps if args.time else 0
    rows, swept = sweep(
        CFG, tcfg, ms, workers=min(os.cpu_count() or 1, 4), progress=bar, time_steps=time_steps
    )
    bar.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "rows": [
            dataclasses.asdict(r) | {"bubble_ok": r.bubble_ok, "permute_ok": r.permute_ok}
            for r in rows
        ],
        "sweep": swept,
        "mesh": MESH,
        "micro_rows": MICRO_ROWS,
    }
    (out / "bench_pipeline.json").write_text(json.dumps(record, indent=1))
    plans = [pp.make_plan(r.stages, r.microbatches, r.schedule, r.virtual_stages) for r in rows[1:]]
    png = None if args.no_plot else plot_grids(plans, args.plot or str(out / "bench_pipeline.png"))
    if args.json:
        print(json.dumps(record))
    else:
        print(
            f"{MESH}, one layer per virtual stage (d_model {CFG.d_model}), one microbatch of "
            f"{MICRO_ROWS} rows x 32 tokens per data shard:"
        )
        print(format_rows(rows))
        if time_steps:
            print()
            print(format_times(rows))
        if swept:
            print(f"\nAs M grows (compiled only; the M = {CHECKED_M} programs are the rows'):")
            print(format_sweep(swept))
        print(f"\nwrote {out / 'bench_pipeline.json'}" + (f", {png}" if png else ""))
    ok = all(r.bubble_ok and r.permute_ok and r.passed for r in rows)
    return 0 if ok else 1


def format_rows(rows: list[PipeRow]) -> str:
    width = max([28] + [len(r.label) for r in rows])
    head = (
        f"{'schedule':<{width}} {'mesh':<10} {'M':>3} {'ticks':>5} {'bubble meas/pred':>17} "
        f"{'(s4)':>6} {'CP ops':>6} {'CP KiB meas/pred':>17} {'stash':>5} {'temp KiB':>9} "
        f"{'moves KiB':>9} {'eq':>3}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        eq = "·" if r.passed is None else "✓" if r.passed else "✗"
        lines.append(
            f"{r.label:<{width}} {r.mesh:<10} {r.microbatches:>3} {r.ticks:>5} "
            f"{r.bubble:>8.1%}/{r.bubble_s2:<8.1%} {r.bubble_s4:>6.1%} {r.permutes:>6} "
            f"{r.permute_bytes / 1024:>8.1f}/{r.permute_predicted / 1024:<8.1f} "
            f"{r.stash_slots:>5} {r.temp_bytes / 1024:>9.1f} {r.layout_bytes / 1024:>9.1f} "
            f"{eq:>3}"
        )
    lines += [
        "bubble: idle / total ticks of the executed schedule vs (P-1)/(vM+P-1) (ZB-H1: "
        "(P-1)/(3M+P-1), t_B = 2 t_F);",
        "(s4): the same idle time over the ideal time, (P-1)/(vM) -- seed 004's convention.",
        "CP: the schedule's collective-permutes in the compiled step; KiB one pipeline moves vs "
        "2 M (vP-1) x [B_m, T, D].",
        "moves: per device, the stage parameters GSPMD moves between the stored and the "
        "interleaved (circular) layout.",
        "eq: 10 steps with real updates against one device: losses and final parameters within "
        "the f32 tolerances (jaxscale verify also checks the first step's gradients).",
    ]
    return "\n".join(lines)


def format_times(rows: list[PipeRow]) -> str:
    """--time: the bubble in milliseconds. On a pipeline a device waits for its neighbour's
    activations inside the collective-permute (XLA:CPU's rendezvous), so the time not computing
    (collectives not under compute, and idle) is the measured bubble plus the transfers; the
    tick bubble's share of the measured step is what the schedule alone predicts."""
    lines = [
        "time per step (ms, mean of devices over the profiled steps; simulated CPU devices: "
        "indicative)",
        f"  {'schedule':<32} {'M':>3} {'step':>7} {'compute':>8} {'comm':>7} {'idle':>6} "
        f"{'not computing':>14} {'tick bubble x step':>19}",
    ]
    for r in rows:
        if r.step_ms is None:
            continue
        waiting = r.step_ms - r.compute_ms
        share = waiting / r.step_ms
        lines.append(
            f"  {r.label:<32} {r.microbatches:>3} {r.step_ms:>7.2f} {r.compute_ms:>8.2f} "
            f"{r.collective_ms:>7.2f} {r.idle_ms:>6.2f} {waiting:>7.2f} ({share:>4.0%}) "
            f"{r.bubble * r.step_ms:>11.2f} ({r.bubble:>4.0%})"
        )
    return "\n".join(lines)


def format_sweep(swept: list[dict]) -> str:
    names = [k for k in swept[0] if k != "microbatches"]
    head = f"{'M':>3} " + " ".join(f"{n:>26}" for n in names)
    sub = "    " + " ".join(f"{'cpu s  ticks  temp KiB':>26}" for _ in names)
    lines = [head, sub]
    for rec in swept:
        cells = [
            f"{r['compile_cpu_s']:>9.1f} {r['compiled_ticks']:>3}/{r['ticks']:<3}"
            f"{r['temp_bytes'] / 1024:>10.0f}"
            for r in (rec[n] for n in names)
        ]
        lines.append(f"{rec['microbatches']:>3} " + " ".join(f"{c:>26}" for c in cells))
    first, last = swept[0], swept[-1]
    if last["microbatches"] > first["microbatches"]:
        ratios = ", ".join(
            f"{n} {last[n]['compile_cpu_s'] / first[n]['compile_cpu_s']:.2f}" for n in names
        )
        lines.append(f"compile at M={last['microbatches']} / M={first['microbatches']}: {ratios}")
    lines += [
        "cpu s: lowering + compiling at XLA's backend optimisation level 0, CPU seconds of the "
        "compiling process (the suite runs beside other work; wall seconds are in the JSON);",
        "ticks: tick programs compiled / ticks executed: the steady state is one loop body, so "
        "what is compiled stops growing with M once the schedule has one;",
        "temp: compiler temporaries (memory_analysis): GPipe stashes every microbatch's stage "
        "input, the others at most P.",
    ]
    return "\n".join(lines)
