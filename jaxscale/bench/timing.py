"""`jaxscale bench --time`: each mesh row's collective time, measured in a profile of its step,
beside an alpha-beta prediction fitted on collectives timed the same way, on the same devices,
in the same run.

  measured   `--time-steps` steps of the row's compiled step under jax.profiler, after its timed
             steps; the trace reader (analysis/trace.py) gives per device and step the time in
             each collective op and the part no compute covers (exposed), meaned over devices.
  predicted  for each collective of the row's census (analysis/hlo.py): alpha + bus_bytes /
             busbw, times its trips, summed per op. alpha and busbw are fitted per (op, group
             size) on that op alone at four message sizes, on all eight devices in groups of the
             same size (every group at once, as in the step), each call timed by its op's events
             in a trace: no dispatch in alpha. bus_bytes is NCCL's (calc/comm.bus_bandwidth).

On simulated CPU devices a collective is a rendezvous of threads and a memory copy: a device's
time in it is mostly waiting for the slowest of eight threads sharing the host's cores, which an
isolated collective (all devices arriving together) does not show. The table says how far an
isolated collective predicts one inside a step here; on a GPU both columns are real.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale import verify
from jaxscale.analysis import trace
from jaxscale.calc import comm

FIT_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)  # bytes per device, census convention
CALLS = 5  # profiled calls per size


@dataclass(frozen=True)
class Fit:
    op: str
    group: int
    alpha_s: float
    busbw_Bps: float
    points: tuple  # (bytes, seconds) measured

    def predict(self, nbytes: float) -> float:
        return self.alpha_s + comm.bus_bandwidth(self.op, nbytes, 1.0, self.group) / self.busbw_Bps


def _program(op: str, group: int, nbytes: int):
    """(jitted f, its input): `op` over groups of `group` of the 8 devices, `nbytes` per device
    in the census convention (all-gather: its output; the others: the operand)."""
    n = jax.device_count()
    mesh = jax.make_mesh((n // group, group), ("rest", "group"))
    elems = max(nbytes // 4 // (group if op == "all-gather" else 1), group)
    elems -= elems % group  # reduce-scatter and all-to-all split it over the group

    def body(x):
        if op == "all-reduce":
            return jax.lax.psum(x, "group")
        if op == "all-gather":
            return jax.lax.all_gather(x, "group", tiled=True)
        if op == "reduce-scatter":
            return jax.lax.psum_scatter(x, "group", tiled=True)
        if op == "all-to-all":
            return jax.lax.all_to_all(x, "group", 0, 0, tiled=True)
        perm = [(i, (i + 1) % group) for i in range(group)]
        return jax.lax.ppermute(x, "group", perm)

    spec = P(("rest", "group"))
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
    x = jax.device_put(jnp.ones((n * elems,), jnp.float32), NamedSharding(mesh, spec))
    return f, x


def _profiled_seconds(run, steps: int, hlo_text: str, directory: str) -> dict:
    """trace.summary of `steps` calls of `run()` (one call first, outside the trace)."""
    return trace.summary(_profiled(run, steps, hlo_text, directory))


def _profiled(run, steps: int, hlo_text: str, directory: str) -> list[trace.DeviceTime]:
    """Each device's time per call over `steps` calls of `run()` (one first, untraced)."""
    jax.block_until_ready(run())
    jax.profiler.start_trace(directory)
    out = None
    for _ in range(steps):
        out = run()
    jax.block_until_ready(out)
    jax.profiler.stop_trace()
    ops = trace.read_ops(trace.trace_file(directory))
    module, opcodes = trace.program_opcodes(hlo_text)
    return trace.device_times(ops, steps, module, opcodes)


def fit(op: str, group: int) -> Fit:
    """alpha and busbw of `op` over groups of `group` devices, least squares on relative error
    (small and large messages count alike), from its profiled calls at FIT_SIZES."""
    points = []
    for nbytes in FIT_SIZES:
        f, x = _program(op, group, nbytes)
        text = f.lower(x).compile().as_text()
        with tempfile.TemporaryDirectory() as d:
            s = _profiled_seconds(lambda f=f, x=x: f(x), CALLS, text, d)
        points.append((nbytes, s["collective_s"]))
    t = np.array([p[1] for p in points])
    bus = np.array([comm.bus_bandwidth(op, b, 1.0, group) for b, _ in points])
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([1 / t, bus / t], 1), np.ones_like(t), rcond=None)
    return Fit(
        op,
        group,
        float(max(alpha, 0.0)),
        float(1 / beta) if beta > 0 else float("inf"),
        tuple(points),
    )


def measure_row(built, compiled, tcfg, initial, steps: int, keep: str | None = None) -> dict:
    """trace.summary of `steps` profiled steps of a bench row, from the reference's initial
    state placed in the row's layout; `keep`: a directory the trace stays in."""
    return trace.summary(profile_devices(built, compiled, tcfg, initial, steps, keep))


def trace_dir(root: str, label: str, mesh: str) -> str:
    """A row's trace directory under `--profile ROOT`: ROOT/<strategy>@<mesh>, filename-safe."""
    return str(Path(root) / re.sub(r"[^\w.=@+-]", "_", f"{label}@{mesh}"))


def profile_devices(
    built, compiled, tcfg, initial, steps: int, keep: str | None = None
) -> list[trace.DeviceTime]:
    """Each device's time per step over `steps` profiled steps of a bench row."""
    state = jax.device_put(initial, built.state_shardings)
    batches = [built.put(b) for b in verify.batches(tcfg, steps + 1)]
    box = {"state": state, "i": 0}

    def run():
        box["state"], metrics = compiled(box["state"], batches[box["i"] % len(batches)])
        box["i"] += 1
        return metrics

    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return _profiled(run, steps, compiled.as_text(), keep)
    with tempfile.TemporaryDirectory() as d:
        return _profiled(run, steps, compiled.as_text(), d)


def predict(report, fits: dict) -> dict[str, float]:
    """{op: seconds per step} of a row's census (report.collectives) under `fits`
    ({(op, group): Fit}); a collective over a group no fit covers is left out."""
    out: dict[str, float] = {}
    for c in report.collectives:
        f = fits.get((c.op, c.group_size))
        if f is not None:
            out[c.op] = out.get(c.op, 0.0) + c.trips * f.predict(c.bytes_per_device)
    return out


def needed(rows) -> set[tuple[str, int]]:
    """The (op, group size) pairs the rows' censuses hold (groups of 2 or more)."""
    return {
        (c.op, c.group_size)
        for r in rows
        if r.report is not None
        for c in r.report.collectives
        if c.group_size > 1 and c.op in trace.COLLECTIVES
    }


def record(rows, fits: dict) -> dict:
    """The --time figures as JSON: per row, measured and predicted seconds per op."""
    return {
        "rows": [
            {
                "label": r.label,
                "mesh": r.case.mesh,
                "measured": r.timing,
                "predicted_s": predict(r.report, fits),
            }
            for r in rows
            if getattr(r, "timing", None) is not None
        ],
        "fits": [
            {
                "op": op,
                "group": g,
                "alpha_s": f.alpha_s,
                "busbw_Bps": f.busbw_Bps,
                "points": [list(p) for p in f.points],
            }
            for (op, g), f in sorted(fits.items())
        ],
    }


def format_table(rows, fits: dict) -> str:
    lines = [
        "time per step (ms, mean of devices; simulated CPU devices: indicative): collectives "
        "measured in a profile of the step vs alpha-beta from isolated collectives in this run",
        f"  {'strategy':<20} {'mesh':<17} {'op':<19} {'measured':>9} {'predicted':>9} "
        f"{'exposed':>8}",
    ]
    for r in rows:
        t = getattr(r, "timing", None)
        if t is None:
            continue
        pred = predict(r.report, fits)
        ops = sorted(set(t["collectives_s"]) | set(pred))
        exposed = "-" if t["exposed_fraction"] is None else f"{t['exposed_fraction']:.0%}"
        for i, op in enumerate(ops or ["(none)"]):
            got = t["collectives_s"].get(op)
            want = pred.get(op)
            lines.append(
                f"  {r.label if i == 0 else '':<20} {r.case.mesh if i == 0 else '':<17} {op:<19} "
                f"{'-' if got is None else f'{got * 1e3:.2f}':>9} "
                f"{'-' if want is None else f'{want * 1e3:.2f}':>9} "
                f"{exposed if i == 0 else '':>8}"
            )
    lines.append(
        "  alpha-beta fits (alpha us, busbw GB/s): "
        + ", ".join(
            f"{op}/{g} {f.alpha_s * 1e6:.0f}, {f.busbw_Bps / 1e9:.2f}"
            for (op, g), f in sorted(fits.items())
        )
    )
    return "\n".join(lines)
