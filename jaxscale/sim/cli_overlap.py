"""`jaxscale simulate overlap`: scheduling and launch overhead, virtual clock (seed 002 ch10)."""

from dataclasses import asdict

from jaxscale.checks import at_most
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    guarded,
    overrides,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report
from jaxscale.sim import overlap as ov
from jaxscale.sim import timeline

BAR_BATCHES = 4  # timeline bars (seed 002 ch10 scheduling_overhead_benchmark.py)
BAR_CHARS_PER_MS = 2  # its visualize_timeline
LAUNCH_BAR_ITERATIONS = 2
MAX_BAR_CHARS = 160  # a longer bar is drawn at a coarser scale
# Every op is simulated, in each of the three modes; the per-batch and per-iteration figures
# settle within a few of each, so these bounds (~1 s each) lose nothing.
MAX_BATCHES = 10_000
MAX_LAUNCHES = 20_000
WHY = "the per-batch and per-iteration figures are the same for longer runs"
DESCRIBE = {
    "sequential": "S -> C -> P, one after another",
    "overlap": "S(n+1) during C(n); C(n+1) waits for P(n) (seed's model)",
    "futuremap": "C(n+1) needs only S(n+1); P(n) overlaps too",
    "eager": "a launch per kernel, host waits for each (seed's 'normal')",
    "graph": "one launch per iteration (seed's CUDA graph replay)",
    "async": "a launch per kernel, host never waits (async dispatch)",
}


def add_parser(sim_sub) -> None:
    p = add_command(
        sim_sub,
        "overlap",
        help="scheduling-overhead and kernel-launch models on a virtual clock (no sleeping)",
        description="Seed 002 ch10: scheduling_overhead_benchmark.py (sequential vs overlapped "
        "CPU scheduling) and cuda_graph_simple.py --force-cpu (per-kernel launches vs one graph "
        "launch), as event simulations of one CPU and one GPU.",
        example="jaxscale simulate overlap --batches 20 --compute-ms 10 --plot overlap.png",
    )
    s, launch = ov.SchedulingConfig(), ov.LaunchConfig()
    g = p.add_argument_group("scheduling_overhead_benchmark.py flags")
    g.add_argument(
        "--batches",
        "-b",
        type=positive_int,
        default=s.batches,
        help=f"batches to serve, at most {MAX_BATCHES:,}",
    )
    g.add_argument(
        "--scheduling-ms",
        type=positive_float,
        default=s.scheduling_ms,
        help="CPU scheduling time S per batch",
    )
    g.add_argument(
        "--compute-ms",
        type=positive_float,
        default=s.compute_ms,
        help="GPU compute time C per batch",
    )
    g.add_argument(
        "--postprocess-ms",
        type=positive_float,
        default=s.postprocess_ms,
        help="CPU postprocessing time P per batch",
    )
    g = p.add_argument_group("cuda_graph_simple.py --force-cpu model")
    g.add_argument(
        "--iterations",
        type=positive_int,
        default=launch.iterations,
        help=f"iterations (x --kernels: at most {MAX_LAUNCHES:,})",
    )
    g.add_argument(
        "--kernels", type=positive_int, default=launch.kernels, help="kernels per iteration"
    )
    g.add_argument(
        "--launch-ms",
        type=positive_float,
        default=launch.launch_ms,
        help="CPU time of one kernel launch",
    )
    g.add_argument(
        "--kernel-compute-ms",
        type=positive_float,
        default=launch.compute_ms,
        help="GPU compute per iteration, all kernels together",
    )
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run))


def _x(v: float) -> str:
    return f"{v:.2f}x"


SCHED_COLS = [
    Col("mode", "mode"),
    Col("total_ms", "total ms", ".2f"),
    Col("ms_per_batch", "ms/batch", ".2f"),
    Col("speedup", "speedup", _x),
    Col("gpu_busy", "GPU busy", ".1%"),
    Col("seed_ideal_ms", "seed's ideal ms", ".2f"),
]
LAUNCH_COLS = [
    Col("mode", "mode"),
    Col("total_ms", "total ms", ".2f"),
    Col("ms_per_iteration", "ms/iteration", ".3f"),
    Col("launch_ms_per_iteration", "launch ms/iteration", "g"),
    Col("speedup", "speedup vs eager", _x),
]


def _bars(r: Report, bars: dict) -> None:
    for mode, bar in bars.items():
        r.say(f"  {mode}:", f"    CPU: {bar['cpu']}", f"    GPU: {bar['gpu']}")


def _by_mode(rows: list[dict], key: str) -> dict:
    return {row["mode"]: row[key] for row in rows}


def _gpu_busy(spans: dict) -> float:
    return sum(s.end - s.start for s in spans.values() if s.op.resource == "gpu")


def run(args) -> int:
    at_most(MAX_BATCHES, "batches", WHY, batches=args.batches)
    at_most(MAX_LAUNCHES, "kernel launches", WHY, iterations=args.iterations, kernels=args.kernels)
    scfg = ov.SchedulingConfig(**overrides(args, ov.SchedulingConfig))
    lcfg = ov.LaunchConfig(args.iterations, args.kernels, args.launch_ms, args.kernel_compute_ms)
    sched = {m: ov.simulate_scheduling(scfg, m) for m in ov.SCHEDULING_MODES}
    launch = {m: ov.simulate_launch(lcfg, m) for m in ov.LAUNCH_MODES}
    seed = ov.seed_ideal_ms(scfg)
    analysis = ov.scheduling_analysis(scfg)
    shown = min(BAR_BATCHES, args.batches)
    bar_end = {m: s[("P", shown - 1)].end for m, s in sched.items()}
    per_ms = min(BAR_CHARS_PER_MS, MAX_BAR_CHARS / max(bar_end.values()))
    bars = {m: ov.bars(s, bar_end[m], per_ms) for m, s in sched.items()}
    total = {m: timeline.makespan(s) for m, s in sched.items()}
    srows = [
        {
            "mode": m,
            "total_ms": t,
            "ms_per_batch": t / args.batches,
            "speedup": total["sequential"] / t,
            "gpu_busy": _gpu_busy(sched[m]) / t,
            "seed_ideal_ms": seed.get(m),
        }
        for m, t in total.items()
    ]
    ltotal = {m: timeline.makespan(s) for m, s in launch.items()}
    lrows = [
        {
            "mode": m,
            "total_ms": t,
            "ms_per_iteration": t / args.iterations,
            "launch_ms_per_iteration": ov.launch_overhead_per_iteration_ms(lcfg, m),
            "speedup": ltotal["eager"] / t,
        }
        for m, t in ltotal.items()
    ]
    lbar_end = {row["mode"]: row["ms_per_iteration"] * LAUNCH_BAR_ITERATIONS for row in lrows}
    lper_ms = min(1 / args.launch_ms, MAX_BAR_CHARS / max(lbar_end.values()))
    lbars = {m: ov.bars(s, lbar_end[m], lper_ms) for m, s in launch.items()}
    char_ms = args.launch_ms if lper_ms == 1 / args.launch_ms else 1 / lper_ms
    eager, graph = lrows[0], lrows[1]

    r = Report("simulate overlap")
    r.say(
        "jaxscale simulate overlap — virtual clock, one CPU and one GPU (seed 002 ch10)",
        "",
        f"scheduling overhead: {args.batches} batches, schedule S={args.scheduling_ms:g} ms (CPU), "
        f"compute C={args.compute_ms:g} ms (GPU), postprocess P={args.postprocess_ms:g} ms (CPU)",
    )
    r.table(None, SCHED_COLS, srows)
    r.say(
        *[f"  {m}: {DESCRIBE[m]}" for m in ov.SCHEDULING_MODES],
        f"overhead without overlap: (S+P)/(S+C+P) = {analysis['overhead_fraction']:.1%}; "
        f"with overlap the effective overhead is P = {analysis['effective_overhead_ms']:g} ms, "
        f"a {analysis['overhead_reduction']:.0%} reduction (seed's ANALYSIS).",
        "",
        f"timeline, first {shown} batches ({per_ms:g} chars/ms; S schedule, C compute, "
        "P postprocess, . idle):",
    )
    _bars(r, bars)
    r.say(
        "",
        f"launch overhead: {args.iterations} iterations x {args.kernels} kernels, launch "
        f"{args.launch_ms:g} ms each, {args.kernel_compute_ms:g} ms GPU compute per iteration",
    )
    r.table(None, LAUNCH_COLS, lrows)
    r.say(
        *[f"  {m}: {DESCRIBE[m]}" for m in ov.LAUNCH_MODES],
        f"seed prints {eager['total_ms']:.1f} vs {graph['total_ms']:.1f} ms = "
        f"{graph['speedup']:.2f}x; overhead {eager['launch_ms_per_iteration']:g} -> "
        f"{graph['launch_ms_per_iteration']:g} ms per iteration. "
        "'async' hides launches whenever a kernel outlasts a launch.",
        "",
        f"timeline, first {LAUNCH_BAR_ITERATIONS} iterations (1 char = {char_ms:g} ms; "
        "L launch, K kernel):",
    )
    _bars(r, lbars)
    r.put(
        scheduling={
            "config": asdict(scfg),
            "total_ms": total,
            "seed_ideal_ms": seed,
            "speedup": _by_mode(srows, "speedup"),
            "analysis": analysis,
            "bars": bars,
        },
        launch={
            "config": asdict(lcfg),
            "total_ms": ltotal,
            "speedup_vs_eager": _by_mode(lrows, "speedup"),
            "bars": lbars,
        },
    )
    if args.plot:
        from jaxscale.sim import plots

        named = {f"scheduling: {m}": (sched[m], bar_end[m]) for m in ov.SCHEDULING_MODES}
        named |= {f"launch: {m}": (launch[m], lbar_end[m]) for m in ov.LAUNCH_MODES}
        r.say(f"\nplot written to {plots.timelines(named, args.plot)}")
        r.put(plot=args.plot)
    r.emit(args)
    return 0
