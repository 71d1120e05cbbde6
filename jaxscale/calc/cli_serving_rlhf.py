"""`jaxscale calc rl timeline|transfer`: RLHF memory per phase and weight-update transfer times.

Ports of shared/seeds/002_*.txt ch14 `memory_timeline.py` (L12884-13197) and
`weight_update_demo.py` (L12476-12803). Nothing here imports jax.
"""

from jaxscale.calc import rlhf_memory as rm
from jaxscale.calc import weight_transfer as wt
from jaxscale.calc.cli_serving_common import record
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    guarded,
    hidden_alias,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report, grid

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


def add_parsers(sub) -> None:
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
    r.say(f"Weight update of {args.model_size:g} GB (shared/seeds/002 weight_update_demo.py)")
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
