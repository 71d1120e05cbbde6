"""The bench's report: an aligned table on stdout, JSON and PNG charts under results/."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from jaxscale.bench.meshes import TRAJ_ATOL, BenchRow

MB = 1 << 20
_OP_SHORT = {
    "all-reduce": "AR",
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-to-all": "A2A",
    "collective-permute": "CP",
    "ragged-all-to-all": "RA2A",
}


def _collectives_cell(row: BenchRow) -> str:
    totals = row.report.collective_totals()
    if not totals:
        return "none"
    return " ".join(
        f"{_OP_SHORT.get(op, op)} {t.count}x {t.total_bytes / MB:.2f}MB" for op, t in totals.items()
    )


def format_table(rows: list[BenchRow], backend: str) -> str:
    head = (f"{'strategy':<11} {'mesh':<17} {'comp s':>6} {'args MB':>8} {'temp MB':>8} "
            f"{'peak MB':>8} {'GFLOP/dev':>15} {'step ms*':>9} {'|dloss|':>8} {'eq':>2}  "
            f"collectives per step (count, MB/device)")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.report is None:
            lines.append(f"{r.strategy:<11} {r.mesh:<17} skipped: {r.error}")
            continue
        m = r.report.memory
        flops = f"{r.report.flops / 1e9:.2f}/{r.flops_analytic_per_device / 1e9:.2f}"
        mark = "✓" if r.equivalent else "✗"
        lines.append(
            f"{r.strategy:<11} {r.mesh:<17} {r.report.compile_s:6.1f} {m.argument / MB:8.2f} "
            f"{m.temp / MB:8.2f} {m.peak / MB:8.2f} {flops:>15} {r.step_ms_median:9.1f} "
            f"{r.max_loss_diff:8.1e} {mark:>2}  {_collectives_cell(r)}"
        )
    lines += [
        "",
        "GFLOP/dev: measured (cost_analysis) / analytic (3 x forward matmuls, full attention).",
        f"|dloss|: max |loss - reference loss| over the first steps; eq ✓ when <= {TRAJ_ATOL:g}.",
        "peak = args + output + temp - alias (memory_analysis, per device). Collectives are the",
        "normalised census of the compiled step (CPU all-reduce+slice counted as reduce-scatter).",
    ]
    if backend == "cpu":
        lines.append(
            "* step ms on simulated CPU devices sharing the host's cores: indicative only;"
        )
        lines.append("  compare meshes by the compiler figures, not by wall-clock.")
    return "\n".join(lines)


def to_json(rows: list[BenchRow], env: dict) -> dict:
    out = []
    for r in rows:
        item = {"strategy": r.strategy, "mesh": r.mesh, "devices": r.devices, "error": r.error}
        if r.report is not None:
            item |= {
                "compile_s": r.report.compile_s,
                "memory": r.report.memory.as_dict(),
                "flops_per_device": r.report.flops,
                "flops_analytic_per_device": r.flops_analytic_per_device,
                "bytes_accessed_per_device": r.report.bytes_accessed,
                "collectives": {
                    op: {"count": t.count, "bytes_per_device": t.total_bytes}
                    for op, t in r.report.collective_totals().items()
                },  # fmt: skip
                "losses": r.losses,
                "max_loss_diff": r.max_loss_diff,
                "equivalent": r.equivalent,
                "step_ms": r.step_ms,
                "step_ms_median": r.step_ms_median,
            }
        out.append(item)
    return {"env": env, "rows": out}


def environment() -> dict:
    import flax
    import jax

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "device_count": jax.device_count(),
    }


def write_outputs(rows: list[BenchRow], env: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "bench_meshes.json"
    json_path.write_text(json.dumps(to_json(rows, env), indent=1))
    return [json_path, _plot(rows, out / "bench_meshes.png")]


def _plot(rows: list[BenchRow], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = [r for r in rows if r.report is not None]
    labels = [f"{r.strategy}\n{r.mesh}" for r in good]
    fig, (ax_mem, ax_comm) = plt.subplots(1, 2, figsize=(13, 4.5))
    parts = {
        "arguments (params, opt state, batch)": [r.report.memory.argument / MB for r in good],
        "temporaries": [r.report.memory.temp / MB for r in good],
        "outputs not aliased": [
            (r.report.memory.output - r.report.memory.alias) / MB for r in good
        ],  # fmt: skip
    }
    bottom = [0.0] * len(good)
    for name, values in parts.items():
        ax_mem.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax_mem.set_ylabel("MB per device")
    ax_mem.set_title("Per-device memory (memory_analysis)")
    ax_mem.legend(fontsize=8)
    ops = sorted({op for r in good for op in r.report.collective_totals()})
    width = 0.8 / max(len(ops), 1)
    for i, op in enumerate(ops):
        values = [r.report.collective_totals().get(op) for r in good]
        ax_comm.bar([x + i * width for x in range(len(good))],
                    [v.total_bytes / MB if v else 0 for v in values], width, label=op)  # fmt: skip
    ax_comm.set_xticks([x + 0.4 - width / 2 for x in range(len(good))], labels)
    ax_comm.set_ylabel("MB per device per step")
    ax_comm.set_title("Collective bytes by op (compiled HLO)")
    if ops:
        ax_comm.legend(fontsize=8)
    for ax in (ax_mem, ax_comm):
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
