"""`jaxscale simulate pipeline`: GPipe, 1F1B and interleaved schedules (seed 002 ch7, 004 §6)."""

from jaxscale.checks import at_most
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    guarded,
    hidden_alias,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report, grid
from jaxscale.sim import pipeline as pp
from jaxscale.sim import pipeline_seed

FAITHFUL_WHAT = (
    "pipeline_schedule_viz.py's printout: naive bubble (P-1)M/(PM+P-1) (68.6% for P4 M8) and its "
    "formula-placed 1F1B grid (seed 002 ch7)"
)
SEED_BUBBLE_TABLE_STAGES = 4  # the seed's bubble table ignores --pp
# A run simulates every (stage, microbatch, chunk) op of each schedule, and the bubble table up to
# 64 microbatches on every stage: these bounds keep it to a few seconds.
MAX_STAGES = 256
MAX_STAGE_MICROBATCHES = 16384
WHY = "a larger pipeline is slow to simulate and too large to read"


def add_parser(sim_sub) -> None:
    p = add_command(
        sim_sub,
        "pipeline",
        help="pipeline schedules: makespan, bubble (both conventions), peak activations, grids",
        description="Dependency-driven simulation of GPipe (fill-drain), 1F1B and interleaved "
        "1F1B: each op starts when its inputs exist and its device is free, in the schedule's "
        "per-device order. Flags -s/-m as seed 002's pipeline_schedule_viz.py.",
        example="jaxscale simulate pipeline --pp 4 --microbatches 8 --plot pipeline.png",
    )
    d = pp.PipelineConfig()
    a = p.add_argument(
        "--pp",
        "-s",
        type=positive_int,
        default=d.stages,
        help=f"pipeline stages P, at most {MAX_STAGES}",
    )
    hidden_alias(p, a, "--stages")
    p.add_argument(
        "--microbatches",
        "-m",
        type=positive_int,
        default=d.microbatches,
        help="microbatches M per step",
    )
    p.add_argument(
        "--schedule",
        choices=("all",) + pp.SCHEDULES,
        default="all",
        help="the schedule to simulate",
    )
    p.add_argument(
        "--virtual-stages",
        "-v",
        type=positive_int,
        default=2,
        help="model chunks per device for the interleaved schedule",
    )
    p.add_argument(
        "--forward-time",
        type=positive_float,
        default=d.forward_time,
        help="t_F, one stage's forward of one microbatch",
    )
    p.add_argument(
        "--backward-time",
        type=positive_float,
        default=d.backward_time,
        help="t_B, one stage's backward of one microbatch",
    )
    add_output_flags(p, plot=True, faithful=True)
    p.set_defaults(func=guarded(run))


def _check(args) -> None:
    """The schedule's needs, and a bound on the pipeline: a larger one takes minutes to simulate
    (and its grid and plot are unreadable)."""
    if args.schedule == "interleaved" and args.virtual_stages < 2:
        raise ValueError("--schedule interleaved needs --virtual-stages >= 2")
    if args.schedule == "interleaved" and args.microbatches % args.pp:
        raise ValueError(
            f"--schedule interleaved needs --microbatches divisible by --pp "
            f"({args.microbatches} % {args.pp} != 0)"
        )
    at_most(MAX_STAGES, "stages", WHY, pp=args.pp)
    sizes = {"pp": args.pp, "microbatches": args.microbatches}
    if args.schedule in ("all", "interleaved"):
        sizes["virtual_stages"] = args.virtual_stages
    at_most(MAX_STAGE_MICROBATCHES, "stage-microbatches", WHY, **sizes)


def _configs(args) -> tuple[list[pp.PipelineConfig], list[str]]:
    names = pp.SCHEDULES if args.schedule == "all" else (args.schedule,)
    configs, notes = [], []
    for name in names:
        v = args.virtual_stages if name == "interleaved" else 1
        cfg = pp.PipelineConfig(
            args.pp, args.microbatches, name, args.forward_time, args.backward_time, v
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
        "grid": res.grid(),
        "name": c.schedule + (f" (v={c.virtual_stages})" if c.virtual_stages > 1 else ""),
    }


def _peaks(peaks) -> str:
    return " ".join(f"{x:g}" for x in peaks)


SCHEDULE_COLS = [
    Col("name", "schedule"),
    Col("makespan", "makespan", "g"),
    Col("busy_per_device", "busy/device", "g"),
    Col("bubble_s2", "bubble s2", ".2%"),
    Col("formula_s2", "formula s2", ".2%"),
    Col("bubble_s4", "bubble s4", ".2%"),
    Col("formula_s4", "formula s4", ".2%"),
    Col("peak_activations", "peak activations per device", _peaks),
]
BUBBLE_COLS = [
    Col("microbatches", "M"),
    Col("bubble_s2", "bubble s2", ".1%"),
    Col("efficiency_s2", "efficiency s2", ".1%"),
    Col("bubble_s4", "bubble s4", ".1%"),
    Col("efficiency_s4", "efficiency s4 (seed 004)", ".1%"),
    Col("simulated_1f1b_bubble", "simulated 1F1B bubble", ".1%"),
]


def _seed_faithful(r: Report, args) -> None:
    """What pipeline_schedule_viz.py prints, defects kept (pipeline_seed)."""
    seed = pipeline_seed.seed_report(args.pp, args.microbatches)
    naive, one_f_one_b = seed["naive_bubble"], seed["one_f_one_b_bubble"]
    r.say(
        "seed's NAIVE (fill-drain) schedule:",
        seed["naive_grid"],
        f"Bubble ratio: {naive:.1%}   (the grid's own idle share is "
        f"{pp.bubble_fraction(args.pp, args.microbatches):.1%})",
        f"Peak activation memory: {seed['naive_peak_memory']} microbatches worth",
        "",
        "seed's 1F1B schedule (placed by formula; cells overwrite each other):",
        seed["one_f_one_b_grid"],
        f"Bubble ratio: {one_f_one_b:.1%}",
        f"Peak activation memory: {seed['one_f_one_b_peak_memory']} microbatches worth "
        "(the seed's summary then crashes on an invalid format spec; shown fixed below)",
        "",
        grid(
            ["Metric", "Naive", "1F1B"],
            [
                ["Bubble ratio", f"{naive:.1%}", f"{one_f_one_b:.1%}"],
                ["Peak memory", args.microbatches, seed["one_f_one_b_peak_memory"]],
            ],
        ),
        "",
    )
    r.put(seed=seed)


def run(args) -> int:
    _check(args)
    configs, notes = _configs(args)
    results = [pp.simulate(cfg) for cfg in configs]
    table_stages = SEED_BUBBLE_TABLE_STAGES if args.seed_faithful else args.pp

    r = Report("simulate pipeline")
    r.say(
        f"jaxscale simulate pipeline — P={args.pp} stages, M={args.microbatches} "
        f"microbatches, t_F={args.forward_time:g}, t_B={args.backward_time:g}"
    )
    r.mode(args.seed_faithful, FAITHFUL_WHAT)
    r.say("")
    r.put(stages=args.pp, microbatches=args.microbatches)
    if args.seed_faithful:
        _seed_faithful(r, args)
    else:
        schedules = r.table("schedules", SCHEDULE_COLS, [_summary(res) for res in results])
        r.say(
            "s2 = idle / total time, (P-1)/(v*M+P-1) (seed 002 ch7); s4 = idle / ideal time, "
            "(P-1)/(v*M) (seed 004 §6).",
            "peak activations: microbatches of one stage's activations held at once (from F start "
            "to B end); interleaved chunks count 1/v.",
            *notes,
        )
        for s in schedules:
            r.say("", f"{s['name']} grid ('..' idle; one column per time quantum):", s["grid"])
        r.say("")
    r.say(f"bubble vs microbatches, P={table_stages} (simulated 1F1B uses the given t_F, t_B):")
    rows = pp.bubble_table(table_stages, args.forward_time, args.backward_time)
    r.table("bubble_vs_microbatches", BUBBLE_COLS, rows)
    r.say(
        "s4's efficiency 1 - (P-1)/M is a first-order approximation of M/(M+P-1); it goes "
        "negative for M < P-1."
    )
    if args.plot:
        from jaxscale.sim import plots

        target = results or [pp.simulate(pp.PipelineConfig(args.pp, args.microbatches, "1f1b"))]
        r.say(f"\nplot written to {plots.pipeline(target, args.plot)}")
        r.put(plot=args.plot)
    r.emit(args)
    return 0
