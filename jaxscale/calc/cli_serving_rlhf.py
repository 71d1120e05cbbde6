"""`jaxscale calc rl timeline|transfer`: RLHF memory per phase and weight-update transfer times.

Ports of shared/seeds/002_*.txt ch14 `memory_timeline.py` (L12884-13197) and
`weight_update_demo.py` (L12476-12803). Nothing here imports jax.
"""

from jaxscale.calc import rlhf_memory as rm
from jaxscale.calc import weight_transfer as wt
from jaxscale.calc.cli_serving import mode_name, record
from jaxscale.calc.training_format import (
    add_output_flags,
    emit,
    format_table,
    guarded,
    mode_line,
    non_negative_float,
    positive_float,
    positive_int,
)

TIMELINE_FAITHFUL = "memory_timeline.py's classifier (fixed 560.0 GB) and fixed batch 4 x 2048"
TRANSFER_FAITHFUL = "weight_update_demo.py: unfiltered method lists, two transfers per iteration"
TIMELINE_HEADERS = ["Method", "Generate s", "Transfer s", "Train s", "Transfers"]
TIMELINE_HEADERS += ["Iteration s", "Overhead"]


def add_parsers(sub) -> None:
    tl = sub.add_parser("timeline", help="RLHF memory per phase (seed 002 memory_timeline.py)")
    tl.add_argument("--model-size", "-m", default="70b", choices=list(rm.TIMELINE_MODELS))
    tl.add_argument("--batch-size", "-b", type=positive_int, default=4)
    tl.add_argument("--seq-len", "-s", type=positive_int, default=2048)
    tl.add_argument("--gpu-memory", "-g", type=positive_float, default=80.0, help="GB per GPU")
    tl.add_argument("--num-gpus", "-n", type=positive_int, default=8)
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

    w = sub.add_parser("transfer", help="weight-update transfer times (seed 002 ch14)")
    w.add_argument(
        "--model-size",
        "-m",
        type=positive_float,
        default=wt.SEED_MODEL_SIZE_GB,
        help="GB of weights (default 140, 70B in FP16)",
    )
    w.add_argument("--generation-s", type=non_negative_float, default=wt.SEED_GENERATION_S)
    w.add_argument("--training-s", type=non_negative_float, default=wt.SEED_TRAINING_S)
    w.add_argument("--transfers", type=int, help="weight transfers per iteration (default 1)")
    add_output_flags(w, faithful=True)
    w.set_defaults(func=guarded(run_transfer))


def run_timeline(args) -> int:
    sf, model = args.seed_faithful, rm.get_timeline_model(args.model_size)
    opts = {"adam_for": args.adam_for, "tp": args.tp, "kv_dim": args.kv_dim}
    scope = "per GPU" if args.tp > 1 else "in total (not divided by GPUs, as the seed)"
    lines = [
        f"RLHF memory timeline: {model.name}, batch {args.batch_size} x {args.seq_len}, "
        f"tp={args.tp}, {scope}; GPU {args.gpu_memory:g} GB x {args.num_gpus}",
        mode_line(sf, TIMELINE_FAITHFUL),
    ]
    phases_json = []
    for phase in rm.TIMELINE_PHASES:
        pm = rm.phase_memory(model, args.batch_size, args.seq_len, phase, **opts)
        rows = [
            [i.name, f"{i.gb:.1f}", "fixed" if i.fixed else "scaling"]
            for i in sorted(pm.items, key=lambda i: -i.gb)
        ]
        rows.append(["TOTAL", f"{pm.total_gb:.1f}", ""])
        ratio = pm.total_gb / args.gpu_memory
        verdict = (
            f"needs {ratio:.1f}x the GPU's memory"
            if ratio > 1
            else f"fits ({ratio * 100:.0f}% of {args.gpu_memory:g} GB)"
        )
        lines += ["", f"--- {phase} ---", format_table(["Component", "GB", "Kind"], rows), verdict]
        phases_json.append(
            {
                "phase": phase,
                "total_gb": pm.total_gb,
                "items": [{"name": i.name, "gb": i.gb, "fixed": i.fixed} for i in pm.items],
            }
        )
    batch, seq = (
        (rm.SEED_SCALING_BATCH, rm.SEED_SCALING_SEQ) if sf else (args.batch_size, args.seq_len)
    )
    full = rm.phase_memory(model, batch, seq, "full_rlhf", **opts)
    fixed = full.seed_fixed_gb() if sf else full.fixed_gb
    sweep, sweep_json = [], []
    for bs in rm.SEED_BATCH_SWEEP:
        kv_gb = rm.kv_cache_gb(model, bs, seq, args.kv_dim) / args.tp
        act_gb = rm.activations_gb(model, bs, seq) / args.tp
        total = fixed + kv_gb + act_gb
        fit = total <= args.gpu_memory
        sweep.append([bs, f"{kv_gb:.1f}", f"{act_gb:.1f}", f"{total:.1f}", "yes" if fit else "no"])
        sweep_json.append(dict(batch_size=bs, kv_gb=kv_gb, activations_gb=act_gb, total_gb=total))
        sweep_json[-1]["fits"] = fit
    rec = rm.recommend(full.total_gb, args.gpu_memory, args.num_gpus, seed_faithful=sf)
    advice = {
        "single GPU": "fits on one GPU: simple co-located setup",
        "does not fit": f"does not fit: need {rec.gpus_needed} GPUs of {args.gpu_memory:g} "
        "GB, or ZeRO-3/FSDP, gradient checkpointing, a disaggregated layout",
        "fits across GPUs": f"fits across {args.num_gpus} GPUs: tensor parallel {rec.tp}, "
        f"data/pipeline parallel {rec.data_or_pipeline}",
    }[rec.verdict]
    lines += [
        "",
        f"Full RLHF (all four models, batch {batch} x {seq}): fixed {fixed:.1f} GB "
        f"(weights, gradients, optimizer), scaling {full.total_gb - fixed:.1f} GB (KV, "
        f"activations), total {full.total_gb:.1f} GB",
        format_table(["Batch", "KV GB", "Activations GB", "Total GB", "Fits one GPU"], sweep),
        "",
        f"Required {rec.required_gb:.1f} GB, available {rec.available_gb:.1f} GB: {advice}",
    ]
    report = {
        "command": "rl timeline",
        "mode": mode_name(sf),
        "model": model.name,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "tp": args.tp,
        "adam_for": args.adam_for,
        "phases": phases_json,
        "full_rlhf": dict(total_gb=full.total_gb, fixed_gb=fixed, scaling_gb=full.total_gb - fixed),
        "batch_sweep": sweep_json,
        "recommendation": record(rec),
    }
    emit(args, report, lines)
    return 0


def run_transfer(args) -> int:
    sf = args.seed_faithful
    if sf and args.transfers is not None:
        raise ValueError("--seed-faithful counts the seed's two transfers; drop --transfers")
    transfers = (
        wt.SEED_TRANSFERS_PER_ITERATION if sf else (1 if args.transfers is None else args.transfers)
    )
    lines = [
        f"Weight update of {args.model_size:g} GB (shared/seeds/002 weight_update_demo.py)",
        mode_line(sf, TRANSFER_FAITHFUL),
    ]
    arch_json = {}
    for arch in wt.ARCHITECTURES:
        rows, out = [], []
        for key in wt.applicable_methods(arch, seed_faithful=sf):
            method = wt.TRANSFER_METHODS[key]
            seconds = wt.transfer_time_s(method, args.model_size)
            rows.append([method.name, wt.format_duration(seconds), wt.rating(method, seconds)])
            out.append({"method": key, "name": method.name, "seconds": seconds})
        arch_json[arch] = out
        lines += ["", f"--- {arch} ---", format_table(["Method", "Transfer time", "Notes"], rows)]
    timelines = [
        wt.rlhf_timeline(key, args.model_size, args.generation_s, args.training_s, transfers)
        for key in wt.SEED_TIMELINE_METHODS
    ]
    rows = [
        [wt.TRANSFER_METHODS[t.method].name, f"{t.generation_s:.1f}", f"{t.transfer_s:.2f}"]
        + [f"{t.training_s:.1f}", t.transfers, f"{t.total_s:.2f}", f"{t.overhead * 100:.1f}%"]
        for t in timelines
    ]
    lines += [
        "",
        f"RLHF iteration: generate -> train -> {transfers} weight transfer(s)",
        format_table(TIMELINE_HEADERS, rows),
    ]
    report = {
        "command": "rl transfer",
        "mode": mode_name(sf),
        "model_size_gb": args.model_size,
        "architectures": arch_json,
        "transfers_per_iteration": transfers,
        "timelines": [record(t, "total_s", "overhead") for t in timelines],
    }
    emit(args, report, lines)
    return 0
