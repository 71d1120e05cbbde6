"""The bench's report: aligned tables on stdout, JSON and PNG charts under results/."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

from jaxscale import tolerances as tol
from jaxscale.bench.meshes import BenchRow
from jaxscale.render import figure, fmt_mark

MiB = 1 << 20
SHORT = {
    "all-reduce": "AR",
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-to-all": "A2A",
    "collective-permute": "CP",
    "ragged-all-to-all": "RA2A",
}


def _mp(measured: float, predicted: float) -> str:
    return f"{measured / MiB:.2f}/{predicted / MiB:.2f}"


def _flops(r: BenchRow) -> str:
    return f"{r.report.flops / 1e9:.2f}/{r.flops_analytic_per_device / 1e9:.2f}"


def memory_table(rows: list[BenchRow], ref_ms: float | None, mfu_lines: list[str] = ()) -> str:
    head = (
        f"{'strategy':<17} {'mesh':<17} {'comp s':>6} {'params MiB':>11} {'grads MiB':>11} "
        f"{'adam MiB':>11} {'args MiB':>11} {'temp MiB':>8} {'GFLOP/dev':>11} {'step ms*':>8} "
        f"{'|dloss|':>8} {'eq':>3} {'mem':>3}"
    )
    lines = [head, "-" * len(head)]
    steps = 1 + max((len(r.step_ms) for r in rows), default=0)  # the first step is untimed
    if ref_ms is not None:
        lines.append(
            f"{'reference':<17} {'1 device':<17} {'':>6} {'':>11} {'':>11} {'':>11} "
            f"{'':>11} {'':>8} {'':>11} {ref_ms:8.1f}"
        )
    for r in rows:
        if r.report is None:
            lines.append(f"{r.label:<17} {r.case.mesh:<17} skipped: {r.error}")
            continue
        m, p, mem = r.state_layout, r.state_predicted, r.report.memory
        dloss = "" if r.result is None else f"{r.result.traj_loss_err:8.1e}"
        lines.append(
            f"{r.label:<17} {r.case.mesh:<17} {r.report.compile_s:6.1f} "
            f"{_mp(m.params, p.params):>11} {_mp(m.grads, p.grads):>11} "
            f"{_mp(m.optimizer, p.optimizer):>11} {_mp(r.args_measured, r.args_predicted):>11} "
            f"{mem.temp / MiB:8.2f} {_flops(r):>11}"
            f" {r.step_ms_median:8.1f} {dloss:>8} {fmt_mark(r.equivalent):>3}"
            f" {fmt_mark(r.memory_ok):>3}"
        )
    lines += [
        "MiB columns, per device: params/grads/adam = the strategy's declared layout (the shard",
        "shapes of its state) / the ZeRO calculator (calc.memory); args = the compiled program's",
        "memory_analysis / params + adam + batch shard. mem ✓ when all four are within "
        f"{tol.MEMORY_RTOL:.0%}.",
        "GFLOP/dev: cost_analysis / analytic (3 x forward matmuls).",
        f"|dloss|: largest loss difference from the 1-device reference over {steps} steps "
        "with real",
        f"updates; eq ✓ when the losses and final parameters are within {tol.TRAJ_ATOL:g} and "
        "every step's",
        f"pre-clip gradient norm within {tol.TRAJ_NORM_RTOL:g} relative.",
        *mfu_lines,
    ]
    return "\n".join(lines)


def mfu_lines(rows: list[BenchRow], model_flops_per_step: float, device_kind: str) -> list[str]:
    """MFU per row where the device's peak FLOP/s is known (never on simulated CPU devices).
    Model FLOPs: 3 x forward matmuls with causal attention halved (jaxscale/model/counts.py)."""
    from jaxscale.devices import mfu

    out = []
    for r in rows:
        if not r.step_ms or r.devices == 0:
            continue
        value = mfu(model_flops_per_step / r.devices, r.step_ms_median / 1e3, device_kind)
        if value is not None:
            out.append(f"  MFU {r.label} {r.case.mesh}: {value:.1%}")
    return ["MFU (model FLOPs, causal attention halved, over peak bf16):", *out] if out else []


def comm_table(rows: list[BenchRow]) -> str:
    head = (
        f"{'strategy':<17} {'mesh':<17} {'ok':>3}  "
        "collectives per step, MiB/device measured/predicted"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.report is None:
            continue
        if r.comm_predicted is None:
            measured = " ".join(
                f"{SHORT.get(op, op)} {t.count}x {t.total_bytes / MiB:.2f}"
                for op, t in r.report.collective_totals().items()
            )
            lines.append(
                f"{r.label:<17} {r.case.mesh:<17} {'n/a':>3}  {measured or 'none'}"
                f"  ({r.comm_why_not})"
            )
            continue
        cells = " ".join(
            f"{SHORT.get(op, op)} {m / MiB:.3f}/{p / MiB:.3f}{'' if ok else '✗'}"
            for op, (m, p, ok) in r.comm.items()
        )
        lines.append(f"{r.label:<17} {r.case.mesh:<17} {fmt_mark(r.comm_ok):>3}  {cells}")
    lines += [
        f"ok ✓ when every op's bytes are within {tol.COMM_RTOL:.0%} of the axes' predictions "
        "(parallel/zero.py, tp.py). Bytes",
        "follow the census: all-reduce = operand, all-gather = output, reduce-scatter = input;",
        "CPU's all-reduce+slice (result used only as 1/N) is counted as reduce-scatter.",
    ]
    return "\n".join(lines)


def remat_lines(remat: dict) -> str:
    no, yes = remat["temp_no_remat"] / MiB, remat["temp_remat"] / MiB
    return (
        f"activation checkpointing (single device, {remat['n_layers']} layers): temporaries "
        f"{no:.1f} MiB without remat, {yes:.1f} MiB with per-block remat: ratio "
        f"{remat['measured_ratio']:.2f} (seed 004's sqrt(L) estimate: "
        f"{remat['seed004_sqrtL_ratio']:.2f}; every policy: 'jaxscale bench remat')"
    )


def cross_backend_table(cpu: list[BenchRow], tpu: list[BenchRow], target: str) -> str:
    lines = [f"collectives chosen per compiler (MiB/device, dtype): CPU vs {target}"]
    for c, t in zip(cpu, tpu, strict=True):
        if c.report is None or t.report is None:
            continue

        def cell(row):
            return " ".join(
                f"{SHORT.get(x.op, x.op)} {x.count}x{x.dtype} {x.total_bytes / MiB:.2f}"
                for x in _by_op_dtype(row)
            )

        lines.append(f"  {c.label:<17} {c.case.mesh:<17} CPU: {cell(c)}")
        est = t.report.optimal_seconds
        est_s = f"  est {est * 1e3:.3f} ms" if est is not None and est > 0 else ""
        lines.append(f"  {'':<17} {'':<17} TPU: {cell(t)}{est_s}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class _OpDtype:
    op: str
    dtype: str
    count: int
    total_bytes: float


def _by_op_dtype(row: BenchRow) -> list[_OpDtype]:
    from jaxscale.analysis import hlo

    acc: dict = {}
    for c in hlo.normalize(list(row.report.collectives)):
        n, b = acc.get((c.op, c.dtype), (0, 0.0))
        acc[(c.op, c.dtype)] = (n + c.trips, b + c.bytes_per_device * c.trips)
    return [_OpDtype(op, dt, n, b) for (op, dt), (n, b) in sorted(acc.items())]


def to_json(rows: list[BenchRow], env: dict, extra: dict | None = None) -> dict:
    out = []
    for r in rows:
        s = r.case.strategy
        item = {
            "label": r.label or r.case.label,
            "path": s.path,
            "mesh": str(s.mesh),
            "stage": s.zero,
            "tp_mode": s.tensor,
            "devices": r.devices,
            "error": r.error,
        }
        if r.report is not None:
            item |= {
                "compile_s": r.report.compile_s,
                "memory": r.report.memory.as_dict(),
                "state_layout": dataclasses.asdict(r.state_layout),
                "state_predicted": dataclasses.asdict(r.state_predicted),
                "args_predicted": r.args_predicted,
                "memory_ok": r.memory_ok,
                "flops_per_device": r.report.flops,
                "flops_analytic_per_device": r.flops_analytic_per_device,
                "collectives": {
                    op: {"measured": m, "predicted": p, "ok": ok}
                    for op, (m, p, ok) in r.comm.items()
                },
                "comm_ok": r.comm_ok,
                "comm_why_not": r.comm_why_not,
                "optimal_seconds": r.report.optimal_seconds,
                "equivalence": None
                if r.result is None
                else {
                    k: getattr(r.result, k)
                    for k in (
                        "loss_err",
                        "traj_loss_err",
                        "traj_norm_err",
                        "traj_param_err",
                        "loss_ok",
                        "traj_ok",
                    )
                },
                "equivalent": r.equivalent,
                "step_ms": r.step_ms,
            }
        out.append(item)
    return {"env": env, "rows": out, **(extra or {})}


def environment(target: str = "cpu") -> dict:
    import flax
    import jax

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "device_count": jax.device_count(),
        "target": target,
    }


def write_outputs(
    rows: list[BenchRow],
    env: dict,
    out_dir,
    name="bench_meshes",
    extra=None,
    plot: str | None = None,
):
    """The JSON report in `out_dir`, and the PNG at `plot` (None: no plot)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{name}.json"
    json_path.write_text(json.dumps(to_json(rows, env, extra), indent=1))
    return [json_path] + ([_plot(rows, Path(plot))] if plot else [])


def _plot(rows: list[BenchRow], path: Path) -> Path:
    good = [r for r in rows if r.report is not None]
    labels = [f"{r.label}\n{r.case.mesh}" for r in good]
    xs = range(len(good))
    size = (max(10, 0.9 * len(good)) + 2, 8)  # + the legends' column, right of the axes
    outside = {"loc": "upper left", "bbox_to_anchor": (1.01, 1), "borderaxespad": 0}
    with figure(path, 2, 1, figsize=size, dpi=110) as (_, (ax_mem, ax_comm)):
        parts = {
            "params": [r.state_layout.params / MiB for r in good],
            "gradients": [r.state_layout.grads / MiB for r in good],
            "Adam m, v": [r.state_layout.optimizer / MiB for r in good],
        }
        bottom = [0.0] * len(good)
        for name, values in parts.items():
            ax_mem.bar(xs, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        predicted = [r.state_predicted.total / MiB for r in good]
        ax_mem.scatter(xs, predicted, marker="_", s=400, color="black", label="predicted total")
        ax_mem.set_ylabel("MiB per device")
        ax_mem.set_title("Training state per device, stacked by component (declared layout)")
        ax_mem.legend(fontsize=9, **outside)
        ops = sorted({op for r in good for op in r.report.collective_totals()})
        width = 0.8 / max(len(ops), 1)
        for i, op in enumerate(ops):
            values = [r.report.collective_totals().get(op) for r in good]
            ax_comm.bar(
                [x + i * width for x in xs],
                [v.total_bytes / MiB if v else 0 for v in values],
                width,
                label=op,
            )
        ax_comm.set_ylabel("MiB per device per step")
        ax_comm.set_title("Collective bytes by op (compiled HLO)")
        if ops:
            ax_comm.legend(fontsize=9, **outside)
        for ax in (ax_mem, ax_comm):
            ax.set_xlabel("strategy, mesh")
            ax.set_xticks([x + 0.4 - width / 2 for x in xs] if ax is ax_comm else list(xs), labels)
            ax.tick_params(axis="x", labelsize=7, labelrotation=30)
    return path


def plot_path(args, name: str) -> str | None:
    if args.no_plot:
        return None
    return args.plot or str(Path(args.out) / f"{name}.png")
