"""`jaxscale calc rl throughput|memory|timeline|transfer`: RL training cost calculators.

throughput: sync vs async iterations (shared/seeds/001_*.txt section 10); memory: the four-model
table (shared/seeds/002_*.txt L11143-11154); timeline and transfer live in cli_serving_rlhf.py.
Nothing here imports jax.
"""

import argparse

from jaxscale.calc import cli_serving_rlhf, rl
from jaxscale.calc import rlhf_memory as rm
from jaxscale.calc.cli_serving_common import (
    add_gpu_flags,
    add_model_flags,
    gpu_from_args,
    header,
    model_from_args,
    ms,
    record,
)
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    fraction,
    guarded,
    non_negative_float,
    parse_count,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report, figure, fmt_count, grid

MAX_GPUS = 16384  # the best async split tries every multiple of the replica size (~2 s)
THROUGHPUT_FAITHFUL = "seed 001 section 10: generation and scoring timed on one GPU"
ITERATION_COLS = [
    Col("name", "Mode"),
    Col("gen_gpus", "Gen GPUs"),
    Col("train_gpus", "Train GPUs"),
    Col("t_generate_s", "Generate ms", ms),
    Col("t_score_s", "Score ms", ms),
    Col("t_train_s", "Train ms", ms),
    Col("time_per_iter_s", "Iteration ms", ms),
    Col("samples_per_s", "Samples/s", ".1f"),
    Col("tokens_per_s", "Tokens/s", ".1f"),
    Col("vs_sync", "vs sync", lambda v: f"{v:.2f}x"),
]


def add_parser(calc_sub) -> None:
    p = calc_sub.add_parser(
        "rl",
        help="RL training: sync/async throughput, RLHF memory, memory timeline, weight transfer",
    )
    sub = p.add_subparsers(dest="rl_name", required=True, metavar="WHAT")

    t = add_command(
        sub,
        "throughput",
        help="sync vs async RL iteration time (seed 001)",
        description="One generate / score / train iteration, synchronous or with generation and "
        "training on separate GPUs (seed 001 section 10).",
        example="jaxscale calc rl throughput --model llama-7b --gpus 64 --plot rl.png",
    )
    add_model_flags(t)
    add_gpu_flags(t)
    t.add_argument("--batch-size", type=positive_int, default=512, help="prompts per iteration")
    t.add_argument("--prompt-len", type=positive_int, default=100, help="prompt tokens")
    t.add_argument("--gen-len", type=positive_int, default=50, help="generated tokens")
    t.add_argument("--ppo-epochs", type=positive_int, default=4, help="PPO epochs per iteration")
    t.add_argument("--gpus", type=positive_int, default=256, help="total GPUs")
    t.add_argument("--gen-gpus", type=positive_int, help="async generation GPUs (default half)")
    t.add_argument("--mfu", type=fraction, default=rl.SEED_MFU, help="training MFU")
    add_output_flags(t, plot=True, faithful=True)
    t.set_defaults(func=guarded(_run_throughput))

    m = add_command(
        sub,
        "memory",
        help="RLHF four-model memory table (seed 002 ch13)",
        description="Actor, critic, reward model and reference in FP16, Adam states and "
        "activations (seed 002 ch13).",
        example="jaxscale calc rl memory --params 70B --adam-for actor+critic",
    )
    m.add_argument("--params", type=parse_count, default=7e9, help="parameter count of each model")
    m.add_argument(
        "--params-b",
        dest="params",
        type=_billions,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )  # the old spelling, in billions
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


def _billions(text: str) -> float:
    return positive_float(text) * 1e9


def _check_gpus(args, n_params: float, gpu) -> None:
    """The GPU counts the corrected iteration needs, named by flag (seed-faithful generates on
    one GPU)."""
    if args.gen_gpus is not None and args.gen_gpus >= args.gpus:
        raise ValueError(f"--gen-gpus {args.gen_gpus} leaves none of --gpus {args.gpus} to train")
    if args.gpus < 2:
        raise ValueError(f"--gpus {args.gpus}: async splits the GPUs, give at least 2")
    if args.gpus > MAX_GPUS:
        raise ValueError(f"--gpus {args.gpus}: at most {MAX_GPUS:,} (every split is searched)")
    need = max(
        rl.replica_gpus(n_params, gpu), rl.replica_gpus(n_params * rl.SEED_REWARD_FRACTION, gpu)
    )
    gen = args.gpus // 2 if args.gen_gpus is None else args.gen_gpus
    if gen < need:
        flags = "--gpus" if args.gen_gpus is None else "--gen-gpus"
        raise ValueError(
            f"{gen} generation GPUs ({flags}) cannot hold the weights of "
            f"{fmt_count(n_params)} (--params): need at least {need}"
        )


def _iteration(it: rl.RlIteration) -> dict:
    return record(it, "time_per_iter_s", "samples_per_s", "tokens_per_s")


def _run_throughput(args) -> int:
    model, gpu, sf = model_from_args(args), gpu_from_args(args), args.seed_faithful
    if sf and args.gen_gpus:
        raise ValueError("--seed-faithful generates on one GPU; drop --gen-gpus")
    if not sf:
        _check_gpus(args, model.n_params, gpu)
    shape = (args.prompt_len, args.gen_len, args.ppo_epochs, args.gpus)
    common = dict(kv_bytes_per_token=model.kv_bytes_per_token(sf), gpu=gpu, mfu=args.mfu)

    def run(batch: int, mode: str, gen_gpus: int | None = None) -> dict:
        return _iteration(
            rl.rl_iteration(
                model.n_params, batch, *shape, mode, gen_gpus=gen_gpus, seed_faithful=sf, **common
            )
        )

    def best(batch: int) -> dict:
        return _iteration(rl.best_async_split(model.n_params, batch, *shape, **common))

    shown = {
        "Synchronous": run(args.batch_size, "sync"),
        "Asynchronous": run(args.batch_size, "async", args.gen_gpus),
    }
    if not sf:
        shown["Async, best split"] = best(args.batch_size)
    sync_s = shown["Synchronous"]["time_per_iter_s"]
    sweep, cells = [], []
    for batch in rl.SEED_BATCH_SIZES:
        e = {"batch_size": batch, "sync": run(batch, "sync"), "async": run(batch, "async")}
        sync, asyn = e["sync"]["samples_per_s"], e["async"]["samples_per_s"]
        cells.append([batch, f"{sync:.1f}", f"{asyn:.1f}", f"{asyn / sync:.2f}x"])
        if not sf:
            b = e["async_best_split"] = best(batch)
            cells[-1] += [
                b["gen_gpus"],
                f"{b['samples_per_s']:.1f}",
                f"{b['samples_per_s'] / sync:.2f}x",
            ]
        sweep.append(e)
    speedups = [e["async"]["samples_per_s"] / e["sync"]["samples_per_s"] for e in sweep]
    mean = sum(speedups) / len(speedups)
    heads = ["Batch", "Sync samples/s", "Async samples/s", "Speedup"]
    if not sf:
        heads += ["Best gen GPUs", "Best async samples/s", "Best speedup"]

    r = Report("rl throughput")
    r.say(
        f"RL iteration: {header(model, gpu)}; batch {args.batch_size}, prompt {args.prompt_len}, "
        f"generate {args.gen_len}, {args.ppo_epochs} PPO epochs at {args.mfu:g} MFU, "
        f"{args.gpus} GPUs"
    )
    r.mode(sf, THROUGHPUT_FAITHFUL).say("")
    rows = [
        {"name": name, **it, "vs_sync": sync_s / it["time_per_iter_s"]}
        for name, it in shown.items()
    ]
    r.table(None, ITERATION_COLS, rows)
    r.say(
        "sync = generate + score + train; async = max(generate + score, train)",
        "",
        grid(heads, cells),
        f"Average async speedup (even split): {mean:.2f}x",
    )
    r.put(
        model=model.name,
        gpu=gpu.name,
        batch_size=args.batch_size,
        gpus=args.gpus,
        iterations=shown,
        speedup=sync_s / shown["Asynchronous"]["time_per_iter_s"],
        batch_sweep=sweep,
        average_speedup=mean,
    )
    if args.plot:
        _plot(args.plot, sweep, " (seed-faithful)" if sf else "")
        r.say(f"plot written to {args.plot}").put(plot=args.plot)
    r.emit(args)
    return 0


def _plot(path: str, sweep: list[dict], title_suffix: str) -> None:
    """The seed's two panels (shared/seeds/001_*.txt L1503-1532): samples/s per batch size for
    sync and async, and the async/sync speedup."""
    batches, x, width = rl.SEED_BATCH_SIZES, range(len(rl.SEED_BATCH_SIZES)), 0.35
    rate = [{mode: e[mode]["samples_per_s"] for mode in ("sync", "async")} for e in sweep]
    with figure(path, 1, 2, figsize=(14, 5)) as (_, (ax1, ax2)):
        ax1.bar([i - width / 2 for i in x], [r["sync"] for r in rate], width, label="Synchronous")
        ax1.bar([i + width / 2 for i in x], [r["async"] for r in rate], width, label="Asynchronous")
        ax1.set_xticks(list(x))
        ax1.set_xticklabels([str(b) for b in batches])
        ax1.set(
            xlabel="Batch size",
            ylabel="Throughput (samples/s)",
            title=f"RL training throughput: sync vs async{title_suffix}",
        )
        ax1.legend()
        ax1.grid(True, alpha=0.3, axis="y")
        ax2.plot(batches, [r["async"] / r["sync"] for r in rate], marker="o", color="green")
        ax2.axhline(1.0, color="r", linestyle="--", alpha=0.5, label="Baseline (sync)")
        ax2.set(xlabel="Batch size", ylabel="Speedup (async / sync)", title="Async vs sync speedup")
        ax2.legend()
        ax2.grid(True, alpha=0.3)


def _run_memory(args) -> int:
    m = rm.rlhf_model_memory(args.params / 1e9, args.activations_gb, args.adam_for)
    rows = [
        [name, f"{m.weights_gb_each:.1f}"]
        for name in ("Actor", "Critic", "Reward model", "Reference")
    ]
    rows += [
        [f"Optimizer states (Adam m+v, {args.adam_for})", f"{m.optimizer_gb:.1f}"],
        ["Activations", f"{m.activations_gb:.1f}"],
        ["Total", f"{m.total_gb:.1f}"],
    ]
    r = Report("rl memory", **record(m, "total_gb"))
    r.say(
        f"RLHF memory, {args.params / 1e9:g}B in FP16 (shared/seeds/002 L11143-11154; the seed "
        "counts the actor's Adam states only)",
        "",
        grid(["Component", "GB"], rows),
    )
    r.emit(args)
    return 0
