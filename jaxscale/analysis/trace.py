"""A jax.profiler trace, read back: per device and step, the time in compute, in collectives
(by op) and idle, and the collective time no concurrent compute covers (exposed).

The profiler writes an XSpace (`*.xplane.pb`, what TensorBoard's profile plugin opens; a
Perfetto `*.trace.json.gz` beside it when asked), read here with `jax.profiler.ProfileData`,
no extra package. Every event an executable's op produced carries the stats `hlo_op` and
`hlo_module`; XLA:CPU adds `device_ordinal` (its ops run on a shared thread pool), on GPU and TPU
the device is the plane's (`/device:GPU:3`). One execution of the step program on one device is
the ops of that module on that device between two of its executions; its collectives' time
includes the wait for the other devices (XLA:CPU's rendezvous), which is what a collective
costs a device that arrives first.

Per device, over the profiled steps: step time = span of the step program's executions / n;
compute = the union of its other ops' intervals; collectives = the union of its collectives'
(per op: all-reduce, all-gather, ...); exposed = collective time outside every compute interval;
idle = step time - the union of all op intervals (host work, dispatch, waiting for input).
XLA:CPU runs a device's ops one after another, so all its collective time is exposed; on a GPU
the collectives run on their own stream and overlap is what this measures.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)
_DEVICE_PLANE = re.compile(r"/device:[A-Z]+:(\d+)")
ALL = "*"  # device_times over every program in the trace


@dataclass(frozen=True)
class Op:
    device: int
    module: str
    name: str  # the HLO instruction, e.g. "all-reduce.3" or "fusion.12"
    start_ns: int
    end_ns: int


@dataclass
class DeviceTime:
    """One device's mean per step, in seconds."""

    device: int
    steps: int
    step: float
    compute: float
    collectives: dict[str, float] = field(default_factory=dict)  # by op kind
    collective: float = 0.0  # their union (ops of two kinds never overlap on one device)
    exposed: float = 0.0
    idle: float = 0.0


def collective_kind(opcode: str) -> str | None:
    """The collective an HLO opcode is ("all-reduce-start" -> "all-reduce"; an instruction
    name such as "all-reduce.2" reads the same), or None for any other op."""
    base = re.sub(r"\.\d+$", "", opcode)
    base = re.sub(r"-(start|done|update)$", "", base)
    return base if base in COLLECTIVES else None


def program_opcodes(hlo_text: str) -> tuple[str, dict[str, str]]:
    """(module name, {instruction name: opcode}) of a compiled program's HLO text. The trace
    names each op by its instruction, which jax often names after its own primitive (a psum's
    all-reduce is "psum_invariant.7"): the opcode says what it is."""
    from jaxscale.analysis.hlo_text import parse_hlo

    m = re.match(r"\s*HloModule\s+([\w.\-]+)", hlo_text)
    names = {i.name: i.opcode for body in parse_hlo(hlo_text).values() for i in body}
    return (m.group(1) if m else ""), names


def trace_file(directory: str | Path) -> Path:
    """The newest `*.xplane.pb` under `directory` (the profiler nests it in
    plugins/profile/<time>/); FileNotFoundError if there is none."""
    found = sorted(Path(directory).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no *.xplane.pb trace under {directory}")
    return found[-1]


def read_ops(path: str | Path) -> list[Op]:
    """Every op event of the trace at `path` (an .xplane.pb), in no particular order."""
    import jax

    data = jax.profiler.ProfileData.from_file(str(path))
    with warnings.catch_warnings():  # jax 0.12's stats type warns on iteration (no __module__)
        warnings.simplefilter("ignore", DeprecationWarning)
        return _ops(data)


def _ops(data) -> list[Op]:
    ops = []
    for plane in data.planes:
        m = _DEVICE_PLANE.search(plane.name)
        plane_device = int(m.group(1)) if m else None
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" not in stats or "hlo_module" not in stats:
                    continue
                device = stats.get("device_ordinal", plane_device)
                if device is None:
                    continue
                start = int(event.start_ns)
                end = start + int(event.duration_ns)
                module, name = str(stats["hlo_module"]), str(stats["hlo_op"])
                ops.append(Op(int(device), module, name, start, end))
    return ops


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _minus(these: list[tuple[int, int]], cover: list[tuple[int, int]]) -> int:
    """Length of the (disjoint, sorted) `these` outside the (disjoint, sorted) `cover`."""
    outside, j = 0, 0
    for a, b in these:
        t = a
        while j < len(cover) and cover[j][1] <= t:
            j += 1
        k = j
        while k < len(cover) and cover[k][0] < b:
            outside += max(0, cover[k][0] - t)
            t = max(t, cover[k][1])
            k += 1
        outside += max(0, b - t)
    return outside


def step_module(ops: list[Op]) -> str:
    """The program the profiled steps ran: the module with the most op time."""
    totals: dict[str, int] = {}
    for op in ops:
        totals[op.module] = totals.get(op.module, 0) + op.end_ns - op.start_ns
    if not totals:
        raise ValueError("the trace holds no op of any compiled program")
    return max(totals, key=totals.get)


def device_times(
    ops: list[Op], steps: int, module: str | None = None, opcodes: dict[str, str] | None = None
) -> list[DeviceTime]:
    """Each device's time per step in `module` (default: `step_module`; ALL: every program,
    as a serving engine's steps run several) over `steps` steps; `opcodes` (program_opcodes)
    tells the collectives, else their instruction names do."""
    module = module or step_module(ops)
    opcodes = opcodes or {}
    by_device: dict[int, list[Op]] = {}
    for op in ops:
        if module == ALL or op.module == module:
            by_device.setdefault(op.device, []).append(op)
    out = []
    for device, mine in sorted(by_device.items()):
        kind_of = {o: collective_kind(opcodes.get(o.name, o.name)) for o in mine}
        coll = _union([(o.start_ns, o.end_ns) for o in mine if kind_of[o]])
        comp = _union([(o.start_ns, o.end_ns) for o in mine if not kind_of[o]])
        busy = _union(coll + comp)
        span = max(o.end_ns for o in mine) - min(o.start_ns for o in mine)
        kinds: dict[str, int] = {}
        for kind in COLLECTIVES:
            these = _union([(o.start_ns, o.end_ns) for o in mine if kind_of[o] == kind])
            if these:
                kinds[kind] = _length(these)
        per = 1e-9 / steps
        out.append(
            DeviceTime(
                device=device,
                steps=steps,
                step=span * per,
                compute=_length(comp) * per,
                collectives={k: v * per for k, v in kinds.items()},
                collective=_length(coll) * per,
                exposed=_minus(coll, comp) * per,
                idle=(span - _length(busy)) * per,
            )
        )
    return out


def summary(times: list[DeviceTime]) -> dict:
    """The mean over devices of each figure (seconds per step), and the exposed fraction."""
    n = len(times)

    def mean(get):
        return sum(get(t) for t in times) / n

    kinds = sorted({k for t in times for k in t.collectives})
    collective = mean(lambda t: t.collective)
    return {
        "devices": n,
        "steps": times[0].steps,
        "step_s": mean(lambda t: t.step),
        "compute_s": mean(lambda t: t.compute),
        "collective_s": collective,
        "collectives_s": {k: mean(lambda t, k=k: t.collectives.get(k, 0.0)) for k in kinds},
        "exposed_s": mean(lambda t: t.exposed),
        "exposed_fraction": mean(lambda t: t.exposed) / collective if collective else None,
        "idle_s": mean(lambda t: t.idle),
    }


def format_summary(s: dict, unit: str = "step") -> str:
    """One line: step = compute + exposed collectives + idle, then the collectives by op."""
    ms = 1e3
    kinds = ", ".join(f"{k} {v * ms:.2f}" for k, v in s["collectives_s"].items())
    over = f", {s['steps']} {unit}s" if s["steps"] > 1 else ""
    line = (
        f"per {unit} (mean of {s['devices']} device{'s' if s['devices'] > 1 else ''}{over}): "
        f"{s['step_s'] * ms:.2f} "
        f"ms = compute {s['compute_s'] * ms:.2f} + exposed collectives {s['exposed_s'] * ms:.2f}"
        f" + idle {s['idle_s'] * ms:.2f}"
    )
    if s["exposed_fraction"] is not None:
        line += (
            f"; collectives {s['collective_s'] * ms:.2f} ms ({kinds}), "
            f"{s['exposed_fraction']:.0%} exposed"
        )
    return line
