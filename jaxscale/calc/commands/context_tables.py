"""The context-parallel tables `jaxscale calc comm --cp N` and `jaxscale calc memory --cp N`
print: each form's attention collectives per layer and step, and each form's attention scores
per GPU (the formulas are calc/context.py's)."""

from __future__ import annotations

import math
from dataclasses import asdict

from jaxscale.calc import context
from jaxscale.calc import training_comm as tc
from jaxscale.render import Col, Report, fmt_bytes, fmt_count


def seq_len(args, seq: int) -> int:
    """The sequence length `calc memory` uses: --seq-len, else the model's, else 2048."""
    return args.seq_len or seq or 2048


CONTEXT_COLS = [
    Col("form", "Form"),
    Col("collectives", "Collectives/layer", lambda ops: ", ".join(ops)),
    Col("calls_per_layer", "Calls"),
    Col("census_bytes", "Census MB/layer", lambda b: f"{b / 1e6:,.2f}"),
    Col("sent_bytes", "Sent MB/layer", lambda b: f"{b / 1e6:,.2f}"),
    Col("step_bytes", "Sent GB/step", lambda b: f"{b / 1e9:,.2f}"),
    Col("step_ms", "Step ms", ".2f"),
    Col("note", "Note"),
]


def context_shape(args) -> context.ContextShape:
    if args.d_model % args.heads:
        raise ValueError(f"--heads {args.heads} does not divide --d-model {args.d_model}")
    if args.heads % args.kv_heads:
        raise ValueError(f"--kv-heads {args.kv_heads} does not divide --heads {args.heads}")
    return context.ContextShape(
        batch_local=args.batch_size,
        seq_len=args.seq_len,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        head_dim=args.d_model // args.heads,
        cp=args.cp,
        tp=args.tp,
        remat=args.remat,
    )


def _record(shape: context.ContextShape, form: str, layers: int, link) -> dict:
    """One form's row: per-layer census and wire bytes, the step's (x layers) and its time."""
    record = {"form": form, "collectives": context.CENSUS_OP[form]}
    try:
        census = context.layer_census(shape, form)
    except ValueError as err:  # Ulysses: heads that do not split over cp
        return {**record, "note": str(err)}
    calls = context.layer_collectives(shape, form)
    sent = context.wire_bytes(census, shape.cp)
    # one start-up latency per collective, the layer's bytes at the link's bandwidth
    layer_ms = (calls * link.latency_us * 1e-6 + sent / (link.bandwidth_gb_s * tc.GB)) * 1e3
    return {
        **record,
        "calls_per_layer": calls,
        "census": census,
        "census_bytes": sum(census.values()),
        "sent_bytes": sent,
        "step_bytes": layers * sent,
        "step_ms": layers * layer_ms,
        "note": "",
    }


def say_context(r: Report, args, link) -> None:
    """The CP table: each form's attention collectives per layer and per step (forward and
    backward), and the gradient all-reduce the axis adds."""
    shape = context_shape(args)
    rows = [_record(shape, form, args.layers, link) for form in context.FORMS]
    r.say(
        "",
        f"Context parallel, attention per layer and step, forward + backward (cp={args.cp}, "
        f"tp={args.tp}, batch={args.batch_size}, seq={args.seq_len}, {args.heads} heads, "
        f"{args.kv_heads} kv heads of {shape.head_dim}, bf16"
        + (", remat" if args.remat else "")
        + f"; {args.layers} layers over {link.name} at {link.bandwidth_gb_s:g} GB/s)",
        f"K/V block [B, T/cp, G/tp, K] = {shape.kv_block_bytes / 1e6:,.2f} MB",
    )
    r.table("context_parallel", CONTEXT_COLS, rows)
    grads = args.params / args.tp * 2  # bf16 gradients of this GPU's parameters
    ring_share = tc.ring_allreduce_factor(args.cp)
    r.say(
        "ring: 2(cp-1) K/V sends forward, 2(cp-1) again and 2cp of the f32 dK/dV backward; "
        "gather: all-gather of K and V, reduce-scatter of dK and dV; ulysses: 4 all-to-alls "
        "forward, 4 backward. Census MB counts as the compiled program's census does "
        "(all-gather output, reduce-scatter input).",
        f"Every parameter is whole on each CP GPU: its gradients are also all-reduced over the "
        f"cp group, {ring_share * grads / 1e9:.1f} GB/GPU per step "
        f"({fmt_count(args.params)} params / tp={args.tp}, bf16).",
        "",
    )
    r.put(
        context_parallel_shape={
            "kv_block_bytes": shape.kv_block_bytes,
            "q_block_bytes": shape.q_block_bytes,
            "grad_allreduce_bytes_per_gpu": ring_share * grads,
        }
    )


def scores(args, form, layers, seq, heads, tp, pp) -> context.AttentionScores:
    """One GPU's attention scores under `form` ("none": no context parallelism)."""
    if heads is None or layers is None:
        raise ValueError("attention scores with --params need --layers and --heads or --d-model")
    return context.attention_scores(
        form,
        batch=args.batch_size,
        seq_len=seq_len(args, seq),
        n_heads=heads,
        cp=1 if form == "none" else args.cp,
        n_layers=math.ceil(layers / pp),
        tp=tp,
        checkpointing=args.checkpointing,
    )


def _score_records(args, models, tp, pp) -> list[dict]:
    """Each model's scores per form beside the unsplit attention's (a form the heads refuse is
    a row with its reason)."""
    records = []
    for name, _, _, layers, seq, heads in models:
        if heads is None or layers is None:
            continue
        for form in ("none", *context.FORMS):
            try:
                s = scores(args, form, layers, seq, heads, tp, pp)
            except ValueError as err:
                records.append({"model": name, "form": form, "note": str(err)})
                continue
            records.append({"model": name, **asdict(s), "bytes": s.bytes, "note": ""})
    return records


SCORE_COLS = [
    Col("model", "Model"),
    Col("form", "Form"),
    Col("heads", "Heads"),
    Col("rows", "Block", lambda rows: f"{rows:,}"),
    Col("cols", "x keys", lambda cols: f"{cols:,}"),
    Col("layers_kept", "Layers kept"),
    Col("bytes", "Scores/GPU", fmt_bytes),
    Col("note", "Note"),
]


def say_scores(r: Report, args, models, tp: int, pp: int) -> None:
    records = _score_records(args, models, tp, pp)
    if not records:
        r.say("Attention scores: give --layers and --heads (or --d-model) with --params", "")
        return
    r.say(
        f"Attention scores per GPU at cp={args.cp} (f32, batch {args.batch_size}, tp={tp}; "
        "none = one GPU per sequence; the ring's backward recomputes its blocks, so it keeps "
        "one layer's)"
    )
    r.table("attention_scores", SCORE_COLS, records)
    r.say("")
