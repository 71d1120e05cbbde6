"""`jaxscale calc scaling`: strong/weak efficiency, Amdahl, naive model parallelism (seed 004)."""

from jaxscale.calc import scaling as sc
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    comma_list,
    guarded,
    hidden_alias,
    non_negative_float,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report, figure

FAITHFUL_WHAT = "the seed's n_layers // n_gpus split, which drops remainder layers (seed 004 §5)"


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "scaling",
        help="strong/weak scaling efficiency, Amdahl bottleneck, naive model parallelism",
        description="Scaling-efficiency tables, Amdahl's-law analysis and the naive model-"
        "parallel simulation of seed 004 (defaults reproduce its examples).",
        example="jaxscale calc scaling --gpus 1,2,4 --strong-times 10,6,4 --weak-times 10,11,12",
    )
    g = p.add_argument_group("strong / weak scaling (seed 004)")
    a = g.add_argument(
        "--gpus",
        type=comma_list(positive_int),
        default=sc.SEED_STRONG[0],
        help="GPU counts, comma-separated",
    )
    hidden_alias(g, a, "--gpu-counts")
    g.add_argument(
        "--strong-times",
        type=comma_list(positive_float),
        default=sc.SEED_STRONG[1],
        help="seconds per step at each GPU count, fixed total batch",
    )
    g.add_argument(
        "--weak-times",
        type=comma_list(positive_float),
        default=sc.SEED_WEAK[1],
        help="seconds per step at each GPU count, fixed batch per GPU",
    )
    g.add_argument(
        "--batch-per-gpu",
        type=positive_int,
        default=sc.SEED_WEAK_BATCH_PER_GPU,
        help="batch per GPU of the weak-scaling table",
    )
    g = p.add_argument_group("Amdahl (seed 004; default: its two scenarios)")
    g.add_argument("--compute-s", type=non_negative_float, help="compute time per step")
    g.add_argument("--comm-s", type=non_negative_float, help="communication time per step")
    a = g.add_argument(
        "--amdahl-gpus", type=positive_int, default=8, help="GPUs, with --compute-s and --comm-s"
    )
    hidden_alias(g, a, "--num-gpus")
    g = p.add_argument_group("naive model parallelism (seed 004)")
    g.add_argument("--layers", type=positive_int, default=12, help="layers to split")
    g.add_argument("--mp-gpus", type=positive_int, default=3, help="GPUs the layers are split over")
    g.add_argument("--layer-ms", type=positive_float, default=10.0, help="time of one layer")
    g.add_argument(
        "--transfer-ms",
        type=non_negative_float,
        default=5.0,
        help="time of one activation transfer between GPUs",
    )
    add_output_flags(p, plot=True, faithful=True)
    p.set_defaults(func=guarded(run))


def _check(args) -> None:
    """The combinations the flags must satisfy, named by flag."""
    for flag, times in (("--strong-times", args.strong_times), ("--weak-times", args.weak_times)):
        if len(times) != len(args.gpus):
            raise ValueError(
                f"{flag} needs one time per GPU count: {len(times)} for the "
                f"{len(args.gpus)} of --gpus"
            )
    if (args.compute_s is None) != (args.comm_s is None):
        raise ValueError("give both --compute-s and --comm-s, or neither")
    if args.compute_s == 0 and args.comm_s == 0:
        raise ValueError("--compute-s and --comm-s cannot both be 0")
    if args.mp_gpus > args.layers:
        raise ValueError(f"--mp-gpus {args.mp_gpus} exceeds --layers {args.layers}")


GPUS = Col("num_gpus", "GPUs")
TIME = Col("time_s", "Time (s)", "g")
EFFICIENCY = Col("efficiency", "Efficiency", ".1%")


def _points(series: list[sc.ScalingPoint]) -> list[dict]:
    return [
        {
            "num_gpus": p.num_gpus,
            "time_s": p.time_s,
            "speedup": p.speedup,
            "efficiency": p.efficiency,
        }
        for p in series
    ]


def _amdahl_record(name: str, a: sc.AmdahlAnalysis) -> dict:
    return {
        "scenario": name,
        "num_gpus": a.num_gpus,
        "comm_fraction": a.comm_fraction,
        "max_speedup": a.max_speedup,
        "comm_bound": a.comm_bound,
        "compute_s": a.compute_s,
        "comm_s": a.comm_s,
        "compute_fraction": a.compute_fraction,
    }


def run(args) -> int:
    _check(args)
    strong = _points(sc.strong_scaling(args.gpus, args.strong_times))
    weak = _points(sc.weak_scaling(args.gpus, args.weak_times))
    resnet = _points(
        sc.strong_scaling(*sc.SEED_RESNET, baseline_time_s=sc.SEED_RESNET_SINGLE_GPU_S)
    )
    if args.compute_s is None:
        scenarios = sc.SEED_AMDAHL_SCENARIOS
    else:
        scenarios = (("Custom", args.compute_s, args.comm_s, args.amdahl_gpus),)
    amdahl = [_amdahl_record(name, sc.amdahl(c, m, n)) for name, c, m, n in scenarios]
    mp = sc.naive_model_parallel(
        args.layers, args.mp_gpus, args.layer_ms, args.transfer_ms, seed_faithful=args.seed_faithful
    )
    r = Report("scaling").mode(args.seed_faithful, FAITHFUL_WHAT)
    r.say("", "Strong scaling: fixed total batch; efficiency = (t1 / N) / tN")
    r.table(
        "strong", [GPUS, TIME, Col("speedup", "Speedup", lambda x: f"{x:.2f}x"), EFFICIENCY], strong
    )
    r.say("", f"Weak scaling: {args.batch_per_gpu} per GPU; efficiency = t1 / tN")
    batch = Col("num_gpus", "Total batch", lambda n: str(n * args.batch_per_gpu))
    r.table("weak", [GPUS, batch, TIME, EFFICIENCY], weak)
    r.say(
        "",
        f"ResNet-50 example (seed 004 §4), {sc.SEED_RESNET_SINGLE_GPU_S} s on 1 GPU",
    )
    r.table("resnet", [GPUS, TIME, EFFICIENCY], resnet)
    r.say("", "Amdahl: communication does not parallelise; max speedup = 1 / (comm + compute / N)")
    r.put(amdahl=amdahl)
    cells = [
        {
            **a,
            "compute": f"{a['compute_s']:g} s ({a['compute_fraction']:.1%})",
            "comm": f"{a['comm_s']:g} s ({a['comm_fraction']:.1%})",
        }
        for a in amdahl
    ]
    r.table(
        None,
        [
            Col("scenario", "Scenario"),
            GPUS,
            Col("compute", "Compute"),
            Col("comm", "Comm"),
            Col("max_speedup", "Max speedup", lambda x: f"{x:.2f}x"),
            Col("comm_bound", "Comm-bound?", lambda b: "WARNING" if b else "no"),
        ],
        cells,
    )
    if any(a["comm_bound"] for a in amdahl):
        r.say(f"  communication above {sc.COMM_WARNING_FRACTION:.0%} of the step; suggestions:")
        r.say(*(f"    - {s}" for s in sc.COMM_BOUND_SUGGESTIONS))
    r.say(
        "",
        f"Naive model parallelism: {args.layers} layers on {args.mp_gpus} GPUs, "
        f"{args.layer_ms:g} ms/layer, {args.transfer_ms:g} ms/transfer, backward = forward",
        f"  layers per GPU:  {', '.join(map(str, mp.layers_per_gpu))}",
        f"  forward pass:    {mp.forward_ms:g} ms",
        f"  total time:      {mp.total_ms:g} ms",
        f"  GPU utilisation: {mp.utilization:.1%}  (only one GPU works at a time)",
    )
    if untimed := args.layers - sum(mp.layers_per_gpu):
        r.say(f"  ({untimed} layer(s) never timed by the seed's split; utilisation overstated)")
    if (args.layers, args.mp_gpus, args.layer_ms, args.transfer_ms) == (12, 3, 10.0, 5.0):
        r.say("  (the seed's comment says 50 ms / 100 ms / 40%; its code prints the above)")
    r.put(
        naive_model_parallel={
            "layers_per_gpu": list(mp.layers_per_gpu),
            "forward_ms": mp.forward_ms,
            "total_ms": mp.total_ms,
            "utilization": mp.utilization,
        }
    )
    if args.plot:
        _plot(args.plot, strong, weak)
        r.say(f"plot written to {args.plot}")
    r.emit(args)
    return 0


def _plot(path, strong: list[dict], weak: list[dict]) -> None:
    def series(points, key, scale=1):
        return [p["num_gpus"] for p in points], [p[key] * scale for p in points]

    with figure(path, 1, 2, figsize=(12, 4.5)) as (fig, (ax1, ax2)):
        gpus, speedup = series(strong, "speedup")
        ax1.plot(gpus, speedup, marker="o", label="measured")
        ax1.plot(gpus, gpus, "k--", alpha=0.5, label="ideal")
        ax1.set_xscale("log", base=2)
        ax1.set_yscale("log", base=2)
        ax1.set_xlabel("GPUs")
        ax1.set_ylabel("Speedup")
        ax1.set_title("Strong scaling")
        ax1.legend()
        ax2.plot(*series(strong, "efficiency", 100), marker="o", label="strong")
        ax2.plot(*series(weak, "efficiency", 100), marker="s", label="weak")
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("GPUs")
        ax2.set_ylabel("Efficiency (%)")
        ax2.set_title("Scaling efficiency")
        ax2.legend()
