"""`jaxscale calc time`: training days, GPU-hours and cost (seed 001 §4, seed 004 §2)."""

from jaxscale.calc import training_time as tt
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    comma_list,
    fraction,
    guarded,
    non_negative_float,
    parse_count,
    positive_int,
)
from jaxscale.hardware import DEVICES
from jaxscale.render import Col, Report, figure, fmt_count

# Seed 001 §4's examples: LLaMA-2-70B on 2T tokens, A100/H100 x 512/1024/2048, MFU 0.5; the MFU
# sweep on 1024 H100s; the plot's GPU counts. Without --gpu/--sweep-gpu the
# GPUs are the seed's, at its peak figures (H100 990, not hardware.py's 989.5).
MFU_SWEEP = (0.3, 0.4, 0.5, 0.6, 0.7)
PLOT_GPU_COUNTS = (128, 256, 512, 1024, 2048, 4096)
SEED001_SWEEP_GPU = "h100"
SEED_GPUS = "seed 001's a100,h100 at its 312/990 TFLOPS"
# Seed 004 §2: its throughput example ("Time Constraints") and cost example ("Cost Efficiency").
S4_ONE_GPU_YEAR_HOURS = 24 * 365
S4_CLUSTER_GPUS = 256
S4_CLUSTER_HOURS = 36
S4_COMMENT_HOURS = 20_833  # the comment's figure


def _gpu(text: str) -> str:
    """A device of jaxscale/hardware.py with a known peak (ValueError naming the choices)."""
    tt.gpu_peak_tflops(text)
    return text


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "time",
        help="training time, GPU-hours, cost and the effect of MFU",
        description="time = 6*N*D / (GPUs * peak * MFU), seed 001 §4; plus seed 004's "
        "throughput-based estimate and cost example.",
        example="jaxscale calc time --params 7B --tokens 1T --gpu h100 --gpus 64,128 --mfu 0.4",
    )
    p.add_argument("--params", type=parse_count, default=70e9, help="parameter count")
    p.add_argument("--tokens", type=parse_count, default=2e12, help="training tokens")
    p.add_argument(
        "--gpu",
        type=comma_list(_gpu),
        help=f"devices, comma-separated: {', '.join(DEVICES)} (default: {SEED_GPUS})",
    )
    p.add_argument(
        "--gpus",
        type=comma_list(positive_int),
        default=[512, 1024, 2048],
        help="GPU counts, comma-separated",
    )
    p.add_argument("--mfu", type=fraction, default=0.5, help="model FLOPs utilisation")
    p.add_argument(
        "--usd-per-gpu-hour",
        type=non_negative_float,
        default=tt.SEED_USD_PER_GPU_HOUR,
        help="price of one GPU-hour in USD",
    )
    p.add_argument(
        "--sweep-gpu",
        type=_gpu,
        help="device of the MFU sweep (default: seed 001's h100 at its 990 TFLOPS)",
    )
    p.add_argument("--sweep-gpus", type=positive_int, default=1024, help="GPUs of the MFU sweep")
    p.add_argument(
        "--samples",
        type=parse_count,
        default=300e9,
        help="dataset size of seed 004's throughput estimate",
    )
    p.add_argument(
        "--batch-size",
        type=parse_count,
        default=4e6,
        help="batch of seed 004's throughput estimate",
    )
    p.add_argument(
        "--epochs", type=parse_count, default=1.0, help="epochs of seed 004's throughput estimate"
    )
    p.add_argument(
        "--samples-per-second",
        type=parse_count,
        default=1000.0,
        help="throughput of seed 004's estimate",
    )
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run))


def _peaks(args) -> tuple[list[tuple[str, float]], tuple[str, float]]:
    """(gpu, peak TFLOPS) of each table row group, and of the MFU sweep."""
    seed = tt.SEED001_PEAK_TFLOPS
    gpus = [*seed.items()] if args.gpu is None else [(g, tt.gpu_peak_tflops(g)) for g in args.gpu]
    if args.sweep_gpu is None:
        return gpus, (SEED001_SWEEP_GPU, seed[SEED001_SWEEP_GPU])
    return gpus, (args.sweep_gpu, tt.gpu_peak_tflops(args.sweep_gpu))


def run(args) -> int:
    price = args.usd_per_gpu_hour
    peaks, (sweep_gpu, sweep_peak) = _peaks(args)

    def estimate(n, peak, mfu=args.mfu):
        return tt.estimate_training_time(args.params, args.tokens, n, peak, mfu)

    runs = []
    for gpu, peak in peaks:
        for n in args.gpus:
            t = estimate(n, peak)
            runs.append(
                {
                    "gpu": gpu,
                    "num_gpus": n,
                    "total_flops": t.total_flops,
                    "days": t.days,
                    "gpu_hours": t.gpu_hours,
                    "cost_usd": t.cost_usd(price),
                    "peak_tflops": peak,
                    "effective_tflops": t.effective_tflops,
                }
            )
    sweep = [
        {"mfu": m, "days": t.days, "gpu_hours": t.gpu_hours}
        for m in MFU_SWEEP
        for t in [estimate(args.sweep_gpus, sweep_peak, m)]
    ]
    hours = tt.throughput_training_hours(
        args.samples, args.batch_size, args.epochs, args.samples_per_second
    )
    year_cost = tt.cluster_cost_usd(1, S4_ONE_GPU_YEAR_HOURS, price)
    cluster_cost = tt.cluster_cost_usd(S4_CLUSTER_GPUS, S4_CLUSTER_HOURS, price)
    implied = tt.implied_scaling_efficiency(
        S4_ONE_GPU_YEAR_HOURS, S4_CLUSTER_GPUS, S4_CLUSTER_HOURS
    )

    r = Report("time", n_params=args.params, n_tokens=args.tokens, mfu=args.mfu)
    r.say(
        f"Training time: {fmt_count(args.params)} params, {fmt_count(args.tokens)} tokens, MFU"
        f" {args.mfu:.0%} (6*N*D = {6 * args.params * args.tokens:.3g} FLOPs)",
        "",
    )
    run_cols = [
        Col("label", "GPUs"),
        Col("days", "Days", ",.1f"),
        Col("gpu_hours", "GPU-hours", ",.0f"),
        Col("effective_tflops", "Eff. TFLOPS", ",.0f"),
        Col("cost_usd", f"Cost @ ${price:g}/h", lambda c: f"${c:,.0f}"),
    ]
    r.put(runs=runs)
    r.table(None, run_cols, [{**x, "label": f"{x['gpu'].upper()} x {x['num_gpus']}"} for x in runs])
    r.say("", f"Effect of MFU ({sweep_gpu.upper()} x {args.sweep_gpus})")
    r.table(
        "mfu_sweep",
        [
            Col("mfu", "MFU", ".0%"),
            Col("days", "Days", ",.1f"),
            Col("gpu_hours", "GPU-hours", ",.0f"),
        ],
        sweep,
    )
    r.put(
        sweep_gpu=sweep_gpu,
        sweep_peak_tflops=sweep_peak,
        throughput_hours=hours,
        one_gpu_year_cost_usd=year_cost,
        cluster_cost_usd=cluster_cost,
        implied_scaling_efficiency=implied,
    )
    r.say(
        "",
        "Throughput estimate (seed 004 §2): "
        f"{fmt_count(args.samples)} samples x {args.epochs:g} epoch(s) at "
        f"{args.samples_per_second:,.0f}/s",
        f"  {hours:,.0f} hours ({hours / 24:,.0f} days)",
    )
    if (args.samples, args.epochs, args.samples_per_second) == (300e9, 1.0, 1000.0):
        r.say(
            f"  (the seed's comment says ~{S4_COMMENT_HOURS:,} hours / ~868 days; its code and"
            " the arithmetic give the figure above)"
        )
    r.say(
        "",
        f"Cost (seed 004 §2) at ${price:g}/GPU-hour:",
        f"  1 GPU for 1 year:               ${year_cost:,.0f}",
        f"  {S4_CLUSTER_GPUS} GPUs for {S4_CLUSTER_HOURS / 24:g} days:"
        f"           ${cluster_cost:,.0f}",
        f"  same work in 1.5 days implies {implied:.1%} scaling efficiency",
    )
    if args.plot:
        with figure(args.plot, 1, 2, figsize=(14, 5)) as (fig, (ax1, ax2)):
            for gpu, peak in peaks:
                days = [estimate(n, peak).days for n in PLOT_GPU_COUNTS]
                ax1.plot(PLOT_GPU_COUNTS, days, marker="o", label=gpu.upper())
            ax1.set_xscale("log", base=2)
            ax1.set_yscale("log")
            ax1.set_xticks(PLOT_GPU_COUNTS, [str(n) for n in PLOT_GPU_COUNTS])
            ax1.minorticks_off()
            ax1.set_xlabel("Number of GPUs")
            ax1.set_ylabel("Training days")
            ax1.set_title(f"{fmt_count(args.params)} params, {fmt_count(args.tokens)} tokens")
            ax1.legend()
            ax2.plot(
                [m * 100 for m in MFU_SWEEP], [x["days"] for x in sweep], marker="s", color="green"
            )
            ax2.set_xlabel("Model FLOPs utilisation (%)")
            ax2.set_ylabel("Training days")
            ax2.set_title(f"Impact of MFU ({sweep_gpu.upper()} x {args.sweep_gpus})")
        r.say(f"plot written to {args.plot}")
    r.emit(args)
    return 0
