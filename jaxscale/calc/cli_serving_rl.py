"""`jaxscale calc rl throughput|memory|timeline|transfer`: RL training cost calculators.

throughput: sync vs async iterations (shared/seeds/001_*.txt section 10); memory: the four-model
table (shared/seeds/002_*.txt L11143-11154); timeline and transfer live in cli_serving_rlhf.py.
Nothing here imports jax.
"""

from jaxscale.calc import cli_serving_rlhf, rl
from jaxscale.calc import rlhf_memory as rm
from jaxscale.calc.cli_serving import (
    add_gpu_flags,
    add_model_flags,
    gpu_from_args,
    header,
    mode_name,
    model_from_args,
    record,
)
from jaxscale.calc.training_format import (
    add_output_flags,
    emit,
    format_table,
    fraction,
    guarded,
    mode_line,
    non_negative_float,
    positive_float,
    positive_int,
)

THROUGHPUT_FAITHFUL = "seed 001 section 10: generation and scoring timed on one GPU"
ITERATION_HEADERS = ["Mode", "Gen GPUs", "Train GPUs", "Generate ms", "Score ms", "Train ms"]
ITERATION_HEADERS += ["Iteration ms", "Samples/s", "Tokens/s", "vs sync"]


def add_parser(calc_sub) -> None:
    p = calc_sub.add_parser(
        "rl",
        help="RL training: sync/async throughput, RLHF memory, memory timeline, weight transfer",
    )
    sub = p.add_subparsers(dest="rl_name", required=True, metavar="WHAT")

    t = sub.add_parser("throughput", help="sync vs async RL iteration time (seed 001)")
    add_model_flags(t)
    add_gpu_flags(t)
    t.add_argument("--batch-size", type=positive_int, default=512)
    t.add_argument("--prompt-len", type=positive_int, default=100)
    t.add_argument("--gen-len", type=positive_int, default=50)
    t.add_argument("--ppo-epochs", type=positive_int, default=4)
    t.add_argument("--gpus", type=positive_int, default=256, help="total GPUs (default 256)")
    t.add_argument("--gen-gpus", type=positive_int, help="async generation GPUs (default half)")
    t.add_argument("--mfu", type=fraction, default=rl.SEED_MFU, help="training MFU (0.5)")
    add_output_flags(t, plot=True, faithful=True)
    t.set_defaults(func=guarded(_run_throughput))

    m = sub.add_parser("memory", help="RLHF four-model memory table (seed 002 ch13)")
    m.add_argument("--params-b", type=positive_float, default=7.0, help="billions (default 7)")
    m.add_argument("--activations-gb", type=non_negative_float, help="default 20 GB per 7B")
    m.add_argument(
        "--adam-for",
        choices=rm.ADAM_FOR,
        default="actor",
        help="whose Adam states are counted (the seed: the actor's only)",
    )
    add_output_flags(m)
    m.set_defaults(func=guarded(_run_memory))

    cli_serving_rlhf.add_parsers(sub)  # timeline, transfer


def _iteration_json(it: rl.RlIteration) -> dict:
    return record(it, "time_per_iter_s", "samples_per_s", "tokens_per_s")


def _run_throughput(args) -> int:
    model, gpu, sf = model_from_args(args), gpu_from_args(args), args.seed_faithful
    if sf and args.gen_gpus:
        raise ValueError("--seed-faithful generates on one GPU; drop --gen-gpus")

    shape = (args.prompt_len, args.gen_len, args.ppo_epochs, args.gpus)
    common = dict(kv_bytes_per_token=model.kv_bytes_per_token(sf), gpu=gpu, mfu=args.mfu)

    def run(batch: int, mode: str, gen_gpus: int | None = None) -> rl.RlIteration:
        it = rl.rl_iteration
        return it(
            model.n_params, batch, *shape, mode, gen_gpus=gen_gpus, seed_faithful=sf, **common
        )

    def best(batch: int) -> rl.RlIteration:
        return rl.best_async_split(model.n_params, batch, *shape, **common)

    sync, asyn = run(args.batch_size, "sync"), run(args.batch_size, "async", args.gen_gpus)
    shown = [("Synchronous", sync), ("Asynchronous", asyn)]
    if not sf:
        shown.append(("Async, best split", best(args.batch_size)))
    rows = []
    for name, it in shown:
        times = (it.t_generate_s, it.t_score_s, it.t_train_s, it.time_per_iter_s)
        rows.append([name, it.gen_gpus, it.train_gpus] + [f"{t * 1e3:.1f}" for t in times])
        rows[-1] += [f"{it.samples_per_s:.1f}", f"{it.tokens_per_s:.1f}"]
        rows[-1].append(f"{sync.time_per_iter_s / it.time_per_iter_s:.2f}x")
    sweep, sweep_json = [], []
    for batch in rl.SEED_BATCH_SIZES:
        s, a = run(batch, "sync"), run(batch, "async")
        speedup = a.samples_per_s / s.samples_per_s
        row = [batch, f"{s.samples_per_s:.1f}", f"{a.samples_per_s:.1f}", f"{speedup:.2f}x"]
        entry = {"batch_size": batch, "sync": _iteration_json(s), "async": _iteration_json(a)}
        if not sf:
            b = best(batch)
            row += [b.gen_gpus, f"{b.samples_per_s:.1f}"]
            row.append(f"{b.samples_per_s / s.samples_per_s:.2f}x")
            entry["async_best_split"] = _iteration_json(b)
        sweep.append(row)
        sweep_json.append(entry)
    mean = sum(a["async"]["samples_per_s"] / a["sync"]["samples_per_s"] for a in sweep_json)
    mean /= len(sweep_json)
    sweep_heads = ["Batch", "Sync samples/s", "Async samples/s", "Speedup"]
    if not sf:
        sweep_heads += ["Best gen GPUs", "Best async samples/s", "Best speedup"]
    lines = [
        f"RL iteration: {header(model, gpu)}; batch {args.batch_size}, prompt {args.prompt_len}, "
        f"generate {args.gen_len}, {args.ppo_epochs} PPO epochs at {args.mfu:g} MFU, "
        f"{args.gpus} GPUs",
        mode_line(sf, THROUGHPUT_FAITHFUL),
        "",
        format_table(ITERATION_HEADERS, rows),
        "sync = generate + score + train; async = max(generate + score, train)",
        "",
        format_table(sweep_heads, sweep),
        f"Average async speedup (even split): {mean:.2f}x",
    ]
    report = {
        "command": "rl throughput",
        "mode": mode_name(sf),
        "model": model.name,
        "gpu": gpu.name,
        "batch_size": args.batch_size,
        "gpus": args.gpus,
        "iterations": {name: _iteration_json(it) for name, it in shown},
        "speedup": sync.time_per_iter_s / asyn.time_per_iter_s,
        "batch_sweep": sweep_json,
        "average_speedup": mean,
    }
    if args.plot:
        from jaxscale.calc.serving_plots import plot_rl_throughput

        plot_rl_throughput(
            args.plot,
            list(rl.SEED_BATCH_SIZES),
            [e["sync"]["samples_per_s"] for e in sweep_json],
            [e["async"]["samples_per_s"] for e in sweep_json],
            " (seed-faithful)" if sf else "",
        )
        lines.append(f"plot written to {args.plot}")
    emit(args, report, lines)
    return 0


def _run_memory(args) -> int:
    r = rm.rlhf_model_memory(args.params_b, args.activations_gb, args.adam_for)
    rows = [
        [name, f"{r.weights_gb_each:.1f}"]
        for name in ("Actor", "Critic", "Reward model", "Reference")
    ]
    rows += [
        [f"Optimizer states (Adam m+v, {args.adam_for})", f"{r.optimizer_gb:.1f}"],
        ["Activations", f"{r.activations_gb:.1f}"],
        ["Total", f"{r.total_gb:.1f}"],
    ]
    lines = [
        f"RLHF memory, {args.params_b:g}B in FP16 (shared/seeds/002 L11143-11154; the seed "
        "counts the actor's Adam states only)",
        "",
        format_table(["Component", "GB"], rows),
    ]
    report = {"command": "rl memory", **record(r, "total_gb")}
    emit(args, report, lines)
    return 0
