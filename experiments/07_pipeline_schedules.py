"""Pipeline schedules: GPipe, 1F1B and interleaved 1F1B (seed 002 ch7, seed 004 §6).

    .venv/bin/python experiments/07_pipeline_schedules.py --stages 4 --microbatches 8

Reproduces pipeline_schedule_viz.py (shared/seeds/002 L5419-5682) with its defects fixed: the
schedules come from a dependency-driven simulation (jaxscale.sim.pipeline), the bubble is
(P-1)/(M+P-1) for both GPipe and 1F1B (the seed's naive 68.6% is defect 3), 1F1B holds P-s
microbatches of activations on stage s where GPipe holds M, and the bubble-vs-microbatch table the
seed never prints (defect 5) is shown under both conventions, with seed 004's efficiency column.
Plots: results/07_pipeline_gantt.png, results/07_bubble_vs_microbatches.png.
"""

import argparse
import os

from jaxscale.calc.training_format import format_table
from jaxscale.sim import pipeline as pp
from jaxscale.sim import plots

MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)  # shared/seeds/002 L5619


def summary(results) -> str:
    return format_table(
        ["schedule", "makespan", "bubble (idle/total)", "bubble (idle/ideal)", "peak act/stage"],
        [
            [
                r.config.schedule
                + (f" v={r.config.virtual_stages}" if r.config.virtual_stages > 1 else ""),
                f"{r.makespan:g}",
                f"{r.bubble_s2:.2%}",
                f"{r.bubble_s4:.2%}",
                " ".join(f"{x:g}" for x in r.peak_activations),
            ]
            for r in results
        ],
    )


def schedules(p: int, m: int, v: int, t_b: float) -> list:
    out = [pp.simulate(pp.PipelineConfig(p, m, s, 1.0, t_b)) for s in ("gpipe", "1f1b")]
    if m % p == 0:
        out.append(pp.simulate(pp.PipelineConfig(p, m, "interleaved", 1.0, t_b, v)))
    return out


def bubble_rows(p: int, v: int) -> list[dict]:
    rows = []
    for m in MICROBATCHES:
        inter = pp.PipelineConfig(p, m, "interleaved", virtual_stages=v)
        rows.append(
            {
                "microbatches": m,
                "bubble_s2": pp.bubble_fraction(p, m, "s2"),
                "bubble_s4": pp.bubble_fraction(p, m, "s4"),
                "efficiency_s4": pp.pipeline_efficiency(p, m, "s4"),
                "simulated_1f1b": pp.simulate(pp.PipelineConfig(p, m, "1f1b")).bubble_s2,
                "simulated_interleaved": pp.simulate(inter).bubble_s2 if m % p == 0 else None,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", "-s", type=int, default=4)
    ap.add_argument("--microbatches", "-m", type=int, default=8)
    ap.add_argument("--virtual-stages", "-v", type=int, default=2)
    ap.add_argument("--backward-ratio", type=float, default=2.0, help="t_B / t_F for table 2")
    ap.add_argument("--out", default="results")
    args = ap.parse_args()
    p, m, v = args.stages, args.microbatches, args.virtual_stages

    equal = schedules(p, m, v, 1.0)
    print(f"== P={p} stages, M={m} microbatches, t_F = t_B = 1 ==")
    print(summary(equal))
    for r in equal:
        print(f"\n{r.config.schedule} ('..' idle):\n{r.grid()}")

    print(
        f"\n== the same with t_B = {args.backward_ratio:g} t_F: the bubble share does not move =="
    )
    print(summary(schedules(p, m, v, args.backward_ratio)))

    rows = bubble_rows(p, v)
    print(f"\n== bubble vs microbatches, P={p} (seed 002 L5603-5627; seed 004 L722-744) ==")
    print(
        format_table(
            [
                "M",
                "(P-1)/(M+P-1)",
                "simulated 1F1B",
                f"interleaved v={v}",
                "(P-1)/M",
                "seed 004 efficiency",
            ],
            [
                [
                    r["microbatches"],
                    f"{r['bubble_s2']:.1%}",
                    f"{r['simulated_1f1b']:.1%}",
                    "-"
                    if r["simulated_interleaved"] is None
                    else f"{r['simulated_interleaved']:.1%}",
                    f"{r['bubble_s4']:.1%}",
                    f"{r['efficiency_s4']:.1%}",
                ]
                for r in rows
            ],
        )
    )

    print(f"\n== peak activations, stage 0 (microbatches held), P={p} ==")
    print(
        format_table(
            ["M", "GPipe", "1F1B"],
            [
                [
                    mb,
                    f"{pp.simulate(pp.PipelineConfig(p, mb, 'gpipe')).peak_activations[0]:g}",
                    f"{pp.simulate(pp.PipelineConfig(p, mb, '1f1b')).peak_activations[0]:g}",
                ]
                for mb in (4, 8, 16, 32)
            ],
        )
    )

    os.makedirs(args.out, exist_ok=True)
    gantt = plots.pipeline(equal, os.path.join(args.out, "07_pipeline_gantt.png"))
    curve = plots.bubble_curve(p, rows, os.path.join(args.out, "07_bubble_vs_microbatches.png"))
    print(f"\nplots: {gantt}, {curve}")


if __name__ == "__main__":
    main()
