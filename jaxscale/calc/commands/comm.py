"""`jaxscale calc comm`: TP all-reduces, FSDP/ZeRO traffic, the ZeRO volume table, tp_mlp, and
with --cp the context-parallel forms' attention collectives.

Sources: seed 001 §7 "Communication Patterns", seed 002 ch5 "Communication Volume Comparison"
and ch6 tp_mlp.py (`analyze_communication`, `compare_scaling`); for context parallelism seed 001
§6-§7 (CP, the all-gather it uses), the scaling book's note on context parallelism (ring
attention), DeepSpeed-Ulysses (4 all-to-alls per layer) and the Llama 3 paper (all-gather CP):
the formulas are `calc/context.py`'s.
"""

from jaxscale.calc import training_comm as tc
from jaxscale.calc.commands import context_tables
from jaxscale.checks import at_most
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    guarded,
    hidden_alias,
    parse_count,
    positive_int,
)
from jaxscale.render import Col, Report, fmt_count

FAITHFUL_WHAT = (
    "seed 001's link speeds (IB 400, Ethernet 100 'GB/s'), its 2x all-reduce factor and its "
    "ZeRO-2/3 collectives"
)
STAGE_NAMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
KB = 1024  # the tp_mlp script prints KB as 1024 bytes
MAX_LAYERS = 1_000_000


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "comm",
        help="training communication: TP all-reduce, FSDP/ZeRO per stage, tp_mlp volumes",
        description="Per-GPU communication of TP and ZeRO/FSDP (seed 001 §7), seed 002's DDP/ZeRO "
        "volume table and its tp_mlp analysis.",
        example="jaxscale calc comm --d-model 4096 --tp 4 --params 7B --layers 32 --dp 16",
    )
    g = p.add_argument_group("tensor parallelism (seed 001 defaults: LLaMA-2-70B, TP=8)")
    g.add_argument("--d-model", type=positive_int, default=8192, help="hidden size")
    g.add_argument("--tp", type=positive_int, default=8, help="tensor-parallel degree")
    _alias(g, "--batch-size", "--batch", 4, "sequences per step")
    _alias(g, "--seq-len", "--seq", 2048, "sequence length")
    g = p.add_argument_group("FSDP/ZeRO (seed 001 defaults: 70B, 80 layers, DP=64 on InfiniBand)")
    g.add_argument("--params", type=parse_count, default=70e9, help="parameter count")
    g.add_argument("--layers", type=positive_int, default=80, help="transformer layers")
    g.add_argument("--dp", type=positive_int, default=64, help="data-parallel degree")
    g.add_argument(
        "--link",
        choices=tuple(tc.SEED_LINKS),
        default="infiniband",
        help="the DP group's interconnect",
    )
    g = p.add_argument_group("tp_mlp.py analysis (seed 002 defaults: -H 64 -b 4 -s 16 -t 4)")
    _alias(g, "--mlp-d-model", "--hidden", 64, "hidden size H")
    _alias(g, "--mlp-batch-size", "--mlp-batch", 4, "sequences")
    _alias(g, "--mlp-seq-len", "--mlp-seq", 16, "sequence length")
    g.add_argument("--mlp-tp", type=positive_int, default=4, help="tensor-parallel degree")
    _alias(g, "--scaling-d-model", "--scaling-hidden", 4096, "hidden size, MLP params example")
    g.add_argument(
        "--scaling-tp",
        type=positive_int,
        default=8,
        help="tensor-parallel degree, MLP params example",
    )
    g = p.add_argument_group(
        "context parallelism (seed 001 §6-§7; ring attention, Llama 3's all-gather, "
        "DeepSpeed-Ulysses): the shape is the tensor-parallel group's --d-model, --tp, "
        "--batch-size and --seq-len, with --layers"
    )
    g.add_argument(
        "--cp",
        type=positive_int,
        default=1,
        help="context-parallel size: GPUs splitting each sequence (1: no CP table)",
    )
    g.add_argument("--heads", type=positive_int, default=64, help="query heads (LLaMA-2-70B's)")
    g.add_argument("--kv-heads", type=positive_int, default=8, help="key/value heads (GQA)")
    g.add_argument(
        "--cp-link", choices=tuple(tc.SEED_LINKS), default="nvlink", help="the CP group's link"
    )
    g.add_argument(
        "--remat",
        action="store_true",
        help="activation recomputation: the forward's collectives run again in the backward",
    )
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run))


def _alias(group, flag: str, old: str, default: int, help: str) -> None:
    """A positive-integer flag that also answers to its old spelling."""
    action = group.add_argument(flag, type=positive_int, default=default, help=help)
    hidden_alias(group, action, old)


ZERO_COLS = [
    Col("zero_stage", "Stage", STAGE_NAMES.__getitem__),
    Col("collectives", "Collectives"),
    Col("bytes_per_gpu", "GB/GPU", lambda b: f"{b / 1e9:.1f}"),
    Col("step_ms", "Step ms", ".2f"),
    Col("per_layer_ms", "Per layer ms", ".2f"),
]


def run(args) -> int:
    at_most(MAX_LAYERS, "layers", "ZeRO-3's collectives are timed per layer", layers=args.layers)
    faithful = args.seed_faithful
    links = tc.links(faithful)
    r = Report("comm").mode(faithful, FAITHFUL_WHAT).say("")

    # Tensor parallelism, forward: all-reduce after attention and after the MLP.
    tp_rows = []
    for link in (links["nvlink"], links["infiniband"]):
        t = tc.tp_layer_comm(
            args.d_model, args.tp, args.batch_size, args.seq_len, link, seed_faithful=faithful
        )
        tp_rows.append(
            {
                "link": link.name,
                "bandwidth_gb_s": link.bandwidth_gb_s,
                "allreduce_ms": t.allreduce_ms,
                "per_layer_ms": t.per_layer_ms,
                "per_layer_bytes": t.per_layer_bytes,
            }
        )
    bandwidth = {x["link"]: x["bandwidth_gb_s"] for x in tp_rows}
    r.say(
        f"Tensor parallel, per layer forward (d_model={args.d_model}, TP={args.tp}, "
        f"batch={args.batch_size}, seq={args.seq_len}, bf16)"
    )
    r.table(
        "tensor_parallel",
        [
            Col("link", "Link", lambda name: f"{name} ({bandwidth[name]:g} GB/s)"),
            Col("allreduce_ms", "Attn all-reduce ms", ".2f"),
            Col("allreduce_ms", "MLP all-reduce ms", ".2f"),
            Col("per_layer_ms", "Per layer ms", ".2f"),
            Col("per_layer_bytes", "GB/layer", lambda b: f"{b / 1e9:.3f}"),
        ],
        tp_rows,
    )
    r.say("The backward pass adds two more all-reduces per layer. Keep TP inside a node.", "")

    link = links[args.link]
    zero = [
        tc.zero_step_comm(args.params, args.layers, args.dp, stage, link, seed_faithful=faithful)
        for stage in range(4)
    ]
    r.say(
        f"FSDP/ZeRO per step: {fmt_count(args.params)} params (bf16 grads), {args.layers} "
        f"layers, DP={args.dp} over {link.name} ({link.bandwidth_gb_s:g} GB/s)"
    )
    r.table(
        "zero",
        ZERO_COLS,
        [
            {
                "zero_stage": z.stage,
                "collectives": z.collectives,
                "bytes_per_gpu": z.bytes_per_gpu,
                "step_ms": z.step_ms,
                "per_layer_ms": z.per_layer_ms,
            }
            for z in zero
        ],
    )
    r.say("")

    vol = tc.zero_volume_table()
    model_gb, ddp = args.params * 2 / 1e9, vol[0].total_d
    r.say(
        f"DDP/ZeRO volume per GPU, D = model size (seed 002 ch5; "
        f"GB for {fmt_count(args.params)} params in bf16)"
    )
    r.table(
        "zero_volume_d",
        [
            Col("strategy", "Strategy"),
            Col("forward", "Forward", _d),
            Col("backward", "Backward", _d),
            Col("optimizer", "Optimizer", _d),
            Col("total", "Total", _d),
            Col("total", "GB", lambda t: f"{t * model_gb:,.0f}"),
            Col("total", "vs DDP", lambda t: f"{t / ddp:.1f}x"),
            Col("paper_total", "ZeRO paper", _d),
        ],
        [
            {
                "strategy": STAGE_NAMES[v.stage],
                "forward": v.forward_d,
                "backward": v.backward_d,
                "optimizer": v.optimizer_d,
                "total": v.total_d,
                "paper_total": v.paper_total_d,
            }
            for v in vol
        ],
    )
    r.say(
        f"ZeRO-3 moves {vol[3].total_d / ddp:.1f}x DDP's volume by this table "
        "(the seed's prose says 3x; the ZeRO paper's accounting gives 1.5x).",
        "",
    )

    m = tc.tp_mlp_comm(args.mlp_d_model, args.mlp_batch_size, args.mlp_seq_len, args.mlp_tp)
    full = tc.mlp_params_per_gpu(args.scaling_d_model)
    split = tc.mlp_params_per_gpu(args.scaling_d_model, args.scaling_tp)
    r.say(
        f"tp_mlp.py analysis (H={args.mlp_d_model}, batch={args.mlp_batch_size}, "
        f"seq={args.mlp_seq_len}, TP={args.mlp_tp}, fp32; seed 002 ch6)",
        "  All-reduce calls per forward: 1",
        f"  Elements per all-reduce:      {m.elements_per_allreduce:,}",
        f"  Bytes per all-reduce:         {m.bytes_per_allreduce / KB:.1f} KB",
        f"  Ring volume per GPU:          {m.ring_bytes_per_gpu / KB:.1f} KB",
        f"  Ring volume, all GPUs:        {m.ring_bytes_total / KB:.1f} KB",
        f"  Per layer, fwd + bwd (4 all-reduces): {m.layer_fwd_bwd_bytes_per_gpu / KB:.1f} KB/GPU",
        f"MLP parameters, H={args.scaling_d_model}: 8H^2 = {full / 1e6:,.2f}M "
        f"({full * 4 / 1e6:,.1f} MB fp32) -> TP={args.scaling_tp}: {split / 1e6:,.2f}M "
        f"({split * 4 / 1e6:,.1f} MB per GPU)",
    )
    if args.cp > 1:
        context_tables.say_context(r, args, links[args.cp_link])
    r.put(
        tp_mlp={
            "elements_per_allreduce": m.elements_per_allreduce,
            "bytes_per_allreduce": m.bytes_per_allreduce,
            "ring_bytes_per_gpu": m.ring_bytes_per_gpu,
            "ring_bytes_total": m.ring_bytes_total,
            "mlp_params": full,
            "mlp_params_per_gpu": split,
        }
    )
    r.emit(args)
    return 0


def _d(x: float) -> str:
    """A volume in units of the model size D."""
    return f"{x:g}D"
