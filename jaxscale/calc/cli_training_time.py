"""`jaxscale calc time`: training days, GPU-hours and cost (seed 001 §4, seed 004 L76-121)."""

from jaxscale.calc import training_time as tt
from jaxscale.calc.training_format import (
    add_output_flags,
    comma_list,
    emit,
    format_count,
    format_table,
    fraction,
    guarded,
    non_negative_float,
    parse_count,
    positive_int,
)

# shared/seeds/001_*.txt L299-312: LLaMA-2-70B on 2T tokens, A100/H100 x 512/1024/2048, MFU 0.5;
# L336-340: the MFU sweep on 1024 H100s; L317 the plot's GPU counts.
MFU_SWEEP = (0.3, 0.4, 0.5, 0.6, 0.7)
PLOT_GPU_COUNTS = (128, 256, 512, 1024, 2048, 4096)
# shared/seeds/004_*.txt L104-109 (throughput example) and L117-119 (cost example).
S4_ONE_GPU_YEAR_HOURS = 24 * 365
S4_CLUSTER_GPUS = 256
S4_CLUSTER_HOURS = 36
S4_COMMENT_HOURS = 20_833  # L110, the comment's figure


def add_parser(calc_sub) -> None:
    p = calc_sub.add_parser(
        "time",
        help="training time, GPU-hours, cost and the effect of MFU",
        description="time = 6*N*D / (GPUs * peak * MFU), seed 001 §4; plus seed 004's "
        "throughput-based estimate and cost example.",
    )
    p.add_argument("--params", type=parse_count, default=70e9, help="default 70B")
    p.add_argument("--tokens", type=parse_count, default=2e12, help="default 2T")
    p.add_argument("--gpu", type=comma_list(str), default=["a100", "h100"], help="a100,h100,h200")
    p.add_argument("--gpus", type=comma_list(positive_int), default=[512, 1024, 2048])
    p.add_argument("--mfu", type=fraction, default=0.5, help="model FLOPs utilisation")
    p.add_argument("--usd-per-gpu-hour", type=non_negative_float, default=tt.SEED_USD_PER_GPU_HOUR)
    p.add_argument("--sweep-gpu", default="h100", help="GPU of the MFU sweep (default h100)")
    p.add_argument("--sweep-gpus", type=positive_int, default=1024, help="GPUs of the MFU sweep")
    p.add_argument("--samples", type=parse_count, default=300e9, help="seed 004: dataset size")
    p.add_argument("--batch-size", type=parse_count, default=4e6, help="seed 004: batch")
    p.add_argument("--epochs", type=parse_count, default=1.0, help="seed 004: epochs")
    p.add_argument("--samples-per-second", type=parse_count, default=1000.0, help="seed 004")
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    price = args.usd_per_gpu_hour
    rows, runs = [], []
    for gpu in args.gpu:
        peak = tt.gpu_peak_tflops(gpu)
        for n in args.gpus:
            r = tt.estimate_training_time(args.params, args.tokens, n, peak, args.mfu)
            rows.append(
                [f"{gpu.upper()} x {n}", f"{r.days:,.1f}", f"{r.gpu_hours:,.0f}"]
                + [f"{r.effective_tflops:,.0f}", f"${r.cost_usd(price):,.0f}"]
            )
            runs.append({"gpu": gpu, "num_gpus": n, "total_flops": r.total_flops})
            runs[-1].update(days=r.days, gpu_hours=r.gpu_hours, cost_usd=r.cost_usd(price))
    sweep_peak = tt.gpu_peak_tflops(args.sweep_gpu)
    sweep = [
        (mfu, tt.estimate_training_time(args.params, args.tokens, args.sweep_gpus, sweep_peak, mfu))
        for mfu in MFU_SWEEP
    ]
    hours = tt.throughput_training_hours(
        args.samples, args.batch_size, args.epochs, args.samples_per_second
    )
    year_cost = tt.cluster_cost_usd(1, S4_ONE_GPU_YEAR_HOURS, price)
    cluster_cost = tt.cluster_cost_usd(S4_CLUSTER_GPUS, S4_CLUSTER_HOURS, price)
    implied = tt.implied_scaling_efficiency(
        S4_ONE_GPU_YEAR_HOURS, S4_CLUSTER_GPUS, S4_CLUSTER_HOURS
    )
    heads = ["GPUs", "Days", "GPU-hours", "Eff. TFLOPS", f"Cost @ ${price:g}/h"]
    lines = [
        f"Training time: {format_count(args.params)} params, {format_count(args.tokens)} tokens,"
        f" MFU {args.mfu:.0%} (6*N*D = {6 * args.params * args.tokens:.3g} FLOPs)",
        "",
        format_table(heads, rows),
        "",
        f"Effect of MFU ({args.sweep_gpu.upper()} x {args.sweep_gpus})",
        format_table(
            ["MFU", "Days", "GPU-hours"],
            [[f"{m:.0%}", f"{r.days:,.1f}", f"{r.gpu_hours:,.0f}"] for m, r in sweep],
        ),
        "",
        "Throughput estimate (shared/seeds/004 L80-110): "
        f"{format_count(args.samples)} samples x {args.epochs:g} epoch(s) at "
        f"{args.samples_per_second:,.0f}/s",
        f"  {hours:,.0f} hours ({hours / 24:,.0f} days)",
    ]
    if (args.samples, args.epochs, args.samples_per_second) == (300e9, 1.0, 1000.0):
        lines.append(
            f"  (the seed's comment says ~{S4_COMMENT_HOURS:,} hours / ~868 days; its code and"
            " the arithmetic give the figure above)"
        )
    lines += [
        "",
        f"Cost (shared/seeds/004 L115-121) at ${price:g}/GPU-hour:",
        f"  1 GPU for 1 year:               ${year_cost:,.0f}",
        f"  {S4_CLUSTER_GPUS} GPUs for {S4_CLUSTER_HOURS / 24:g} days:"
        f"           ${cluster_cost:,.0f}",
        f"  same work in 1.5 days implies {implied:.1%} scaling efficiency",
    ]
    report = {
        "command": "time",
        "n_params": args.params,
        "n_tokens": args.tokens,
        "mfu": args.mfu,
        "runs": runs,
        "mfu_sweep": [{"mfu": m, "days": r.days, "gpu_hours": r.gpu_hours} for m, r in sweep],
        "throughput_hours": hours,
        "one_gpu_year_cost_usd": year_cost,
        "cluster_cost_usd": cluster_cost,
        "implied_scaling_efficiency": implied,
    }
    if args.plot:
        _plot(args)
        lines.append(f"plot written to {args.plot}")
    emit(args, report, lines)
    return 0


def _plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    for gpu in args.gpu:
        peak = tt.gpu_peak_tflops(gpu)
        days = [
            tt.estimate_training_time(args.params, args.tokens, n, peak, args.mfu).days
            for n in PLOT_GPU_COUNTS
        ]
        ax1.plot(PLOT_GPU_COUNTS, days, marker="o", label=gpu.upper())
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xticks(PLOT_GPU_COUNTS, [str(n) for n in PLOT_GPU_COUNTS])
    ax1.minorticks_off()
    ax1.set_xlabel("Number of GPUs")
    ax1.set_ylabel("Training days")
    ax1.set_title(f"{format_count(args.params)} params, {format_count(args.tokens)} tokens")
    ax1.legend()
    peak = tt.gpu_peak_tflops(args.sweep_gpu)
    days = [
        tt.estimate_training_time(args.params, args.tokens, args.sweep_gpus, peak, m).days
        for m in MFU_SWEEP
    ]
    ax2.plot([m * 100 for m in MFU_SWEEP], days, marker="s", color="green")
    ax2.set_xlabel("Model FLOPs utilisation (%)")
    ax2.set_ylabel("Training days")
    ax2.set_title(f"Impact of MFU ({args.sweep_gpu.upper()} x {args.sweep_gpus})")
    fig.tight_layout()
    fig.savefig(args.plot)
    plt.close(fig)
