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
import numpy as np

from jaxscale import verify
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.parallel import pp
from jaxscale.parallel.compose import Strategy, build
from jaxscale.sim import pipeline as sim
from jaxscale.sim import timeline

ROWS = (  # (strategy, mesh, microbatches, virtual stages): the bench's pipeline rows
    ("manual:dp+gpipe", "pp=4,dp=2", 1, 1),  # seed 004's naive model parallelism: M = 1
    ("manual:dp+gpipe", "pp=4,dp=2", 4, 1),
    ("manual:dp+1f1b", "pp=4,dp=2", 4, 1),
    ("manual:dp+interleaved", "pp=4,dp=2", 4, 2),
    ("manual:dp+zb-h1", "pp=4,dp=2", 4, 1),
)
CFG = verify.CFG.replace(n_layers=8)  # 2 layers per stage on pp=4 (1 per virtual stage)
SWEEP = (4, 8, 16, 32)  # M for compile time and temporaries at fixed P
SWEEP_MESH = ("pp=2,dp=4", 2)  # mesh and its stage count
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))


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
    compile_s: float
    layout_bytes: float = 0.0  # per device: interleaving's moves between layouts (GSPMD's)
    passed: bool | None = None  # the 10-step equivalence check (None: not run)

    @property
    def bubble_ok(self) -> bool:
        return abs(self.bubble - self.bubble_s2) < 1e-9

    @property
    def permute_ok(self) -> bool:
        return self.permute_bytes == self.permute_predicted


def activation_shape(cfg: ModelConfig, tcfg: TrainConfig, built) -> tuple[tuple, float]:
    """One microbatch's stage output on one device, [B_m, T, D] in compute dtype (T/t under
    sequence parallelism), and its bytes."""
    rows = tcfg.global_batch // built.data_ways // built.strategy.microbatches
    seq = tcfg.seq_len // (built.tensor_ways if built.strategy.tensor == "sequence" else 1)
    shape = (rows, seq, cfg.d_model)
    return shape, float(np.prod(shape)) * np.dtype(cfg.compute_dtype).itemsize


def pipe_row(text: str, mesh: str, m: int, v: int, cfg: ModelConfig, tcfg: TrainConfig,
             ref: verify.Trajectory | None = None) -> PipeRow:  # fmt: skip
    """Compile (and, given the reference, run and check) one pipeline strategy."""
    strategy = Strategy.parse(text, mesh, microbatches=m, virtual_stages=v)
    built = build(strategy, cfg, tcfg, with_grads=ref is not None)
    with jax.set_mesh(built.mesh):
        compiled, report = compile_with_report(built.step, *built.abstract_args(
            tcfg.global_batch, tcfg.seq_len))  # fmt: skip
    row = measure(built, report, cfg, tcfg)
    if ref is not None:
        got = verify.run_built(built, tcfg, step=compiled, initial=ref.initial)
        row.passed = verify.compare(verify.Case(strategy), got, ref).passed
    return row


def measure(built, report, cfg: ModelConfig, tcfg: TrainConfig) -> PipeRow:
    """A pipelined strategy's compiled step against its plan and formulas."""
    plan, strategy = built.plan, built.strategy
    act_shape, act_bytes = activation_shape(cfg, tcfg, built)
    # the schedule's transfers carry [B_m, T, D]; any other collective-permute is GSPMD moving
    # the interleaved schedule's stage parameters between the stored and the circular layout
    permutes = [c for c in report.collectives if c.op == "collective-permute"
                and all(dims == act_shape for _, dims in c.shapes)]  # fmt: skip
    layout = [c for c in report.collectives if c.op in ("collective-permute", "all-to-all")
              and c not in permutes]  # fmt: skip
    n = len(built.mesh.devices.flat)
    occ = plan.occupancy()
    return PipeRow(
        built.label, strategy.mesh, strategy.schedule, plan.config.stages,
        strategy.microbatches, strategy.virtual_stages, occ["ticks"], occ["bubble"],
        sim.predicted_bubble(plan.config, "s2"), sim.predicted_bubble(plan.config, "s4"),
        sum(c.trips for c in permutes),  # executed: a scanned tick's permutes once per trip
        # per pipeline: the pipeline's replicas over the data and tensor axes send the same
        plan.config.stages / n * sum(c.bytes_per_device * c.num_groups * c.trips
                                     for c in permutes),
        pp.predict_comm(plan, act_bytes)["collective-permute"],
        plan.stash_slots, report.memory.temp, report.compile_s,
        layout_bytes=sum(c.bytes_per_device * c.num_groups * c.trips for c in layout) / n,
    )  # fmt: skip


def sweep_point(cfg: ModelConfig, tcfg: TrainConfig, m: int, schedule: str, v: int) -> dict:
    """One schedule at M microbatches on SWEEP_MESH, compiled (not run)."""
    mesh, p = SWEEP_MESH
    # one microbatch of 32 rows x 32 tokens per data shard whatever M (the batch grows with M),
    # one layer per virtual stage, rematerialised: the stash of stage inputs, not one
    # microbatch's working set or the parameters, is what M can move
    t = tcfg.replace(global_batch=32 * m * 4, seq_len=32)
    c = cfg.replace(n_layers=p * v, remat=True)
    cpu0 = time.process_time()
    row = pipe_row(f"manual:dp+{schedule}", mesh, m, v, c, t)
    cpu_s = time.process_time() - cpu0
    return {"temp_bytes": row.temp_bytes, "stash_slots": row.stash_slots,
            "compile_s": row.compile_s, "compile_cpu_s": cpu_s, "ticks": row.ticks,
            "compiled_ticks": pp.make_plan(p, m, schedule, v).compiled_ticks()}  # fmt: skip


def _worker_init(n_devices: int, fast_compile: bool) -> None:
    jax.config.update("jax_num_cpu_devices", n_devices)
    jax.config.update("jax_disable_most_optimizations", fast_compile)


def _worker_point(job) -> dict:
    return sweep_point(*job)


def sweep(cfg: ModelConfig, tcfg: TrainConfig, ms=SWEEP, schedules=SCHEDULES, workers: int = 1,
          progress=None) -> list[dict]:  # fmt: skip
    """Each schedule compiled (not run) as M grows at fixed P: compile seconds and the tick
    programs compiled (the steady state is one loop body, so both stop growing once M reaches
    it), and the compiler temporaries (GPipe stashes all M microbatches' stage inputs, 1F1B
    and its kin at most P). With `workers` > 1 the compiles run in that many processes (a
    compile is one thread): compile seconds are then measured with that many compiling at
    once, one per core."""
    jobs = [(cfg, tcfg, m, sched, v) for m in ms for sched, v in schedules]
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        init = (jax.device_count(), bool(jax.config.jax_disable_most_optimizations))
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_init, initargs=init) as pool:  # fmt: skip
            # the longest compiles first (interleaving's, large M), so the pool ends together
            order = sorted(range(len(jobs)), key=lambda i: (-jobs[i][4], -jobs[i][2]))
            futures = {i: pool.submit(_worker_point, jobs[i]) for i in order}
            points = {}
            for i in order:
                points[i] = futures[i].result()
                if progress:
                    progress.update(1, note=f"sweep {jobs[i][3]} M={jobs[i][2]}")
            points = [points[i] for i in range(len(jobs))]
    else:
        points = []
        for job in jobs:
            points.append(sweep_point(*job))
            if progress:
                progress.update(1, note=f"sweep {job[3]} M={job[2]}")
    out = []
    for i, m in enumerate(ms):
        rec = {"microbatches": m}
        for k, (sched, _) in enumerate(schedules):
            rec[sched] = points[i * len(schedules) + k]
        out.append(rec)
    return out


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
    """`jaxscale bench pipeline`: the rows, the GPipe vs 1F1B temporaries, the grids' plot."""
    import json
    import os
    from pathlib import Path

    from jaxscale.progress import Progress

    tcfg = verify.TCFG
    ms = tuple(args.sweep) if args.sweep else ()
    n_points = len(ms) * len(SCHEDULES)
    bar = Progress(len(ROWS) + 1 + n_points, desc="bench pipeline", enabled=not args.json)
    ref = verify.reference(CFG, tcfg)
    bar.update(1, note="reference")
    rows = []
    for text, mesh, m, v in ROWS:
        rows.append(pipe_row(text, mesh, m, v, CFG, tcfg, ref))
        bar.update(1, note=f"{rows[-1].label} {mesh}")
    # the sweep's compiles alone on the host's cores, one process per core
    swept = sweep(CFG, tcfg, ms, workers=min(os.cpu_count() or 1, 4), progress=bar) if ms else []
    bar.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"rows": [dataclasses.asdict(r) | {"bubble_ok": r.bubble_ok,
                                                "permute_ok": r.permute_ok} for r in rows],
              "sweep": swept, "mesh_of_sweep": SWEEP_MESH[0]}  # fmt: skip
    (out / "bench_pipeline.json").write_text(json.dumps(record, indent=1))
    plans = [pp.make_plan(r.stages, r.microbatches, r.schedule, r.virtual_stages)
             for r in rows[1:]]  # fmt: skip
    png = None if args.no_plot else plot_grids(plans, args.plot or str(out / "bench_pipeline.png"))
    if args.json:
        print(json.dumps(record))
    else:
        print(format_rows(rows))
        if swept:
            print(
                f"\nAs M grows on {SWEEP_MESH[0]} (compiled, not run; one microbatch of 32 "
                "rows x 32 tokens per data shard, one layer per virtual stage):"
            )
            print(format_sweep(swept))
        print(f"\nwrote {out / 'bench_pipeline.json'}" + (f", {png}" if png else ""))
    ok = all(r.bubble_ok and r.permute_ok and r.passed for r in rows)
    return 0 if ok else 1


def format_rows(rows: list[PipeRow]) -> str:
    width = max([28] + [len(r.label) for r in rows])
    head = (f"{'schedule':<{width}} {'mesh':<10} {'M':>3} {'ticks':>5} {'bubble meas/pred':>17} "
            f"{'(s4)':>6} {'CP ops':>6} {'CP KiB meas/pred':>17} {'stash':>5} {'temp KiB':>9} "
            f"{'moves KiB':>9} {'eq':>3}")  # fmt: skip
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
    ]
    return "\n".join(lines)


def format_sweep(swept: list[dict]) -> str:
    names = [k for k in swept[0] if k != "microbatches"]
    head = f"{'M':>3} " + " ".join(f"{n:>26}" for n in names)
    sub = "    " + " ".join(f"{'compile s  ticks  temp KiB':>26}" for _ in names)
    lines = [head, sub]
    for rec in swept:
        cells = [f"{r['compile_s']:>9.1f} {r['compiled_ticks']:>3}/{r['ticks']:<3}"
                 f"{r['temp_bytes'] / 1024:>10.0f}" for r in (rec[n] for n in names)]  # fmt: skip
        lines.append(f"{rec['microbatches']:>3} " + " ".join(f"{c:>26}" for c in cells))
    first, last = swept[0], swept[-1]
    if last["microbatches"] > first["microbatches"]:
        ratios = ", ".join(f"{n} {last[n]['compile_s'] / first[n]['compile_s']:.2f}"
                           for n in names)  # fmt: skip
        lines.append(f"compile s at M={last['microbatches']} / M={first['microbatches']}: "
                     f"{ratios}")  # fmt: skip
    lines += [
        "ticks: tick programs compiled / ticks executed: the steady state is one loop body, so "
        "what is compiled stops growing with M once the schedule has one;",
        "temp: compiler temporaries (memory_analysis): GPipe stashes every microbatch's stage "
        "input, the others at most P.",
    ]
    return "\n".join(lines)
