"""`jaxscale simulate overlap`: scheduling and launch overhead, virtual clock (seed 002 ch10)."""

from dataclasses import asdict

from jaxscale.calc.training_format import (
    add_output_flags,
    emit,
    format_table,
    positive_float,
    positive_int,
)
from jaxscale.sim import overlap as ov
from jaxscale.sim import timeline
from jaxscale.sim.cli import guarded

BAR_BATCHES = 4  # batches drawn in the timeline bars (seed 002 L8713-8714)
BAR_CHARS_PER_MS = 2  # L8603
LAUNCH_BAR_ITERATIONS = 2


def add_command(sim_sub) -> None:
    p = sim_sub.add_parser(
        "overlap",
        help="scheduling-overhead and kernel-launch models on a virtual clock (no sleeping)",
        description="Seed 002 ch10: scheduling_overhead_benchmark.py (sequential vs overlapped "
        "CPU scheduling) and cuda_graph_simple.py --force-cpu (per-kernel launches vs one graph "
        "launch), as event simulations of one CPU and one GPU.",
    )
    s, launch = ov.SchedulingConfig(), ov.LaunchConfig()
    g = p.add_argument_group("scheduling_overhead_benchmark.py flags")
    g.add_argument("--batches", "-b", type=positive_int, default=s.batches)
    g.add_argument("--scheduling-ms", type=positive_float, default=s.scheduling_ms)
    g.add_argument("--compute-ms", type=positive_float, default=s.compute_ms)
    g.add_argument("--postprocess-ms", type=positive_float, default=s.postprocess_ms)
    g = p.add_argument_group("cuda_graph_simple.py --force-cpu model")
    g.add_argument("--iterations", type=positive_int, default=launch.iterations)
    g.add_argument("--kernels", type=positive_int, default=launch.kernels)
    g.add_argument("--launch-ms", type=positive_float, default=launch.launch_ms)
    g.add_argument(
        "--kernel-compute-ms",
        type=positive_float,
        default=launch.compute_ms,
        help="GPU compute per iteration, all kernels together",
    )
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run))


def _gpu_busy(spans: dict) -> float:
    return sum(s.end - s.start for s in spans.values() if s.op.resource == "gpu")


def run(args) -> int:
    scfg = ov.SchedulingConfig(
        args.batches, args.scheduling_ms, args.compute_ms, args.postprocess_ms
    )
    lcfg = ov.LaunchConfig(args.iterations, args.kernels, args.launch_ms, args.kernel_compute_ms)
    sched = {m: ov.simulate_scheduling(scfg, m) for m in ov.SCHEDULING_MODES}
    launch = {m: ov.simulate_launch(lcfg, m) for m in ov.LAUNCH_MODES}
    total = {m: timeline.makespan(s) for m, s in sched.items()}
    ltotal = {m: timeline.makespan(s) for m, s in launch.items()}
    seed = ov.seed_ideal_ms(scfg)
    analysis = ov.scheduling_analysis(scfg)
    shown = min(BAR_BATCHES, args.batches)
    bar_end = {m: s[("P", shown - 1)].end for m, s in sched.items()}
    bars = {m: ov.bars(s, bar_end[m], BAR_CHARS_PER_MS) for m, s in sched.items()}
    iter_ms = {m: ltotal[m] / args.iterations for m in ov.LAUNCH_MODES}
    lbar_end = {m: iter_ms[m] * LAUNCH_BAR_ITERATIONS for m in ov.LAUNCH_MODES}
    lbars = {m: ov.bars(s, lbar_end[m], 1 / args.launch_ms) for m, s in launch.items()}
    describe = {
        "sequential": "S -> C -> P, one after another",
        "overlap": "S(n+1) during C(n); C(n+1) waits for P(n) (seed's model)",
        "futuremap": "C(n+1) needs only S(n+1); P(n) overlaps too",
        "eager": "a launch per kernel, host waits for each (seed's 'normal')",
        "graph": "one launch per iteration (seed's CUDA graph replay)",
        "async": "a launch per kernel, host never waits (async dispatch)",
    }
    lines = [
        "jaxscale simulate overlap — virtual clock, one CPU and one GPU (seed 002 ch10)",
        "",
        f"scheduling overhead: {args.batches} batches, schedule S={args.scheduling_ms:g} ms (CPU), "
        f"compute C={args.compute_ms:g} ms (GPU), postprocess P={args.postprocess_ms:g} ms (CPU)",
        format_table(
            ["mode", "total ms", "ms/batch", "speedup", "GPU busy", "seed's ideal ms"],
            [
                [
                    m,
                    f"{total[m]:.2f}",
                    f"{total[m] / args.batches:.2f}",
                    f"{total['sequential'] / total[m]:.2f}x",
                    f"{_gpu_busy(sched[m]) / total[m]:.1%}",
                    f"{seed[m]:.2f}" if m in seed else "-",
                ]
                for m in ov.SCHEDULING_MODES
            ],
        ),
        *[f"  {m}: {describe[m]}" for m in ov.SCHEDULING_MODES],
        f"overhead without overlap: (S+P)/(S+C+P) = {analysis['overhead_fraction']:.1%}; "
        f"with overlap the effective overhead is P = {analysis['effective_overhead_ms']:g} ms, "
        f"a {analysis['overhead_reduction']:.0%} reduction (seed's ANALYSIS).",
        "",
        f"timeline, first {shown} batches ({BAR_CHARS_PER_MS} chars/ms; S schedule, C compute, "
        "P postprocess, . idle):",
    ]
    for m in ov.SCHEDULING_MODES:
        lines += [f"  {m}:", f"    CPU: {bars[m]['cpu']}", f"    GPU: {bars[m]['gpu']}"]
    lines += [
        "",
        f"launch overhead: {args.iterations} iterations x {args.kernels} kernels, launch "
        f"{args.launch_ms:g} ms each, {args.kernel_compute_ms:g} ms GPU compute per iteration",
        format_table(
            ["mode", "total ms", "ms/iteration", "launch ms/iteration", "speedup vs eager"],
            [
                [
                    m,
                    f"{ltotal[m]:.2f}",
                    f"{iter_ms[m]:.3f}",
                    f"{ov.launch_overhead_per_iteration_ms(lcfg, m):g}",
                    f"{ltotal['eager'] / ltotal[m]:.2f}x",
                ]
                for m in ov.LAUNCH_MODES
            ],
        ),
        *[f"  {m}: {describe[m]}" for m in ov.LAUNCH_MODES],
        f"seed prints {ltotal['eager']:.1f} vs {ltotal['graph']:.1f} ms = "
        f"{ltotal['eager'] / ltotal['graph']:.2f}x; overhead "
        f"{ov.launch_overhead_per_iteration_ms(lcfg, 'eager'):g} -> "
        f"{ov.launch_overhead_per_iteration_ms(lcfg, 'graph'):g} ms per iteration. "
        "'async' hides launches whenever a kernel outlasts a launch.",
        "",
        f"timeline, first {LAUNCH_BAR_ITERATIONS} iterations (1 char = {args.launch_ms:g} ms; "
        "L launch, K kernel):",
    ]
    for m in ov.LAUNCH_MODES:
        lines += [f"  {m}:", f"    CPU: {lbars[m]['cpu']}", f"    GPU: {lbars[m]['gpu']}"]
    report = {
        "command": "simulate overlap",
        "scheduling": {
            "config": asdict(scfg),
            "total_ms": total,
            "seed_ideal_ms": seed,
            "speedup": {m: total["sequential"] / total[m] for m in total},
            "analysis": analysis,
            "bars": bars,
        },
        "launch": {
            "config": asdict(lcfg),
            "total_ms": ltotal,
            "speedup_vs_eager": {m: ltotal["eager"] / ltotal[m] for m in ltotal},
            "bars": lbars,
        },
    }
    if args.plot:
        from jaxscale.sim import plots

        named = {f"scheduling: {m}": (sched[m], bar_end[m]) for m in ov.SCHEDULING_MODES}
        named |= {f"launch: {m}": (launch[m], lbar_end[m]) for m in ov.LAUNCH_MODES}
        lines.append(f"\nplot written to {plots.timelines(named, args.plot)}")
        report["plot"] = args.plot
    emit(args, report, lines)
    return 0
