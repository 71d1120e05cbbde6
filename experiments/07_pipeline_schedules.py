"""Pipeline schedules: GPipe, 1F1B, interleaved 1F1B and ZB-H1 (seed 002 ch7, seed 004 §6).

    .venv/bin/python experiments/07_pipeline_schedules.py --pp 4 --microbatches 8

Reproduces pipeline_schedule_viz.py (seed 002 ch7) with its defects fixed: the
schedules come from a dependency-driven simulation (jaxscale.sim.pipeline), the bubble is
(P-1)/(M+P-1) for both GPipe and 1F1B (the seed's naive 68.6% is defect 3), 1F1B holds P-s
microbatches of activations on stage s where GPipe holds M, and the bubble-vs-microbatch table the
seed never prints (defect 5) is shown under both conventions, with seed 004's efficiency column.
The last section prints the real executor's program (jaxscale/parallel/pp/, the per-device
ticks of the compiled step) beside the simulator's timeline, ZB-H1 included.
Plots: results/07_pipeline_gantt.png, results/07_bubble_vs_microbatches.png,
results/07_executed_grids.png.
"""

import argparse
import os

from jaxscale.checks import at_most
from jaxscale.cliutil import hidden_alias, positive_float, positive_int, writable_dir
from jaxscale.render import Col, table
from jaxscale.sim import pipeline as pp
from jaxscale.sim import plots
from jaxscale.sim.cli_pipeline import MAX_STAGE_MICROBATCHES, MAX_STAGES, WHY


def _peaks(peaks) -> str:
    return " ".join(f"{x:g}" for x in peaks)


SUMMARY_COLS = [
    Col("name", "schedule"),
    Col("makespan", "makespan", "g"),
    Col("bubble_s2", "bubble (idle/total)", ".2%"),
    Col("bubble_s4", "bubble (idle/ideal)", ".2%"),
    Col("peak_activations", "peak act/stage", _peaks),
]


def summary(results) -> str:
    return table(
        SUMMARY_COLS,
        [
            {
                "name": r.config.schedule
                + (f" v={r.config.virtual_stages}" if r.config.virtual_stages > 1 else ""),
                "makespan": r.makespan,
                "bubble_s2": r.bubble_s2,
                "bubble_s4": r.bubble_s4,
                "peak_activations": r.peak_activations,
            }
            for r in results
        ],
    )


def schedules(p: int, m: int, v: int, t_b: float) -> list:
    out = [pp.simulate(pp.PipelineConfig(p, m, s, 1.0, t_b)) for s in ("gpipe", "1f1b")]
    if m % p == 0:
        out.append(pp.simulate(pp.PipelineConfig(p, m, "interleaved", 1.0, t_b, v)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a = ap.add_argument("--pp", "-s", type=positive_int, default=4, help="pipeline stages P (4)")
    hidden_alias(ap, a, "--stages")
    ap.add_argument("--microbatches", "-m", type=positive_int, default=8, help="microbatches M (8)")
    ap.add_argument(
        "--virtual-stages",
        "-v",
        type=positive_int,
        default=2,
        help="model chunks per device, interleaved (2)",
    )
    ap.add_argument(
        "--backward-ratio", type=positive_float, default=2.0, help="t_B / t_F for table 2 (2)"
    )
    ap.add_argument("--out", type=writable_dir, default="results", help="folder for the plots")
    args = ap.parse_args()
    p, m, v = args.pp, args.microbatches, args.virtual_stages
    try:  # the bounds of `jaxscale simulate pipeline`
        at_most(MAX_STAGES, "stages", WHY, pp=p)
        at_most(
            MAX_STAGE_MICROBATCHES,
            "stage-microbatches",
            WHY,
            pp=p,
            microbatches=m,
            virtual_stages=v,
        )
    except ValueError as err:
        ap.error(str(err))

    equal = schedules(p, m, v, 1.0)
    print(f"== P={p} stages, M={m} microbatches, t_F = t_B = 1 ==")
    print(summary(equal))
    for r in equal:
        print(f"\n{r.config.schedule} ('..' idle):\n{r.grid()}")

    print(
        f"\n== the same with t_B = {args.backward_ratio:g} t_F: the bubble share does not move =="
    )
    print(summary(schedules(p, m, v, args.backward_ratio)))

    rows = pp.bubble_table(p, virtual_stages=v)
    print(f"\n== bubble vs microbatches, P={p} (seed 002 ch7; seed 004 §6) ==")
    print(
        table(
            [
                Col("microbatches", "M"),
                Col("bubble_s2", "(P-1)/(M+P-1)", ".1%"),
                Col("simulated_1f1b_bubble", "simulated 1F1B", ".1%"),
                Col("simulated_interleaved_bubble", f"interleaved v={v}", ".1%"),
                Col("bubble_s4", "(P-1)/M", ".1%"),
                Col("efficiency_s4", "seed 004 efficiency", ".1%"),
            ],
            rows,
        )
    )

    print(f"\n== peak activations, stage 0 (microbatches held), P={p} ==")
    peaks = [
        {"M": mb}
        | {
            s: pp.simulate(pp.PipelineConfig(p, mb, s)).peak_activations[0]
            for s in ("gpipe", "1f1b")
        }
        for mb in (4, 8, 16, 32)
    ]
    print(table([Col("M", "M"), Col("gpipe", "GPipe", "g"), Col("1f1b", "1F1B", "g")], peaks))

    os.makedirs(args.out, exist_ok=True)
    gantt = plots.pipeline(equal, os.path.join(args.out, "07_pipeline_gantt.png"))
    curve = plots.bubble_curve(p, rows, os.path.join(args.out, "07_bubble_vs_microbatches.png"))
    executed = executor_grids(p, m, v, os.path.join(args.out, "07_executed_grids.png"))
    print(f"\nplots: {gantt}, {curve}, {executed}")


def executor_grids(p: int, m: int, v: int, path: str) -> str:
    """The real executor's program (jaxscale/parallel/pp/: what each device starts at each
    tick of the compiled step, t_B = 2 t_F) beside the simulator's timeline, per schedule."""
    from jaxscale.bench.pipeline import executed_result, plot_grids
    from jaxscale.parallel import pp as executor

    plans = [
        executor.make_plan(p, m, s, v if s == "interleaved" else 1)
        for s in pp.SCHEDULES
        if s != "interleaved" or m % p == 0
    ]
    print(f"\n== the executor's program vs the simulator (P={p}, M={m}, t_B = 2 t_F) ==")
    for plan in plans:
        run, sim_ = executed_result(plan), pp.simulate(plan.config)
        occ = plan.occupancy()
        print(
            f"{plan.config.schedule:<12} executed makespan {run.makespan:g} (simulated "
            f"{sim_.makespan:g}), idle ticks per device {occ['idle']}, bubble "
            f"{occ['bubble']:.1%}, stash slots {plan.stash_slots}"
        )
    return plot_grids(plans, path)


if __name__ == "__main__":
    main()
