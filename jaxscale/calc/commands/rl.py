"""`jaxscale calc rl throughput|memory|timeline|transfer`: RL training cost calculators.

throughput: sync vs async iterations (seed 001 §10); memory: the four-model table (seed 002 ch13
"Memory Requirements"); timeline: RLHF memory per phase (seed 002 ch14 `memory_timeline.py`);
transfer: weight-update transfer times (seed 002 ch14 `weight_update_demo.py`). Nothing here imports
jax.
"""

import argparse

from jaxscale.calc import rl
from jaxscale.calc import rlhf_memory as rm
from jaxscale.calc import weight_transfer as wt
from jaxscale.calc.commands.common import (
    add_gpu_flags,
    add_model_flags,
    gpu_from_args,
    header,
    kv_bytes_per_token,
    model_from_args,
    ms,
    record,
)
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    fraction,
    guarded,
    hidden_alias,
    non_negative_float,
    non_negative_int,
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

TIMELINE_FAITHFUL = "memory_timeline.py's classifier (fixed 560.0 GB) and fixed batch 4 x 2048"
TRANSFER_FAITHFUL = "weight_update_demo.py: unfiltered method lists, two transfers per iteration"
SWEEP_COLS = [
    Col("batch_size", "Batch"),
    Col("kv_gb", "KV GB", ".1f"),
    Col("activations_gb", "Activations GB", ".1f"),
    Col("total_gb", "Total GB", ".1f"),
    Col("fits", "Fits one GPU", lambda fits: "yes" if fits else "no"),
]
METHOD_COLS = [
    Col("name", "Method"),
    Col("seconds", "Transfer time", wt.format_duration),
    Col("notes", "Notes"),
]
TIMELINE_COLS = [
    Col("name", "Method"),
    Col("generation_s", "Generate s", ".1f"),
    Col("transfer_s", "Transfer s", ".2f"),
    Col("training_s", "Train s", ".1f"),
    Col("transfers", "Transfers"),
    Col("total_s", "Iteration s", ".2f"),
    Col("overhead", "Overhead", ".1%"),
]


def add_parser(calc_sub) -> None:
    p = calc_sub.add_parser(
        "rl",
        help="RL training: sync/async throughput, RLHF memory, memory timeline, weight transfer",
    )
    sub = p.add_subparsers(dest="rl_name", required=True, metavar="WHAT")
    _add_throughput(sub)
    _add_memory(sub)
    _add_timeline(sub)
    _add_transfer(sub)


def _add_throughput(sub) -> None:
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
    t.set_defaults(func=guarded(run_throughput))


def _add_memory(sub) -> None:
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
    m.set_defaults(func=guarded(run_memory))


def _add_timeline(sub) -> None:
    tl = add_command(
        sub,
        "timeline",
        help="RLHF memory per phase (seed 002 memory_timeline.py)",
        description="Memory of the four RLHF models in each phase, a batch-size sweep and the "
        "GPUs it needs (seed 002 ch14 memory_timeline.py).",
        example="jaxscale calc rl timeline --model-size 7b --batch-size 8 --gpu-mem 40 --gpus 4",
    )
    tl.add_argument(
        "--model-size",
        "-m",
        default="70b",
        choices=list(rm.TIMELINE_MODELS),
        help="the models' size",
    )
    tl.add_argument("--batch-size", "-b", type=positive_int, default=4, help="sequences")
    tl.add_argument("--seq-len", "-s", type=positive_int, default=2048, help="sequence length")
    a = tl.add_argument("--gpu-mem", "-g", type=positive_float, default=80.0, help="GB per GPU")
    hidden_alias(tl, a, "--gpu-memory")
    a = tl.add_argument("--gpus", "-n", type=positive_int, default=8, help="GPUs available")
    hidden_alias(tl, a, "--num-gpus")
    tl.add_argument("--tp", type=positive_int, default=1, help="show per GPU of a TP group")
    tl.add_argument("--kv-dim", type=positive_int, help="K/V width (default hidden size, no GQA)")
    tl.add_argument(
        "--adam-for",
        choices=rm.ADAM_FOR,
        default="actor",
        help="whose Adam states are counted (the seed: the actor's only)",
    )
    add_output_flags(tl, faithful=True)
    tl.set_defaults(func=guarded(run_timeline))


def _add_transfer(sub) -> None:
    w = add_command(
        sub,
        "transfer",
        help="weight-update transfer times (seed 002 ch14)",
        description="Time to move updated weights from training to generation, per method and "
        "architecture, and its share of an RLHF iteration (seed 002 ch14 weight_update_demo.py).",
        example="jaxscale calc rl transfer --model-size 14 --transfers 2",
    )
    w.add_argument(
        "--model-size",
        "-m",
        type=positive_float,
        default=wt.SEED_MODEL_SIZE_GB,
        help="GB of weights (default 140, 70B in FP16)",
    )
    w.add_argument(
        "--generation-s",
        type=non_negative_float,
        default=wt.SEED_GENERATION_S,
        help="generation time per iteration",
    )
    w.add_argument(
        "--training-s",
        type=non_negative_float,
        default=wt.SEED_TRAINING_S,
        help="training time per iteration",
    )
    w.add_argument(
        "--transfers", type=non_negative_int, help="weight transfers per iteration (default 1)"
    )
    add_output_flags(w, faithful=True)
    w.set_defaults(func=guarded(run_transfer))


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


def run_throughput(args) -> int:
    model, gpu, sf = model_from_args(args), gpu_from_args(args), args.seed_faithful
    if sf and args.gen_gpus:
        raise ValueError("--seed-faithful generates on one GPU; drop --gen-gpus")
    if not sf:
        _check_gpus(args, model.n_params, gpu)
    shape = (args.prompt_len, args.gen_len, args.ppo_epochs, args.gpus)
    common = dict(kv_bytes_per_token=kv_bytes_per_token(model, sf), gpu=gpu, mfu=args.mfu)

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
    """The seed's two panels (seed 001 §10's plot): samples/s per batch size for
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


def run_memory(args) -> int:
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
        f"RLHF memory, {args.params / 1e9:g}B in FP16 (seed 002 ch13; the seed "
        "counts the actor's Adam states only)",
        "",
        grid(["Component", "GB"], rows),
    )
    r.emit(args)
    return 0


def run_timeline(args) -> int:
    sf, model, gpu_gb = args.seed_faithful, rm.get_timeline_model(args.model_size), args.gpu_mem
    opts = {"adam_for": args.adam_for, "tp": args.tp, "kv_dim": args.kv_dim}
    scope = "per GPU" if args.tp > 1 else "in total (not divided by GPUs, as the seed)"
    r = Report("rl timeline")
    r.say(
        f"RLHF memory timeline: {model.name}, batch {args.batch_size} x {args.seq_len}, "
        f"tp={args.tp}, {scope}; GPU {gpu_gb:g} GB x {args.gpus}"
    )
    r.mode(sf, TIMELINE_FAITHFUL)
    phases = []
    r.put(
        model=model.name,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        tp=args.tp,
        adam_for=args.adam_for,
        phases=phases,
    )
    for phase in rm.TIMELINE_PHASES:
        pm = rm.phase_memory(model, args.batch_size, args.seq_len, phase, **opts)
        items = [record(i) for i in pm.items]
        phases.append({"phase": phase, "total_gb": pm.total_gb, "items": items})
        rows = [
            [i["name"], f"{i['gb']:.1f}", "fixed" if i["fixed"] else "scaling"]
            for i in sorted(items, key=lambda i: -i["gb"])
        ]
        ratio = pm.total_gb / gpu_gb
        r.say(
            "",
            f"--- {phase} ---",
            grid(["Component", "GB", "Kind"], rows + [["TOTAL", f"{pm.total_gb:.1f}", ""]]),
            f"needs {ratio:.1f}x the GPU's memory"
            if ratio > 1
            else f"fits ({ratio * 100:.0f}% of {gpu_gb:g} GB)",
        )
    seed_shape = (rm.SEED_SCALING_BATCH, rm.SEED_SCALING_SEQ)  # the script's fixed 4 x 2048
    batch, seq = seed_shape if sf else (args.batch_size, args.seq_len)
    full = rm.phase_memory(model, batch, seq, "full_rlhf", **opts)
    fixed = full.seed_fixed_gb() if sf else full.fixed_gb
    sweep = []
    for bs in rm.SEED_BATCH_SWEEP:
        kv_gb = rm.kv_cache_gb(model, bs, seq, args.kv_dim) / args.tp
        act_gb = rm.activations_gb(model, bs, seq) / args.tp
        total = fixed + kv_gb + act_gb
        sweep.append(
            dict(
                batch_size=bs,
                kv_gb=kv_gb,
                activations_gb=act_gb,
                total_gb=total,
                fits=total <= gpu_gb,
            )
        )
    rec = rm.recommend(full.total_gb, gpu_gb, args.gpus, seed_faithful=sf)
    advice = {
        "single GPU": "fits on one GPU: simple co-located setup",
        "does not fit": f"does not fit: need {rec.gpus_needed} GPUs of {gpu_gb:g} "
        "GB, or ZeRO-3/FSDP, gradient checkpointing, a disaggregated layout",
        "fits across GPUs": f"fits across {args.gpus} GPUs: tensor parallel {rec.tp}, "
        f"data/pipeline parallel {rec.data_or_pipeline}",
    }[rec.verdict]
    r.say(
        "",
        f"Full RLHF (all four models, batch {batch} x {seq}): fixed {fixed:.1f} GB "
        f"(weights, gradients, optimizer), scaling {full.total_gb - fixed:.1f} GB (KV, "
        f"activations), total {full.total_gb:.1f} GB",
    )
    r.put(full_rlhf=dict(total_gb=full.total_gb, fixed_gb=fixed, scaling_gb=full.total_gb - fixed))
    r.table("batch_sweep", SWEEP_COLS, sweep)
    r.say("", f"Required {rec.required_gb:.1f} GB, available {rec.available_gb:.1f} GB: {advice}")
    r.put(recommendation=record(rec)).emit(args)
    return 0


def run_transfer(args) -> int:
    sf = args.seed_faithful
    if sf and args.transfers is not None:
        raise ValueError("--seed-faithful counts the seed's two transfers; drop --transfers")
    transfers = 1 if args.transfers is None else args.transfers
    transfers = wt.SEED_TRANSFERS_PER_ITERATION if sf else transfers
    r = Report("rl transfer")
    r.say(f"Weight update of {args.model_size:g} GB (seed 002 ch14 weight_update_demo.py)")
    by_arch = {}
    r.mode(sf, TRANSFER_FAITHFUL).put(model_size_gb=args.model_size, architectures=by_arch)
    for arch in wt.ARCHITECTURES:
        methods = []
        for key in wt.applicable_methods(arch, seed_faithful=sf):
            method = wt.TRANSFER_METHODS[key]
            seconds = wt.transfer_time_s(method, args.model_size)
            methods.append(
                {
                    "method": key,
                    "name": method.name,
                    "seconds": seconds,
                    "notes": wt.rating(method, seconds),
                }
            )
        by_arch[arch] = methods
        r.say("", f"--- {arch} ---").table(None, METHOD_COLS, methods)
    timelines = []
    for key in wt.SEED_TIMELINE_METHODS:
        t = wt.rlhf_timeline(key, args.model_size, args.generation_s, args.training_s, transfers)
        timelines.append(record(t, "total_s", "overhead", name=wt.TRANSFER_METHODS[key].name))
    r.say("", f"RLHF iteration: generate -> train -> {transfers} weight transfer(s)")
    r.put(transfers_per_iteration=transfers).table("timelines", TIMELINE_COLS, timelines)
    r.emit(args)
    return 0
