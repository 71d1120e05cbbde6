"""`jaxscale advise --validate`: scale the advisor's layout down to the simulated mesh, compile it,
and compare the compiled program's memory and collectives with the predictions.

Scaling keeps what can be kept on 8 devices: the tensor degree (capped at 8, a power of two),
pipeline stages (a power of two, at most what the tensor degree leaves; 1F1B with as many
microbatches as each data shard has rows), the ZeRO stage, and data parallelism over the
remaining devices. The model is the tiny test model with as many kv heads as heads (so every
tensor degree up to 8 divides) and as many layers as stages, at least 2.
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


def scaled_strategy(tp: int, pp: int, dp: int, zero_stage: int, n_devices: int) -> tuple:
    """(Strategy, notes): the advisor's TPx PPx DPx ZeRO-s layout on `n_devices` devices."""
    tensor = 1
    while tensor * 2 <= min(tp, n_devices) and n_devices % (tensor * 2) == 0:
        tensor *= 2
    pipe = 1  # the pipeline before the data axis: stages are what the advisor's layout adds
    while pipe * 2 <= pp and (n_devices // tensor) % (pipe * 2) == 0:
        pipe *= 2
    data = n_devices // tensor // pipe
    notes = [
        f"TP{tp} -> tensor={tensor}, PP{pp} -> pipe={pipe}, DP{dp} -> data={data} on "
        f"{n_devices} devices"
    ]
    axes = (("pp", pipe), ("dp", data), ("tp", tensor))
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
    ), notes


def validate(tp: int, pp: int, dp: int, zero_stage: int) -> tuple[list[str], bool]:
    """Lines of a report, and whether every figure is within its tolerance."""
    strategy, notes = scaled_strategy(tp, pp, dp, zero_stage, jax.device_count())
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
