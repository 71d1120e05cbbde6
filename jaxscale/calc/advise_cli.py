"""`jaxscale advise`: recommend data / ZeRO / tensor / pipeline / expert degrees, beside the four
seed rule sets (seed 000 exercise 4, seed 001, seed 002 ch7 calculator, seed 004). Imports no jax.

    jaxscale advise --params 70e9 --gpus 64 --gpu-mem 80 [--gpus-per-node 8 --seq 4096 --batch 512]
"""

import argparse
import json
from dataclasses import asdict

from jaxscale.calc.advisor import RECOMPUTE_CHOICES, AdviceReport, advise
from jaxscale.calc.advisor_model import (
    ASSUMED_MFU,
    INTER_NODE_BYTES_PER_S,
    INTRA_NODE_BYTES_PER_S,
    PEAK_FLOPS,
    USABLE_FRACTION,
    Hardware,
    LayoutCost,
    Workload,
)

GB = 1e9
_LINKS = {False: "NVLink", True: "InfiniBand"}
MIN_PARAMS = 1e6  # below this, --params was almost surely given in billions (the seed's unit)
_PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # weights and gradients (S3 L334 "precision")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "advise",
        help="recommend a TP x PP x DP (x EP) layout and ZeRO stage; seed rule sets side by side",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("--params", type=float, default=70e9, help="parameter count, all experts included (70e9)")
    a("--gpus", type=int, default=64, help="number of GPUs (64)")
    a("--gpu-mem", type=float, default=80, help="memory per GPU in GB (80)")
    a("--gpus-per-node", type=int, default=8, help="GPUs per node sharing NVLink (8)")
    a("--seq", type=int, default=4096, help="tokens per sequence (4096)")
    a("--batch", type=int, default=512, help="global batch in sequences per step (512)")
    a("--micro-batch", type=int, default=1, help="sequences per forward pass per GPU (1)")
    a("--hidden", type=int, default=0, help="model width; 0 derives it from --params")
    a("--layers", type=int, default=0, help="number of layers; 0 derives it from --params")
    a("--moe", action="store_true", help="mixture of experts: also choose an expert degree")
    a("--num-experts", type=int, default=64, help="experts per MoE layer (64)")
    a("--top-k", type=int, default=2, help="experts per token (2)")
    a("--precision", choices=sorted(_PRECISION_BYTES), default="bf16", help="weights/grads (bf16)")
    a("--master-weights", action="store_true", help="keep an fp32 master copy (+4 B/param)")
    a("--recompute", choices=list(RECOMPUTE_CHOICES), default="auto",
      help="full activation recomputation: auto lets the ranking decide (auto)")  # fmt: skip
    a("--headroom", type=float, default=1 - USABLE_FRACTION, help="memory kept free (0.1)")
    a("--intra-node-gbs", type=float, default=INTRA_NODE_BYTES_PER_S / GB,
      help="NVLink GB/s per GPU, one direction (450)")  # fmt: skip
    a("--inter-node-gbs", type=float, default=INTER_NODE_BYTES_PER_S / GB,
      help="InfiniBand GB/s per GPU (50)")  # fmt: skip
    a("--peak-tflops", type=float, default=PEAK_FLOPS / 1e12, help="peak TFLOP/s per GPU (989)")
    a("--mfu", type=float, default=ASSUMED_MFU, help="assumed fraction of peak achieved (0.4)")
    a("--top", type=int, default=5, help="alternative layouts to list (5)")
    a("--seed002-table", action="store_true", help="print seed 002's strategy comparison table")
    a("--seed-faithful", action="store_true",
      help="seed 002 calculator as the seed prints it (defect 6), with its table")  # fmt: skip
    a("--json", action="store_true", help="print one JSON object")
    a("--validate", action="store_true",
      help="scale the recommended layout down to the simulated devices, compile it, and compare "
      "its memory and collectives with the predictions (imports jax)")  # fmt: skip
    p.set_defaults(func=lambda args: _run(args, p))


_POSITIVE_FLAGS = ("gpus", "gpu_mem", "gpus_per_node", "seq", "batch", "micro_batch", "num_experts",
                   "top_k", "intra_node_gbs", "inter_node_gbs", "peak_tflops", "mfu")  # fmt: skip


def _inputs(args) -> tuple[Workload, Hardware]:
    for name in _POSITIVE_FLAGS:
        if not getattr(args, name) > 0:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be > 0, got {getattr(args, name):g}")
    if args.params < MIN_PARAMS:
        raise ValueError(f"--params {args.params:g} is a parameter count (e.g. 70e9), not billions")
    if not 0 <= args.headroom < 1:
        raise ValueError(f"--headroom must be in [0, 1), got {args.headroom}")
    if args.top < 0:
        raise ValueError(f"--top must be >= 0, got {args.top}")
    state_bytes = _PRECISION_BYTES[args.precision]
    workload = Workload(
        n_params=args.params, seq=args.seq, batch=args.batch, micro_batch=args.micro_batch,
        hidden=args.hidden, layers=args.layers, num_experts=args.num_experts if args.moe else 1,
        top_k=args.top_k if args.moe else 1, weight_bytes=state_bytes, grad_bytes=state_bytes,
        master_bytes=4 if args.master_weights else 0,
    )  # fmt: skip
    for name in ("hidden", "layers"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name} must be >= 0 (0 derives it), got {getattr(args, name)}")
    hardware = Hardware(
        num_gpus=args.gpus, gpu_memory_bytes=args.gpu_mem * GB, gpus_per_node=args.gpus_per_node,
        intra_node_bytes_per_s=args.intra_node_gbs * GB,
        inter_node_bytes_per_s=args.inter_node_gbs * GB, peak_flops=args.peak_tflops * 1e12,
        assumed_mfu=args.mfu, usable_fraction=1 - args.headroom,
    )  # fmt: skip
    return workload, hardware


def _run(args, parser: argparse.ArgumentParser) -> int:
    try:
        workload, hardware = _inputs(args)
        report = advise(
            workload, hardware, recompute=args.recompute, seed_faithful=args.seed_faithful
        )
    except ValueError as err:
        parser.error(str(err))  # one line on stderr, exit code 2
    if args.json:
        print(json.dumps(report_json(report, args.top), indent=1))
    else:
        print(render(report, args.top, seed002_table=args.seed002_table or args.seed_faithful))
    if args.validate:
        if report.best is None:
            parser.error("--validate: no layout fits, nothing to validate")
        # jax only here: the advisor itself stays instant
        from jaxscale.bench.validate_layout import validate

        lay = report.best.layout
        lines, ok = validate(lay.tp, lay.pp, lay.dp, lay.zero_stage)
        print("\n" + "\n".join(lines))
        return 0 if ok else 1
    return 0


# --- output ---------------------------------------------------------------------------------------


def format_table(header: list[str], rows: list[list[str]], *, label_column: bool = True) -> str:
    """Right-aligned columns; the first is left-aligned when it holds labels."""
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        aligned = (
            c.ljust(w) if i == 0 and label_column else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        return "  ".join(aligned).rstrip()

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x / GB:.1f} GB"


def _opt(x) -> str:
    return "-" if x is None else str(x)


def _cost_cells(cost: LayoutCost | None) -> list[str]:
    if cost is None:
        return ["-"] * 4
    recompute = "yes" if cost.layout.recompute else "no"
    fits = "yes" if cost.fits else "no"
    return [recompute, _gb(cost.memory.total), fits, f"{cost.step_s:.2f} s"]


def render(report: AdviceReport, top: int = 5, *, seed002_table: bool = False) -> str:
    w, hw, best = report.workload, report.hardware, report.best
    derived = "" if w.hidden and w.layers else ", derived"
    nodes = -(-hw.num_gpus // hw.gpus_per_node)
    moe = f", MoE {w.num_experts} experts top-{w.top_k}" if w.is_moe else ""
    mode = "seed-faithful" if report.seed002.seed_faithful else "corrected"
    out = [
        f"jaxscale advise: {w.n_params / 1e9:.1f}B params (hidden {report.hidden},"
        f" {report.layers} layers{derived}{moe})",
        f"  {hw.num_gpus} GPUs x {hw.gpu_memory_bytes / GB:g} GB in {nodes} node(s) of"
        f" {hw.gpus_per_node}; batch {w.batch} x {w.seq} tokens, micro-batch {w.micro_batch}",
        f"  seed 002 calculator: {mode} mode"
        + ("" if report.seed002.seed_faithful else " (--seed-faithful reproduces its printout)"),
        "",
        "Rule sets side by side (last four columns: jaxscale's model applied to that layout)",
    ]
    rows = []
    for rc in report.rules:
        a = rc.advice
        rows.append(
            [a.rule, _opt(a.tp), _opt(a.pp), _opt(a.dp), _opt(a.zero_stage), _opt(a.gpus_used),
             _gb(a.per_gpu_bytes), *_cost_cells(rc.cost)]
        )  # fmt: skip
    if best:
        lay = best.layout
        rows.append(
            ["jaxscale (analytic)", str(lay.tp), str(lay.pp), str(lay.dp), str(lay.zero_stage),
             str(lay.gpus), "-", *_cost_cells(best)]
        )  # fmt: skip
    else:
        rows.append(["jaxscale (analytic)", *["-"] * 7, "nothing fits", "-", "-"])
    header = ["rule set", "TP", "PP", "DP", "ZeRO", "GPUs", "rule's mem", "recompute", "mem/GPU",
              "fits", "step"]  # fmt: skip
    out += [format_table(header, rows), ""]
    for rc in report.rules:
        a = rc.advice
        for line in [a.strategy + (f" -- {a.reason}" if a.reason else ""), *a.notes]:
            out.append(f"  {a.rule}: {line}")
        if a.error:
            out.append(f"  {a.rule}: the seed's code raises {a.error}")
    if seed002_table:
        out += ["", _seed002_table(report)]
    out += ["", *_recommendation(report, top)]
    return "\n".join(out)


def _recommendation(report: AdviceReport, top: int) -> list[str]:
    best, hw = report.best, report.hardware
    out = ["Recommendation: " + (best.layout.label() if best else "none fits")]
    out += [f"  - {line}" for line in report.reasoning]
    if best is None:
        return out
    m = best.memory
    parts = {"weights": m.weights, "gradients": m.gradients, "optimizer": m.optimizer,
             "master": m.master, "activations": m.activations, "total": m.total,
             "usable": hw.usable_bytes, "GPU": hw.gpu_memory_bytes}  # fmt: skip
    mem_rows = [[k, _gb(v)] for k, v in parts.items()]
    out += ["", "Per-GPU memory", format_table(["state", "per GPU"], mem_rows), ""]
    comm_rows = [
        [c.kind, _gb(c.bytes_per_gpu), _LINKS[c.inter_node], f"{c.seconds:.2f} s"]
        for c in best.comms
    ]
    bubble_s = best.compute_s / (1 - best.bubble_fraction) - best.compute_s
    comm_rows += [
        ["bubble", f"{best.bubble_fraction:.1%}", "-", f"{bubble_s:.2f} s"],
        ["compute", "-", "-", f"{best.compute_s:.2f} s"],
        ["step (est.)", "-", "-", f"{best.step_s:.2f} s"],
    ]
    out += ["Communication per step (per GPU, no overlap assumed)"]
    out += [format_table(["kind", "volume", "link", "time"], comm_rows)]
    if top and len(report.ranked) > 1:
        alt = [[c.layout.label(), _gb(c.memory.total), f"{c.step_s:.2f} s"]
               for c in report.ranked[1 : top + 1]]  # fmt: skip
        out += [
            "",
            "Alternatives that fit",
            format_table(["layout", "mem/GPU", "step (est.)"], alt),
        ]
    return out


def _seed002_table(report: AdviceReport) -> str:
    r = report.seed002
    mode = "seed-faithful" if r.seed_faithful else "corrected"
    head = [
        f"seed 002 strategy calculator ({mode}): {r.param_count / 1e9:.1f}B params; params"
        f" {r.params_gb:.1f} GB, gradients {r.grads_gb:.1f} GB, optimizer {r.optimizer_gb:.1f} GB,"
        f" total {r.total_gb:.1f} GB"
    ]
    if r.error:
        return "\n".join([*head, f"  the seed's code raises {r.error}"])
    rows = [
        [str(x.tp), str(x.pp), str(x.dp), f"{x.memory_per_gpu_gb:.1f} GB",
         "yes" if x.fits else "no", f"{x.tp_comm_gb:.2f} GB", f"{x.pp_comm_gb:.2f} GB",
         f"{x.dp_comm_gb:.2f} GB"]
        for x in r.rows
    ]  # fmt: skip
    header = ["TP", "PP", "DP", "mem/GPU", "fits", "TP comm", "PP comm", "DP comm"]
    table = format_table(header, rows, label_column=False)
    b = r.best
    tail = (
        f"recommends TP={b.tp} PP={b.pp} DP={b.dp}: {b.memory_per_gpu_gb:.1f} GB per GPU,"
        f" {b.total_comm_gb:.2f} GB per step"
        if b
        else "no configuration fits in memory"
    )
    return "\n".join([*head, table, *[f"  skipped {s}" for s in r.skipped], tail])


def _cost_json(cost: LayoutCost | None) -> dict | None:
    if cost is None:
        return None
    d = asdict(cost)
    d["memory"]["total"] = cost.memory.total
    d["comm_s"] = cost.comm_s
    d["label"] = cost.layout.label()
    return d


def report_json(report: AdviceReport, top: int = 5) -> dict:
    rules = []
    for rc in report.rules:
        d = asdict(rc.advice)
        d["gpus_used"] = rc.advice.gpus_used
        d["jaxscale_model"] = _cost_json(rc.cost)
        rules.append(d)
    seed002 = asdict(report.seed002)
    seed002["total_gb"] = report.seed002.total_gb
    for row, obj in zip(seed002["rows"], report.seed002.rows, strict=True):
        row["memory_per_gpu_gb"] = obj.memory_per_gpu_gb
        row["total_comm_gb"] = obj.total_comm_gb
    return {
        "workload": asdict(report.workload),
        "hardware": asdict(report.hardware),
        "hidden": report.hidden,
        "layers": report.layers,
        "seed002_mode": "seed-faithful" if report.seed002.seed_faithful else "corrected",
        "rules": rules,
        "recommendation": _cost_json(report.best),
        "alternatives": [_cost_json(c) for c in report.ranked[1 : top + 1]],
        "layouts_considered": report.layouts_considered,
        "layouts_fitting": len(report.ranked),
        "reasoning": list(report.reasoning),
        "seed002": seed002,
    }
