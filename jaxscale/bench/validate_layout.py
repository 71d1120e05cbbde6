"""`jaxscale advise --validate`: scale the advisor's layout down to the simulated mesh, compile it,
and compare the compiled program's memory and collectives with the predictions.

Scaling keeps what can be kept on 8 devices: the context degree and its form first when the layout
splits the sequence (a power of two, half the devices at most when there is a tensor degree to
keep; `manual:...+cp_ring` and the like on a `cp=` axis, zigzag), the tensor degree (a power of
two, at most what the context degree leaves), pipeline stages (a power of two, at most what those
leave; 1F1B with as many microbatches as each data shard has rows), the ZeRO stage, and data
parallelism over the remaining devices. A layout that splits the sequence is compiled without
pipeline stages: under a schedule the collectives are not predicted (they sit in its conditionals)
and its transfer check takes whole-sequence activations, so the context axis's bytes could not be
compared. The model is the tiny test model with as many kv heads as heads (so every tensor degree
up to 8 and Ulysses' head split over what is left divide) and as many layers as stages, at least 2;
its 32-token sequence splits into the zigzag's 2cp chunks for every cp up to 8.
"""

from __future__ import annotations

import jax

from jaxscale.analysis.compiled import compile_with_report
from jaxscale.bench import predict
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.parallel.compose import Strategy, build
from jaxscale.render import fmt_mark
from jaxscale.tolerances import MEMORY_RTOL

MiB = 1 << 20
CFG = ModelConfig(n_heads=8, n_kv_heads=8, unroll_layers=True)
TCFG = TrainConfig(global_batch=16, seq_len=32)


def _power_of_two_within(limit: int, room: int) -> int:
    """The largest power of two at most `limit` that divides `room`."""
    n = 1
    while n * 2 <= limit and room % (n * 2) == 0:
        n *= 2
    return n


def scaled_strategy(
    tp: int,
    pp: int,
    dp: int,
    zero_stage: int,
    n_devices: int,
    cp: int = 1,
    cp_form: str | None = None,
) -> tuple:
    """(Strategy, notes): the advisor's TPx CPx PPx DPx ZeRO-s layout on `n_devices` devices."""
    # the context axis first (what a CP layout is validated for), leaving a tensor axis room
    context = _power_of_two_within(min(cp, n_devices // 2 if tp > 1 else n_devices), n_devices)
    tensor = _power_of_two_within(tp, n_devices // context)
    # the pipeline before the data axis: stages are what the advisor's layout adds (none beside
    # a context axis, whose bytes are compared only outside a schedule)
    pipe = _power_of_two_within(pp if context == 1 else 1, n_devices // tensor // context)
    data = n_devices // tensor // context // pipe
    with_cp = f"CP{cp} -> context={context}, " if cp > 1 else ""
    notes = [
        f"TP{tp} -> tensor={tensor}, {with_cp}PP{pp} -> pipe={pipe}, DP{dp} -> data={data} "
        f"on {n_devices} devices"
    ]
    if context > 1 and pp > 1:
        notes.append("no pipe axis beside the context axis: its bytes are compared without one")
    axes = (("pp", pipe), ("dp", data), ("cp", context), ("tp", tensor))
    mesh = ",".join(f"{a}={n}" for a, n in axes if n > 1) or "dp=1"
    zero = zero_stage if data > 1 else 0  # a ZeRO group of one device shards nothing
    schedule = "1f1b" if pipe > 1 else None
    return Strategy(
        mesh,
        "manual",
        zero,
        "megatron" if tensor > 1 else None,
        schedule=schedule,
        microbatches=TCFG.global_batch // data if pipe > 1 else 1,
        context=cp_form if context > 1 else None,
    ), notes


def validate(
    tp: int, pp: int, dp: int, zero_stage: int, cp: int = 1, cp_form: str | None = None
) -> tuple[list[str], bool]:
    """Lines of a report, and whether every figure is within its tolerance."""
    strategy, notes = scaled_strategy(tp, pp, dp, zero_stage, jax.device_count(), cp, cp_form)
    cfg = CFG.replace(n_layers=max(CFG.n_layers, strategy.mesh.size("pipe")))
    built = build(strategy, cfg, TCFG)
    B, T = TCFG.global_batch, TCFG.seq_len
    with jax.set_mesh(built.mesh):
        _, report = compile_with_report(built.step, *built.abstract_args(B, T))
    layout, predicted = predict.layout_state(built), predict.predicted_state(built, cfg)
    rows = [
        ("params (layout)", layout.params, predicted.params),
        ("gradients (layout)", layout.grads, predicted.grads),
        ("Adam m, v (layout)", layout.optimizer, predicted.optimizer),
        (
            "arguments (memory_analysis)",
            report.memory.argument,
            predicted.params + predicted.optimizer + predict.batch_bytes(built, B, T),
        ),
    ]
    ok = True
    lines = [
        f"validation on {jax.device_count()} simulated devices: {built.label} "
        f"{strategy.mesh} (tiny model, {cfg.n_layers} layers)",
        *("  " + n for n in notes),
        f"  {'per device':<30} {'measured MiB':>12} {'predicted MiB':>13}",
    ]
    for name, m, p in rows:
        good = abs(m - p) <= MEMORY_RTOL * p
        ok &= good
        lines.append(f"  {name:<30} {m / MiB:12.4f} {p / MiB:13.4f}  {fmt_mark(good)}")
    comm_pred, why = built.predict_comm(cfg, B, T)
    measured_comm = {op: t.total_bytes for op, t in report.collective_totals().items()}
    if built.plan is not None:  # the schedule's transfers against 2 M (P-1) activations
        from jaxscale.bench import pipeline

        row = pipeline.measure(built, report, cfg, TCFG)
        good = row.permute_ok and row.bubble_ok
        ok &= good
        lines.append(
            f"  {'collective-permute bytes/step':<30} {row.permute_bytes / MiB:12.4f} "
            f"{row.permute_predicted / MiB:13.4f}  {fmt_mark(good)}  (one pipeline; "
            f"bubble {row.bubble:.1%} = (P-1)/(M+P-1))"
        )
    for op, (m, p, good) in predict.compare_comm(measured_comm, comm_pred or {}).items():
        if comm_pred is None:
            break
        ok &= good
        lines.append(
            f"  {op + ' bytes/step':<30} {m / MiB:12.4f} {p / MiB:13.4f}  {fmt_mark(good)}"
        )
    if why:
        lines.append(f"  collectives not predicted: {why}")
    return lines, ok
