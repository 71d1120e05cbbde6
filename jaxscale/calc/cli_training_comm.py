"""`jaxscale calc comm`: TP all-reduces, FSDP/ZeRO traffic, the ZeRO volume table, tp_mlp.

Sources: shared/seeds/001_*.txt §7 (L737-884), shared/seeds/002_*.txt L3316-3326 and L4980-5050.
"""

from jaxscale.calc import training_comm as tc
from jaxscale.calc.training_format import (
    add_output_flags,
    emit,
    format_count,
    format_table,
    guarded,
    mode_line,
    parse_count,
    positive_int,
)

FAITHFUL_WHAT = (
    "seed 001's link speeds (IB 400, Ethernet 100 'GB/s'), its 2x all-reduce factor and its "
    "ZeRO-2/3 collectives"
)
STAGE_NAMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
KB = 1024  # the tp_mlp script prints KB as 1024 bytes (002 L4998)


def add_parser(calc_sub) -> None:
    p = calc_sub.add_parser(
        "comm",
        help="training communication: TP all-reduce, FSDP/ZeRO per stage, tp_mlp volumes",
        description="Per-GPU communication of TP and ZeRO/FSDP (seed 001 §7), seed 002's DDP/ZeRO "
        "volume table and its tp_mlp analysis.",
    )
    g = p.add_argument_group("tensor parallelism (seed 001 defaults: LLaMA-2-70B, TP=8)")
    g.add_argument("--d-model", type=positive_int, default=8192)
    g.add_argument("--tp", type=positive_int, default=8)
    g.add_argument("--batch", type=positive_int, default=4)
    g.add_argument("--seq", type=positive_int, default=2048)
    g = p.add_argument_group("FSDP/ZeRO (seed 001 defaults: 70B, 80 layers, DP=64 on InfiniBand)")
    g.add_argument("--params", type=parse_count, default=70e9)
    g.add_argument("--layers", type=positive_int, default=80)
    g.add_argument("--dp", type=positive_int, default=64)
    g.add_argument("--link", choices=tuple(tc.SEED_LINKS), default="infiniband")
    g = p.add_argument_group("tp_mlp.py analysis (seed 002 defaults: -H 64 -b 4 -s 16 -t 4)")
    g.add_argument("--hidden", type=positive_int, default=64)
    g.add_argument("--mlp-batch", type=positive_int, default=4)
    g.add_argument("--mlp-seq", type=positive_int, default=16)
    g.add_argument("--mlp-tp", type=positive_int, default=4)
    g.add_argument("--scaling-hidden", type=positive_int, default=4096, help="MLP params example")
    g.add_argument("--scaling-tp", type=positive_int, default=8, help="MLP params example")
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    faithful = args.seed_faithful
    links = tc.links(faithful)
    lines = [mode_line(faithful, FAITHFUL_WHAT), ""]
    report = {"command": "comm", "mode": "seed-faithful" if faithful else "corrected"}

    # Tensor parallelism, forward: all-reduce after attention and after the MLP.
    tp_rows, tp_json = [], []
    for key in ("nvlink", "infiniband"):
        link = links[key]
        r = tc.tp_layer_comm(
            args.d_model, args.tp, args.batch, args.seq, link, seed_faithful=faithful
        )
        tp_rows.append(
            [f"{link.name} ({link.bandwidth_gb_s:g} GB/s)", f"{r.allreduce_ms:.2f}"]
            + [f"{r.allreduce_ms:.2f}", f"{r.per_layer_ms:.2f}", f"{r.per_layer_bytes / 1e9:.3f}"]
        )
        tp_json.append({"link": link.name, "bandwidth_gb_s": link.bandwidth_gb_s})
        tp_json[-1].update(allreduce_ms=r.allreduce_ms, per_layer_ms=r.per_layer_ms)
        tp_json[-1].update(per_layer_bytes=r.per_layer_bytes)
    lines += [
        f"Tensor parallel, per layer forward (d_model={args.d_model}, TP={args.tp}, "
        f"batch={args.batch}, seq={args.seq}, bf16)",
        format_table(
            ["Link", "Attn all-reduce ms", "MLP all-reduce ms", "Per layer ms", "GB/layer"],
            tp_rows,
        ),
        "The backward pass adds two more all-reduces per layer. Keep TP inside a node.",
        "",
    ]
    report["tensor_parallel"] = tp_json

    link = links[args.link]
    z_rows, z_json = [], []
    for stage in range(4):
        z = tc.zero_step_comm(
            args.params, args.layers, args.dp, stage, link, seed_faithful=faithful
        )
        z_rows.append(
            [STAGE_NAMES[stage], z.collectives, f"{z.bytes_per_gpu / 1e9:.1f}"]
            + [f"{z.step_ms:.2f}", f"{z.per_layer_ms:.2f}"]
        )
        z_json.append({"zero_stage": stage, "collectives": z.collectives})
        z_json[-1].update(bytes_per_gpu=z.bytes_per_gpu, step_ms=z.step_ms)
    lines += [
        f"FSDP/ZeRO per step: {format_count(args.params)} params (bf16 grads), {args.layers} "
        f"layers, DP={args.dp} over {link.name} ({link.bandwidth_gb_s:g} GB/s)",
        format_table(["Stage", "Collectives", "GB/GPU", "Step ms", "Per layer ms"], z_rows),
        "",
    ]
    report["zero"] = z_json

    vol = tc.zero_volume_table()
    model_gb = args.params * 2 / 1e9
    v_rows = [
        [STAGE_NAMES[r.stage], f"{r.forward_d:g}D", f"{r.backward_d:g}D", f"{r.optimizer_d:g}D"]
        + [f"{r.total_d:g}D", f"{r.total_d * model_gb:,.0f}", f"{r.total_d / vol[0].total_d:.1f}x"]
        + [f"{r.paper_total_d:g}D"]
        for r in vol
    ]
    lines += [
        f"DDP/ZeRO volume per GPU, D = model size (shared/seeds/002 L3318-3322; "
        f"GB for {format_count(args.params)} params in bf16)",
        format_table(
            ["Strategy", "Forward", "Backward", "Optimizer", "Total", "GB", "vs DDP", "ZeRO paper"],
            v_rows,
        ),
        f"ZeRO-3 moves {vol[3].total_d / vol[0].total_d:.1f}x DDP's volume by this table "
        "(the seed's prose, L3326, says 3x; the ZeRO paper's accounting gives 1.5x).",
        "",
    ]
    report["zero_volume_d"] = [
        {"strategy": STAGE_NAMES[r.stage], "forward": r.forward_d, "backward": r.backward_d}
        | {"optimizer": r.optimizer_d, "total": r.total_d, "paper_total": r.paper_total_d}
        for r in vol
    ]

    m = tc.tp_mlp_comm(args.hidden, args.mlp_batch, args.mlp_seq, args.mlp_tp)
    full = tc.mlp_params_per_gpu(args.scaling_hidden)
    split = tc.mlp_params_per_gpu(args.scaling_hidden, args.scaling_tp)
    lines += [
        f"tp_mlp.py analysis (H={args.hidden}, batch={args.mlp_batch}, seq={args.mlp_seq}, "
        f"TP={args.mlp_tp}, fp32; shared/seeds/002 L4980-5019)",
        "  All-reduce calls per forward: 1",
        f"  Elements per all-reduce:      {m.elements_per_allreduce:,}",
        f"  Bytes per all-reduce:         {m.bytes_per_allreduce / KB:.1f} KB",
        f"  Ring volume per GPU:          {m.ring_bytes_per_gpu / KB:.1f} KB",
        f"  Ring volume, all GPUs:        {m.ring_bytes_total / KB:.1f} KB",
        f"  Per layer, fwd + bwd (4 all-reduces): {m.layer_fwd_bwd_bytes_per_gpu / KB:.1f} KB/GPU",
        f"MLP parameters, H={args.scaling_hidden}: 8H^2 = {full / 1e6:,.2f}M "
        f"({full * 4 / 1e6:,.1f} MB fp32) -> TP={args.scaling_tp}: {split / 1e6:,.2f}M "
        f"({split * 4 / 1e6:,.1f} MB per GPU)",
    ]
    report["tp_mlp"] = {
        "elements_per_allreduce": m.elements_per_allreduce,
        "bytes_per_allreduce": m.bytes_per_allreduce,
        "ring_bytes_per_gpu": m.ring_bytes_per_gpu,
        "ring_bytes_total": m.ring_bytes_total,
        "mlp_params": full,
        "mlp_params_per_gpu": split,
    }
    emit(args, report, lines)
    return 0
