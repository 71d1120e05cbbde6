"""`jaxscale simulate pipeline`: GPipe, 1F1B and interleaved schedules (seed 002 ch7, 004 §6)."""

from jaxscale.calc.training_format import (
    add_output_flags,
    emit,
    format_table,
    mode_line,
    positive_float,
    positive_int,
)
from jaxscale.sim import pipeline as pp
from jaxscale.sim import pipeline_seed
from jaxscale.sim.cli import guarded

FAITHFUL_WHAT = (
    "pipeline_schedule_viz.py's printout: naive bubble (P-1)M/(PM+P-1) (68.6% for P4 M8) and its "
    "formula-placed 1F1B grid (seed 002 L5437-5548)"
)
BUBBLE_TABLE_MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)  # seed 002 L5619
SEED_BUBBLE_TABLE_STAGES = 4  # the seed's table ignores --stages (L5614)


def add_command(sim_sub) -> None:
    p = sim_sub.add_parser(
        "pipeline",
        help="pipeline schedules: makespan, bubble (both conventions), peak activations, grids",
        description="Dependency-driven simulation of GPipe (fill-drain), 1F1B and interleaved "
        "1F1B: each op starts when its inputs exist and its device is free, in the schedule's "
        "per-device order. Flags -s/-m as seed 002's pipeline_schedule_viz.py.",
    )
    d = pp.PipelineConfig()
    p.add_argument("--stages", "-s", type=positive_int, default=d.stages, help="P")
    p.add_argument("--microbatches", "-m", type=positive_int, default=d.microbatches, help="M")
    p.add_argument("--schedule", choices=("all",) + pp.SCHEDULES, default="all")
    p.add_argument(
        "--virtual-stages",
        "-v",
        type=positive_int,
        default=2,
        help="model chunks per device for the interleaved schedule",
    )
    p.add_argument("--forward-time", type=positive_float, default=d.forward_time, help="t_F")
    p.add_argument("--backward-time", type=positive_float, default=d.backward_time, help="t_B")
    add_output_flags(p, plot=True, faithful=True)
    p.set_defaults(func=guarded(run))


def _configs(args) -> tuple[list[pp.PipelineConfig], list[str]]:
    names = pp.SCHEDULES if args.schedule == "all" else (args.schedule,)
    configs, notes = [], []
    for name in names:
        v = args.virtual_stages if name == "interleaved" else 1
        cfg = pp.PipelineConfig(
            args.stages, args.microbatches, name, args.forward_time, args.backward_time, v
        )
        try:
            cfg.validate()
        except ValueError as err:
            if args.schedule != "all":
                raise
            notes.append(f"{name}: skipped ({err})")
            continue
        configs.append(cfg)
    return configs, notes


def _name(cfg: pp.PipelineConfig) -> str:
    return cfg.schedule + (f" (v={cfg.virtual_stages})" if cfg.virtual_stages > 1 else "")


def _summary(res: pp.PipelineResult) -> dict:
    c = res.config
    return {
        "schedule": c.schedule,
        "virtual_stages": c.virtual_stages,
        "makespan": res.makespan,
        "busy_per_device": res.work_per_stage,
        "bubble_s2": res.bubble_s2,
        "bubble_s4": res.bubble_s4,
        "formula_s2": pp.bubble_fraction(c.stages, c.microbatches, "s2", c.virtual_stages),
        "formula_s4": pp.bubble_fraction(c.stages, c.microbatches, "s4", c.virtual_stages),
        "peak_activations": list(res.peak_activations),
    }


def _bubble_table(args, stages: int) -> list[dict]:
    rows = []
    for m in BUBBLE_TABLE_MICROBATCHES:
        cfg = pp.PipelineConfig(stages, m, "1f1b", args.forward_time, args.backward_time)
        rows.append(
            {
                "microbatches": m,
                "bubble_s2": pp.bubble_fraction(stages, m, "s2"),
                "efficiency_s2": pp.pipeline_efficiency(stages, m, "s2"),
                "bubble_s4": pp.bubble_fraction(stages, m, "s4"),
                "efficiency_s4": pp.pipeline_efficiency(stages, m, "s4"),
                "simulated_1f1b_bubble": pp.simulate(cfg).bubble_s2,
            }
        )
    return rows


def _fmt_peaks(peaks) -> str:
    return " ".join(f"{x:g}" for x in peaks)


def run(args) -> int:
    configs, notes = _configs(args)
    results = [pp.simulate(cfg) for cfg in configs]
    table_stages = SEED_BUBBLE_TABLE_STAGES if args.seed_faithful else args.stages
    bubble_rows = _bubble_table(args, table_stages)
    lines = [
        f"jaxscale simulate pipeline — P={args.stages} stages, M={args.microbatches} "
        f"microbatches, t_F={args.forward_time:g}, t_B={args.backward_time:g}",
        mode_line(args.seed_faithful, FAITHFUL_WHAT),
        "",
    ]
    report = {
        "command": "simulate pipeline",
        "mode": "seed-faithful" if args.seed_faithful else "corrected",
        "stages": args.stages,
        "microbatches": args.microbatches,
    }
    if args.seed_faithful:
        seed = pipeline_seed.seed_report(args.stages, args.microbatches)
        lines += [
            "seed's NAIVE (fill-drain) schedule:",
            seed["naive_grid"],
            f"Bubble ratio: {seed['naive_bubble']:.1%}   (the grid's own idle share is "
            f"{pp.bubble_fraction(args.stages, args.microbatches):.1%})",
            f"Peak activation memory: {seed['naive_peak_memory']} microbatches worth",
            "",
            "seed's 1F1B schedule (placed by formula; cells overwrite each other):",
            seed["one_f_one_b_grid"],
            f"Bubble ratio: {seed['one_f_one_b_bubble']:.1%}",
            f"Peak activation memory: {seed['one_f_one_b_peak_memory']} microbatches worth "
            "(the seed's summary then crashes on an invalid format spec; shown fixed below)",
            "",
            format_table(
                ["Metric", "Naive", "1F1B"],
                [
                    [
                        "Bubble ratio",
                        f"{seed['naive_bubble']:.1%}",
                        f"{seed['one_f_one_b_bubble']:.1%}",
                    ],
                    ["Peak memory", args.microbatches, seed["one_f_one_b_peak_memory"]],
                ],
            ),
            "",
        ]
        report["seed"] = seed
    else:
        lines += [
            format_table(
                [
                    "schedule",
                    "makespan",
                    "busy/device",
                    "bubble s2",
                    "formula s2",
                    "bubble s4",
                    "formula s4",
                    "peak activations per device",
                ],
                [
                    [
                        _name(r.config),
                        f"{r.makespan:g}",
                        f"{r.work_per_stage:g}",
                        f"{r.bubble_s2:.2%}",
                        f"{s['formula_s2']:.2%}",
                        f"{r.bubble_s4:.2%}",
                        f"{s['formula_s4']:.2%}",
                        _fmt_peaks(r.peak_activations),
                    ]
                    for r, s in zip(results, map(_summary, results), strict=True)
                ],
            ),
            "s2 = idle / total time, (P-1)/(v*M+P-1) (seed 002 L5167); s4 = idle / ideal time, "
            "(P-1)/(v*M) (seed 004 L603).",
            "peak activations: microbatches of one stage's activations held at once (from F start "
            "to B end); interleaved chunks count 1/v.",
            *notes,
        ]
        for r in results:
            lines += ["", f"{_name(r.config)} grid ('..' idle; one column per time quantum):"]
            lines.append(r.grid())
        lines.append("")
        report["schedules"] = [_summary(r) | {"grid": r.grid()} for r in results]
    lines += [
        f"bubble vs microbatches, P={table_stages} (simulated 1F1B uses the given t_F, t_B):",
        format_table(
            [
                "M",
                "bubble s2",
                "efficiency s2",
                "bubble s4",
                "efficiency s4 (seed 004)",
                "simulated 1F1B bubble",
            ],
            [
                [
                    r["microbatches"],
                    f"{r['bubble_s2']:.1%}",
                    f"{r['efficiency_s2']:.1%}",
                    f"{r['bubble_s4']:.1%}",
                    f"{r['efficiency_s4']:.1%}",
                    f"{r['simulated_1f1b_bubble']:.1%}",
                ]
                for r in bubble_rows
            ],
        ),
        "s4's efficiency 1 - (P-1)/M is a first-order approximation of M/(M+P-1); it goes "
        "negative for M < P-1.",
    ]
    report["bubble_vs_microbatches"] = bubble_rows
    if args.plot:
        from jaxscale.sim import plots

        target = results or [pp.simulate(pp.PipelineConfig(args.stages, args.microbatches, "1f1b"))]
        lines.append(f"\nplot written to {plots.pipeline(target, args.plot)}")
        report["plot"] = args.plot
    emit(args, report, lines)
    return 0
