"""`jaxscale calc memory`: training memory per GPU under ZeRO 0-3 and TP/PP/DP.

Scenarios reproduce the seeds' tables: seed000 (seed 000 Exercise 1, the default), seed001 (seed 001
§6, LLaMA-2-70B configurations) and s4 (seed 004 §12 "Memory Requirements", GPT-3 on one GPU with
and without checkpointing).

--cp N adds context parallelism (seed 001 §6): N of the GPUs split each sequence, so the data
parallel degree is gpus / (tp pp cp), activations per GPU are divided by N, and the attention
scores each form holds (ring, all-gather, Ulysses; `calc.context.attention_scores`) are tabulated;
--cp-form adds one form's scores to the activations.
"""

import math
from dataclasses import asdict

from jaxscale.calc import context
from jaxscale.calc import memory as mem
from jaxscale.calc.commands import context_tables
from jaxscale.calc.models import SHAPE_PRESETS, get_model
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    comma_list,
    guarded,
    hidden_alias,
    parse_count,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report, figure, fmt_bytes, fmt_count, grid

SEED000_MODELS = ("gpt2-124m", "llama-7b", "llama-70b")
STAGE_LABELS = ("No ZeRO (DP)", "Stage 1", "Stage 2", "Stage 3")
# Seed 001 §6's example configurations: (name, tp, pp, dp, zero stage, gradient checkpointing).
SEED001_CONFIGS = (
    ("Baseline (no parallelism)", 1, 1, 1, 0, False),
    ("TP=8", 8, 1, 1, 0, False),
    ("TP=8 + Gradient Checkpointing", 8, 1, 1, 0, True),
    ("TP=8 + ZeRO-1", 8, 1, 8, 1, False),
    ("TP=8 + ZeRO-2", 8, 1, 8, 2, False),
    ("TP=8 + ZeRO-3", 8, 1, 8, 3, False),
)
SEED001_PARAMS = 70e9
# Seed 004 §12's example: GPT-3 175B, one sequence of 2048, Adam, mixed precision.
S4_GPT3 = {"batch_size": 1, "seq_len": 2048, "hidden_size": 12288, "n_layers": 96}
PARTS = ("weights", "gradients", "optimizer", "activations", "total")  # the seeds' tables
SEED001_HEADS = ("Params", "Grads", "Optimizer", "Activations", "Total")
S4_HEADS = ("Parameters", "Gradients", "Optimizer", "Activations", "Total")
FAITHFUL_WHAT = "the ZeRO-2 row of seed 002 ch5, which leaves gradients out (210 GB)"
HEAD_DIM = 128  # the head width assumed for --params without --heads (LLaMA's)


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "memory",
        help="training memory per GPU: ZeRO 0-3, TP/PP/DP, activations",
        description="Per-GPU training memory for mixed-precision Adam (12 B/param; 16 with "
        "--master). Without --model/--params it prints seed 000's tables.",
        example="jaxscale calc memory --params 70B --gpus 64 --tp 8 --pp 2 --plot memory.png",
    )
    p.add_argument(
        "--model",
        type=comma_list(get_model),
        help=f"presets, comma-separated: {', '.join(SHAPE_PRESETS)}",
    )
    p.add_argument("--params", type=parse_count, help="parameter count instead, e.g. 70B")
    p.add_argument(
        "--scenario",
        choices=("seed000", "seed001", "s4"),
        help="a seed's table: seed 000's ZeRO stages (the default), seed 001's "
        "LLaMA-2-70B configurations, seed 004's GPT-3 on one GPU",
    )
    p.add_argument("--gpus", type=positive_int, default=8, help="GPUs")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline stages")
    p.add_argument(
        "--zero", type=int, choices=(0, 1, 2, 3), help="only this ZeRO stage (default: all four)"
    )
    p.add_argument("--master", action="store_true", help="keep an fp32 master copy (+4 B/param)")
    a = p.add_argument(
        "--gpu-mem", type=positive_float, default=80, help="GB of memory per GPU (an A100's)"
    )
    hidden_alias(p, a, "--gpu-memory-gb")
    p.add_argument(
        "--activations",
        choices=("none", "simple", "heuristic"),
        default="none",
        help="simple: b*s*h*L*8 B (seed 004); heuristic: 10x params (seed 001)",
    )
    a = p.add_argument("--batch-size", type=positive_int, default=1, help="sequences per GPU")
    hidden_alias(p, a, "--batch")
    a = p.add_argument(
        "--seq-len", type=positive_int, help="sequence length (default: the preset's, else 2048)"
    )
    hidden_alias(p, a, "--seq")
    a = p.add_argument("--d-model", type=positive_int, help="hidden size, with --params")
    hidden_alias(p, a, "--hidden")
    p.add_argument("--layers", type=positive_int, help="layers, with --params")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    g = p.add_argument_group("context parallelism (seed 001 §6: the sequence split over GPUs)")
    g.add_argument(
        "--cp",
        type=positive_int,
        default=1,
        help="context-parallel size: GPUs sharing each sequence, activations divided by it",
    )
    g.add_argument(
        "--cp-form",
        choices=context.FORMS,
        help="add this form's attention scores (f32) to the activations: ring (one chunk "
        "pair at a time), gather (Llama 3's all-gather) or ulysses (DeepSpeed-Ulysses)",
    )
    g.add_argument(
        "--heads",
        type=positive_int,
        help="query heads for the attention scores (default: the preset's, else d_model/128)",
    )
    add_output_flags(p, plot=True, faithful=True)
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    if args.scenario and (args.model or args.params):
        raise ValueError("--scenario cannot be combined with --model or --params")
    if args.scenario and (args.cp > 1 or args.cp_form):
        raise ValueError("--cp and --cp-form apply to the ZeRO tables, not to --scenario")
    if args.cp_form and args.cp == 1:
        raise ValueError("--cp-form needs --cp above 1 (one GPU per sequence has no form)")
    if args.cp_form and args.activations == "none":
        raise ValueError("--cp-form adds attention scores to the activations: give --activations")
    if args.model and args.params:
        raise ValueError("give --model or --params, not both")
    if args.scenario == "seed001":
        return _seed001(args)
    if args.scenario == "s4":
        return _s4(args)
    return _zero_tables(args)


def _models(args) -> list[tuple[str, float, int | None, int | None, int, int | None]]:
    """(name, params, hidden, layers, seq, heads) for each model to tabulate."""
    if args.params:
        heads = args.heads or (max(1, args.d_model // HEAD_DIM) if args.d_model else None)
        name = f"{fmt_count(args.params)} params"
        return [(name, args.params, args.d_model, args.layers, 0, heads)]
    presets = args.model or [get_model(name) for name in SEED000_MODELS]
    return [
        (m.name, m.n_params, m.d_model, m.n_layers, m.max_seq_len, args.heads or m.n_heads)
        for m in presets
    ]


def _activation_bytes(args, n_params, hidden, layers, seq, tp, pp, cp=1) -> float:
    if args.activations == "heuristic":
        return mem.activation_bytes_param_heuristic(
            n_params, tp=tp, pp=pp, checkpointing=args.checkpointing, cp=cp
        )
    if args.activations == "simple":
        if hidden is None or layers is None:
            raise ValueError("--activations simple with --params needs --d-model and --layers")
        # Each pipeline stage keeps its own layers' activations; TP leaves them replicated,
        # CP keeps seq/cp of each sequence's tokens.
        return mem.activation_bytes_simple(
            args.batch_size,
            context_tables.seq_len(args, seq),
            hidden,
            math.ceil(layers / pp),
            checkpointing=args.checkpointing,
            cp=cp,
        )
    return 0.0


def _record(m: mem.TrainingMemory, capacity: float, **fields) -> dict:
    return {**fields, **asdict(m), "total": m.total, "fits": mem.fits(m, capacity)}


def _cols(first: Col, parts, fmt, args, fits=("YES", "NO")) -> list[Col]:
    """The first column, one per (field, header) part, and whether the total fits."""
    return [
        first,
        *(Col(key, head, fmt) for key, head in parts),
        Col("fits", f"Fits {args.gpu_mem:g} GB?", lambda ok: fits[not ok]),
    ]


def _zero_cols(first: Col, args) -> list[Col]:
    parts = [("weights", "Weights"), ("gradients", "Grads"), ("optimizer", "Optimizer")]
    parts += [("master", "Master")] if args.master else []
    parts += [("activations", "Activations")] if args.activations != "none" else []
    return _cols(first, [*parts, ("total", "Total/GPU")], fmt_bytes, args)


def _zero_tables(args) -> int:
    tp, pp, cp = args.tp, args.pp, args.cp
    if args.gpus % (tp * pp * cp):
        with_cp = f" x --cp {cp}" if cp > 1 else ""
        raise ValueError(
            f"--gpus {args.gpus} does not factor into --tp {tp} x --pp {pp}{with_cp} x dp"
        )
    dp = args.gpus // (tp * pp * cp)
    capacity = args.gpu_mem * 1e9
    master = mem.FP32_BYTES if args.master else 0
    per_param = mem.MIXED_ADAM_BYTES_PER_PARAM + master
    stages = [args.zero] if args.zero is not None else list(mem.ZERO_STAGES)
    r = Report("memory")
    r.say(
        "Training memory, mixed-precision Adam: bf16 weights 2 + bf16 grads 2 + fp32 Adam m,v 8"
        + (" + fp32 master 4" if master else "")
        + f" = {per_param} B/param"
    )
    r.mode(args.seed_faithful, FAITHFUL_WHAT)
    r.put(
        bytes_per_param=per_param, device_memory_bytes=capacity, gpus=args.gpus, dp=dp, tp=tp, pp=pp
    )
    if cp > 1:
        r.put(cp=cp, cp_form=args.cp_form)
    models = _models(args)
    single = []
    for name, n, hidden, layers, seq, _ in models:
        act = _activation_bytes(args, n, hidden, layers, seq, 1, 1)
        one = mem.training_memory_per_device(n, master_bytes=master, activation_bytes=act)
        single.append(_record(one, capacity, model=name, n_params=n))
    r.say("", "Single GPU")
    r.table("single_gpu", _zero_cols(Col("model", "Model"), args), single)
    with_cp = f", cp={cp}" + (f" {args.cp_form}" if args.cp_form else "") if cp > 1 else ""
    r.say("", f"Per GPU on {args.gpus} GPUs (dp={dp}, tp={tp}, pp={pp}{with_cp})")
    per_gpu, stage_col = [], Col("zero_stage", "ZeRO stage", STAGE_LABELS.__getitem__)
    for name, n, hidden, layers, seq, heads in models:
        act = _activation_bytes(args, n, hidden, layers, seq, tp, pp, cp)
        if args.cp_form:
            act += context_tables.scores(args, args.cp_form, layers, seq, heads, tp, pp).bytes
        rows = mem.zero_stage_memories(
            n,
            dp=dp,
            tp=tp,
            pp=pp,
            master_bytes=master,
            activation_bytes=act,
            seed_faithful=args.seed_faithful,
        )
        records = [_record(rows[s], capacity, zero_stage=s) for s in stages]
        per_gpu.append({"model": name, "n_params": n, "stages": records})
        r.say(f"--- {name} ({fmt_count(n)} params) ---")
        r.table(None, _zero_cols(stage_col, args), records)
        r.say("")
    r.put(per_gpu=per_gpu)
    if cp > 1:
        context_tables.say_scores(r, args, models, tp, pp)
    if args.seed_faithful:
        r.say("Stage 2 leaves the sharded gradients out, as seed 002 ch5 does.")
    if args.plot:
        _plot(args.plot, per_gpu[-1], args.gpus, args.gpu_mem)
        r.say(f"plot written to {args.plot}")
    r.emit(args)
    return 0


def _seed001(args) -> int:
    capacity = args.gpu_mem * 1e9
    records = []
    for name, tp, pp, dp, zero, ckpt in SEED001_CONFIGS:
        act = mem.activation_bytes_param_heuristic(SEED001_PARAMS, tp=tp, pp=pp, checkpointing=ckpt)
        m = mem.training_memory_per_device(
            SEED001_PARAMS, dp=dp, tp=tp, pp=pp, zero_stage=zero, activation_bytes=act
        )
        records.append(
            _record(
                m, capacity, config=name, tp=tp, pp=pp, dp=dp, zero_stage=zero, checkpointing=ckpt
            )
        )
    r = Report("memory", scenario="seed001")
    r.say(
        "Memory per GPU for a 70B model (seed 001 §6; activations = 10x params,",
        "3x with gradient checkpointing, in bf16)",
        "",
    )
    parts = zip(PARTS, SEED001_HEADS, strict=True)
    cols = _cols(Col("config", "Configuration"), parts, _gb(1), args, ("yes", "no"))
    r.table("rows", cols, records)
    r.emit(args)
    return 0


def _s4(args) -> int:
    capacity = args.gpu_mem * 1e9
    plain, ckpt = (
        mem.single_gpu_memory(175e9, mixed_precision=True, activation_checkpointing=c, **S4_GPT3)
        for c in (False, True)
    )
    rows = [
        [head] + [_gb(2)(getattr(m, key)) for m in (plain, ckpt)]
        for key, head in zip(PARTS, S4_HEADS, strict=True)
    ]
    fits = ["Fits" if mem.fits(m, capacity) else "Does not fit" for m in (plain, ckpt)]
    rows.append([f"{args.gpu_mem:g} GB GPU", *fits])
    r = Report("memory", scenario="s4")
    r.say(
        "GPT-3 175B on one GPU, batch 1 x 2048, Adam, mixed precision (seed 004 §12)",
        "",
        grid(["Component", "No checkpointing", "Checkpointing (sqrt L)"], rows),
    )
    r.put(no_checkpointing=_record(plain, capacity), checkpointing=_record(ckpt, capacity))
    r.emit(args)
    return 0


def _gb(digits: int):
    return lambda n: f"{n / 1e9:.{digits}f} GB"


PLOT_PARTS = (
    ("weights", "Weights (bf16)"),
    ("gradients", "Gradients (bf16)"),
    ("optimizer", "Optimizer states (fp32)"),
    ("master", "Master copy (fp32)"),
    ("activations", "Activations"),
)


def _plot(path, model: dict, gpus: int, capacity_gb: float) -> None:
    """Stacked per-GPU memory of each ZeRO stage of one model's records."""
    stages = model["stages"]
    labels = [STAGE_LABELS[x["zero_stage"]] for x in stages]
    with figure(path) as (fig, ax):
        bottom = [0.0] * len(stages)
        for field, label in PLOT_PARTS:
            values = [x[field] / 1e9 for x in stages]
            if any(values):
                ax.bar(labels, values, 0.5, bottom=bottom, label=label)
                bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.axhline(
            capacity_gb, color="red", linestyle="--", label=f"GPU capacity ({capacity_gb:g} GB)"
        )
        for i, total in enumerate(bottom):
            ax.text(i, total, f"{total:.1f} GB", ha="center", va="bottom")
        ax.set_ylabel("Per-GPU memory (GB)")
        ax.set_title(f"{model['model']} training memory per GPU on {gpus} GPUs")
        ax.legend(loc="upper right")
