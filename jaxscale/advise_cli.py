"""`jaxscale advise`: recommend data / ZeRO / tensor / pipeline / expert / context degrees,
beside the four seed rule sets (seed 000 exercise 4, seed 001, seed 002 ch7 calculator, seed 004).
Imports no jax.

    jaxscale advise --params 70B --gpus 64 --gpu-mem 80 [--gpus-per-node 8 --seq-len 4096
                    --batch-size 512]

A context-parallel degree (cp, seed 001 §6) is considered for a long sequence: when the activations
at --seq-len do not fit per GPU without it, even recomputed, beside a model state that does fit
(`jaxscale.calc.advisor`'s rule; --context always / never overrides it).
"""

# The advice is pure Python (jaxscale.calc.advisor*); only --validate imports jax, lazily.

import argparse
from dataclasses import fields, is_dataclass

from jaxscale.calc.advisor import RECOMPUTE_CHOICES, AdviceReport, advise
from jaxscale.calc.advisor_context import CONTEXT_CHOICES, CP_FORM_CHOICES
from jaxscale.calc.advisor_model import (
    ASSUMED_MFU,
    GPU,
    INTER_NODE_BYTES_PER_S,
    USABLE_FRACTION,
    Hardware,
    LayoutCost,
    Workload,
)
from jaxscale.cliutil import (
    add_command,
    fraction,
    hidden_alias,
    non_negative_int,
    parse_count,
    positive_float,
    positive_int,
    probability,
)
from jaxscale.render import Col, Report, fmt_cell, grid

GB = 1e9
MIN_PARAMS = 1e6  # below this, --params was almost surely given in billions (the seed's unit)
_PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # weights and gradients (seed 003)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "advise",
        help="recommend a TP x PP x DP (x EP, x CP) layout and ZeRO stage; seed rule sets side "
        "by side",
        description="Recommend data / ZeRO / tensor / pipeline / expert / context degrees for a "
        "model on a cluster, beside the four seed rule sets (seed 000 exercise 4, seed 001, seed "
        "002 ch7 calculator, seed 004). Context parallelism is considered for a long sequence: "
        "when its activations do not fit per GPU without it, even recomputed. Imports no jax "
        "(except --validate).",
        example="jaxscale advise --params 70B --gpus 64 --gpu-mem 80 --seq-len 4096 "
        "--batch-size 512",
    )
    a = p.add_argument
    a(
        "--params",
        type=parse_count,
        default=70e9,
        help="parameter count, all experts included (default 70B)",
    )
    a("--gpus", type=positive_int, default=64, help="number of GPUs")
    a("--gpu-mem", type=positive_float, default=GPU.memory_gb, help="memory per GPU in GB")
    a("--gpus-per-node", type=positive_int, default=8, help="GPUs per node sharing NVLink")
    hidden_alias(
        p, a("--seq-len", type=positive_int, default=4096, help="tokens per sequence"), "--seq"
    )
    hidden_alias(
        p,
        a(
            "--batch-size",
            type=positive_int,
            default=512,
            help="global batch in sequences per step",
        ),
        "--batch",
    )
    a("--micro-batch", type=positive_int, default=1, help="sequences per forward pass per GPU")
    hidden_alias(
        p,
        a(
            "--d-model",
            type=non_negative_int,
            default=0,
            help="hidden size; 0 derives it from --params",
        ),
        "--hidden",
    )
    a("--layers", type=non_negative_int, default=0, help="layers; 0 derives them from --params")
    a("--moe", action="store_true", help="mixture of experts: also choose an expert degree")
    a("--num-experts", type=positive_int, default=64, help="experts per MoE layer, with --moe")
    a("--top-k", type=positive_int, default=2, help="experts per token, with --moe")
    a(
        "--heads",
        type=non_negative_int,
        default=0,
        help="query heads (the K/V blocks context parallelism moves); 0 derives d_model/128",
    )
    a("--kv-heads", type=non_negative_int, default=0, help="key/value heads; 0: as many as heads")
    a(
        "--context",
        choices=CONTEXT_CHOICES,
        default="auto",
        help="context parallelism: auto considers it when the activations at --seq-len do not "
        "fit per GPU without it, even recomputed; always or never decide",
    )
    a(
        "--cp-form",
        choices=CP_FORM_CHOICES,
        default="auto",
        help="its form: ring attention, gather (Llama 3's all-gather), ulysses "
        "(DeepSpeed-Ulysses); auto ranks all three",
    )
    a(
        "--precision",
        choices=sorted(_PRECISION_BYTES),
        default="bf16",
        help="of the weights and gradients",
    )
    a("--master-weights", action="store_true", help="keep an fp32 master copy (+4 B/param)")
    a(
        "--recompute",
        choices=list(RECOMPUTE_CHOICES),
        default="auto",
        help="full activation recomputation: auto lets the ranking decide",
    )
    a(
        "--headroom",
        type=probability,
        default=1 - USABLE_FRACTION,
        help="fraction of memory kept free, below 1",
    )
    a(
        "--intra-node-gbs",
        type=positive_float,
        default=GPU.link_gb_s,
        help="NVLink GB/s per GPU, one direction",
    )
    a(
        "--inter-node-gbs",
        type=positive_float,
        default=INTER_NODE_BYTES_PER_S / GB,
        help="InfiniBand GB/s per GPU",
    )
    a("--peak-tflops", type=positive_float, default=GPU.bf16_tflops, help="peak TFLOP/s per GPU")
    a("--mfu", type=fraction, default=ASSUMED_MFU, help="assumed fraction of peak achieved")
    a("--top", type=non_negative_int, default=5, help="alternative layouts to list")
    a("--seed002-table", action="store_true", help="print seed 002's strategy comparison table")
    a(
        "--seed-faithful",
        action="store_true",
        help="seed 002 calculator as the seed prints it (defect 6), with its table",
    )
    a("--json", action="store_true", help="print one JSON object")
    a(
        "--validate",
        action="store_true",
        help="scale the recommended layout down to the simulated devices, compile it, and compare "
        "its memory and collectives with the predictions (imports jax)",
    )
    p.set_defaults(func=lambda args: _run(args, p))


def _check(args) -> None:
    """What the types cannot check alone, named by flag."""
    if args.params < MIN_PARAMS:
        raise ValueError(f"--params {args.params:g} is a parameter count (e.g. 70B), not billions")
    if args.headroom >= 1:
        raise ValueError(
            f"--headroom must be below 1 (some memory must be usable), got {args.headroom:g}"
        )
    if args.micro_batch > args.batch_size:
        raise ValueError(f"--micro-batch {args.micro_batch} exceeds --batch-size {args.batch_size}")
    if args.moe and args.top_k > args.num_experts:
        raise ValueError(f"--top-k {args.top_k} exceeds --num-experts {args.num_experts}")
    g, node = args.gpus, args.gpus_per_node
    if (g > node and g % node) or (g < node and node % g):
        raise ValueError(
            f"--gpus {g} does not factor into nodes of --gpus-per-node {node}: use "
            f"a multiple of {node} or a divisor of it"
        )


def _inputs(args) -> tuple[Workload, Hardware]:
    _check(args)
    state_bytes = _PRECISION_BYTES[args.precision]
    workload = Workload(
        n_params=args.params,
        seq=args.seq_len,
        batch=args.batch_size,
        micro_batch=args.micro_batch,
        hidden=args.d_model,
        layers=args.layers,
        num_experts=args.num_experts if args.moe else 1,
        top_k=args.top_k if args.moe else 1,
        weight_bytes=state_bytes,
        grad_bytes=state_bytes,
        master_bytes=4 if args.master_weights else 0,
        heads=args.heads,
        kv_heads=args.kv_heads,
    )
    hardware = Hardware(
        num_gpus=args.gpus,
        gpu_memory_bytes=args.gpu_mem * GB,
        gpus_per_node=args.gpus_per_node,
        intra_node_bytes_per_s=args.intra_node_gbs * GB,
        inter_node_bytes_per_s=args.inter_node_gbs * GB,
        peak_flops=args.peak_tflops * 1e12,
        assumed_mfu=args.mfu,
        usable_fraction=1 - args.headroom,
    )
    return workload, hardware


def _run(args, parser: argparse.ArgumentParser) -> int:
    try:
        report = advise(
            *_inputs(args),
            recompute=args.recompute,
            seed_faithful=args.seed_faithful,
            context=args.context,
            cp_form=args.cp_form,
        )
    except ValueError as err:
        parser.error(str(err))  # one line on stderr, exit code 2
    render(report, args.top, seed002_table=args.seed002_table or args.seed_faithful).emit(args)
    if not args.validate:
        return 0
    if report.best is None:
        parser.error("--validate: no layout fits, nothing to validate")
    from jaxscale.bench.validate_layout import validate  # jax only here: the advice stays instant

    lay = report.best.layout
    lines, ok = validate(lay.tp, lay.pp, lay.dp, lay.zero_stage, cp=lay.cp, cp_form=lay.cp_form)
    print("\n" + "\n".join(lines))
    return 0 if ok else 1


# --- output: the JSON records, and the text rendered from them ------------------------------------


def _record(obj):
    """A dataclass as a JSON record: its fields and its properties (totals), recursively."""
    if isinstance(obj, list | tuple):
        return [_record(x) for x in obj]
    if not is_dataclass(obj):
        return obj
    props = [k for k, v in vars(type(obj)).items() if isinstance(v, property)]
    return {k: _record(getattr(obj, k)) for k in [*(f.name for f in fields(obj)), *props]}


def _cost(cost: LayoutCost | None) -> dict | None:
    return None if cost is None else {**_record(cost), "label": cost.layout.label()}


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _in_gb(digits: int):
    return lambda gb: f"{gb:.{digits}f} GB"


def _s(x: float) -> str:
    return f"{x:.2f} s"


def _yes(x: bool) -> str:
    return "yes" if x else "no"


def _table(cols: list[Col], records, extra=(), *, label_column: bool = True) -> str:
    """render.table plus ready rows `extra` (a totals row, a rule that fits nothing)."""
    rows = [[fmt_cell(r.get(c.key), c.fmt) for c in cols] for r in records] + list(extra)
    return grid([c.head for c in cols], rows, label_column=label_column)


_RULE_COLS = [
    Col("rule", "rule set"),
    Col("tp", "TP"),
    Col("pp", "PP"),
    Col("dp", "DP"),
    Col("zero_stage", "ZeRO"),
    Col("gpus_used", "GPUs"),
    Col("per_gpu_bytes", "rule's mem", _gb),
    # jaxscale's model applied to the rule's layout
    Col("jaxscale_model", "recompute", lambda m: _yes(m["layout"]["recompute"])),
    Col("jaxscale_model", "mem/GPU", lambda m: _gb(m["memory"]["total"])),
    Col("jaxscale_model", "fits", lambda m: _yes(m["fits"])),
    Col("jaxscale_model", "step", lambda m: _s(m["step_s"])),
]
_SEED002_COLS = [
    Col("tp", "TP"),
    Col("pp", "PP"),
    Col("dp", "DP"),
    Col("memory_per_gpu_gb", "mem/GPU", _in_gb(1)),
    Col("fits", "fits", _yes),
    Col("tp_comm_gb", "TP comm", _in_gb(2)),
    Col("pp_comm_gb", "PP comm", _in_gb(2)),
    Col("dp_comm_gb", "DP comm", _in_gb(2)),
]
_MEMORY_COLS = [Col("state", "state"), Col("bytes", "per GPU", _gb)]
_COMM_COLS = [
    Col("kind", "kind"),
    Col("bytes_per_gpu", "volume", _gb),
    Col("inter_node", "link", lambda x: "InfiniBand" if x else "NVLink"),
    Col("seconds", "time", _s),
]
_ALT_COLS = [
    Col("label", "layout"),
    Col("memory", "mem/GPU", lambda m: _gb(m["total"])),
    Col("step_s", "step (est.)", _s),
]


def render(advice: AdviceReport, top: int = 5, *, seed002_table: bool = False) -> Report:
    """The --json object (records) and the text tables rendered from those records."""
    w, hw, best, s2 = advice.workload, advice.hardware, advice.best, advice.seed002
    mode = "seed-faithful" if s2.seed_faithful else "corrected"
    rec = _cost(best)
    out = Report(
        "advise",
        workload=_record(w),
        hardware=_record(hw),
        hidden=advice.hidden,
        layers=advice.layers,
        seed002_mode=mode,
        rules=[{**_record(rc.advice), "jaxscale_model": _cost(rc.cost)} for rc in advice.rules],
        recommendation=rec,
        alternatives=[_cost(c) for c in advice.ranked[1 : top + 1]],
        layouts_considered=advice.layouts_considered,
        layouts_fitting=len(advice.ranked),
        reasoning=list(advice.reasoning),
        seed002=_record(s2),
        context=_record(advice.context),
    )
    derived = "" if w.hidden and w.layers else ", derived"
    moe = f", MoE {w.num_experts} experts top-{w.top_k}" if w.is_moe else ""
    nodes = -(-hw.num_gpus // hw.gpus_per_node)
    out.say(
        f"jaxscale advise: {w.n_params / 1e9:.1f}B params (hidden {advice.hidden},"
        f" {advice.layers} layers{derived}{moe})",
        f"  {hw.num_gpus} GPUs x {hw.gpu_memory_bytes / GB:g} GB in {nodes} node(s) of"
        f" {hw.gpus_per_node}; batch {w.batch} x {w.seq} tokens, micro-batch {w.micro_batch}",
        f"  seed 002 calculator: {mode} mode"
        + ("" if s2.seed_faithful else " (--seed-faithful reproduces its printout)"),
        "",
        "Rule sets side by side (last four columns: jaxscale's model applied to that layout)",
    )
    own, rules = "jaxscale (analytic)", out.data["rules"]  # last row: the recommendation
    if rec:
        rules = [
            *rules,
            {"rule": own, **rec["layout"], "gpus_used": best.layout.gpus, "jaxscale_model": rec},
        ]
    none_fits = [] if rec else [[own, *["-"] * 7, "nothing fits", "-", "-"]]
    out.say(_table(_RULE_COLS, rules, none_fits), "")
    for a in (rc.advice for rc in advice.rules):
        for line in [a.strategy + (f" -- {a.reason}" if a.reason else ""), *a.notes]:
            out.say(f"  {a.rule}: {line}")
        if a.error:
            out.say(f"  {a.rule}: the seed's code raises {a.error}")
    if seed002_table:
        out.say("", *_seed002_lines(s2, mode, out.data["seed002"]["rows"]))
    out.say("", "Recommendation: " + (best.layout.label() if best else "none fits"))
    out.say(*(f"  - {line}" for line in advice.reasoning))
    if best is None:
        return out
    memory = {
        k: rec["memory"][k]
        for k in ("weights", "gradients", "optimizer", "master", "activations", "total")
    }
    memory.update(usable=hw.usable_bytes, GPU=hw.gpu_memory_bytes)
    memory = [{"state": k, "bytes": v} for k, v in memory.items()]
    bubble_s = best.compute_s / (1 - best.bubble_fraction) - best.compute_s
    totals = [
        ["bubble", f"{best.bubble_fraction:.1%}", "-", _s(bubble_s)],
        ["compute", "-", "-", _s(best.compute_s)],
        ["step (est.)", "-", "-", _s(best.step_s)],
    ]
    out.say(
        "",
        "Per-GPU memory",
        _table(_MEMORY_COLS, memory),
        "",
        "Communication per step (per GPU, no overlap assumed)",
        _table(_COMM_COLS, rec["comms"], totals),
    )
    if top and len(advice.ranked) > 1:
        out.say("", "Alternatives that fit", _table(_ALT_COLS, out.data["alternatives"]))
    return out


def _seed002_lines(r, mode: str, rows: list[dict]) -> list[str]:
    head = (
        f"seed 002 strategy calculator ({mode}): {r.param_count / 1e9:.1f}B params; params"
        f" {r.params_gb:.1f} GB, gradients {r.grads_gb:.1f} GB, optimizer {r.optimizer_gb:.1f} GB,"
        f" total {r.total_gb:.1f} GB"
    )
    if r.error:
        return [head, f"  the seed's code raises {r.error}"]
    b = r.best
    tail = (
        f"recommends TP={b.tp} PP={b.pp} DP={b.dp}: {b.memory_per_gpu_gb:.1f} GB per GPU,"
        f" {b.total_comm_gb:.2f} GB per step"
        if b
        else "no configuration fits in memory"
    )
    table = _table(_SEED002_COLS, rows, label_column=False)
    return [head, table, *[f"  skipped {s}" for s in r.skipped], tail]
