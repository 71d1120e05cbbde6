"""Dependency-driven timeline: ops on resources, each resource running its ops in a fixed order.

An op starts at max(end of the previous op on its resource, end of each of its dependencies) and
runs for its duration. This is the earliest time consistent with both the schedule (the per-resource
op order, e.g. a pipeline stage's F/B sequence or a CPU thread's program) and the data flow (an op
cannot use a result that does not exist yet). Pipeline schedules and the CPU/GPU overlap models
are both instances; times are in whatever unit the caller uses (slots, ms).
"""

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import gcd, lcm


@dataclass(frozen=True)
class Op:
    key: Hashable  # unique id, e.g. ("F", stage, microbatch)
    resource: Hashable  # what executes it (a pipeline stage, "cpu", "gpu")
    duration: float  # in the caller's time unit; > 0
    deps: tuple = ()  # keys of ops whose results this op consumes
    label: str = ""  # short text for grids and bars ("F3", "S")


@dataclass(frozen=True)
class Span:
    op: Op
    start: float
    end: float


def run(orders: Mapping[Hashable, Sequence[Op]]) -> dict[Hashable, Span]:
    """Schedule every op as early as its resource order and dependencies allow.

    `orders` maps each resource to the ops it runs, in order. Raises ValueError on duplicate keys,
    dependencies that name no op, non-positive durations, or an order that can never finish
    (a dependency cycle through the per-resource orders, i.e. a deadlock).
    """
    all_ops = {}
    for resource, ops in orders.items():
        for op in ops:
            if op.key in all_ops:
                raise ValueError(f"duplicate op key {op.key!r}")
            if not op.duration > 0:
                raise ValueError(f"op {op.key!r} has non-positive duration {op.duration}")
            if op.resource != resource:
                raise ValueError(f"op {op.key!r} is listed under resource {resource!r}")
            all_ops[op.key] = op
    for op in all_ops.values():
        for dep in op.deps:
            if dep not in all_ops:
                raise ValueError(f"op {op.key!r} depends on unknown op {dep!r}")

    # An op's start is fixed by its resource's previous op and its dependencies, whatever order
    # the ops are placed in; a resource whose next op waits on a dependency resumes when it ends.
    done: dict[Hashable, Span] = {}
    head = {resource: 0 for resource in orders}
    free_at = {resource: 0.0 for resource in orders}
    waiting: dict[Hashable, list] = {}  # op key -> resources whose next op needs it
    ready = list(orders)
    while ready:
        resource = ready.pop()
        ops = orders[resource]
        while head[resource] < len(ops):
            op = ops[head[resource]]
            missing = next((dep for dep in op.deps if dep not in done), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(resource)
                break
            start = max([free_at[resource]] + [done[dep].end for dep in op.deps])
            done[op.key] = Span(op, start, start + op.duration)
            free_at[resource] = start + op.duration
            head[resource] += 1
            ready.extend(waiting.pop(op.key, ()))
    if len(done) < len(all_ops):
        stuck = [ops[head[r]].key for r, ops in orders.items() if head[r] < len(ops)]
        raise ValueError(f"schedule deadlocks: ops {stuck} wait on each other")
    return done


def makespan(spans: Mapping[Hashable, Span]) -> float:
    return max((s.end for s in spans.values()), default=0.0)


def by_resource(spans: Mapping[Hashable, Span]) -> dict[Hashable, list[Span]]:
    """Spans grouped per resource, in start order."""
    out: dict[Hashable, list[Span]] = {}
    for span in sorted(spans.values(), key=lambda s: s.start):
        out.setdefault(span.op.resource, []).append(span)
    return out


def time_quantum(durations: Sequence[float]) -> Fraction:
    """Largest step that divides every duration (so each op covers whole grid cells)."""
    fracs = [Fraction(d).limit_denominator(1000) for d in durations]
    den = lcm(*(f.denominator for f in fracs))
    return Fraction(gcd(*(int(f * den) for f in fracs)), den)


def render_bars(spans: Sequence[Span], end: float, chars_per_unit: float, idle: str = ".") -> str:
    """One resource as a character bar: each op's label character repeated over its duration.

    Op boundaries are rounded to the nearest cell, so a bar is exact whenever they fall on cell
    boundaries (the seed draws at 2 chars/ms with whole-ms phases).
    """
    n_cells = int(round(end * chars_per_unit))
    cells = [idle] * n_cells
    for span in spans:
        first = int(round(span.start * chars_per_unit))
        last = int(round(span.end * chars_per_unit))
        for i in range(first, min(last, n_cells)):
            cells[i] = span.op.label[:1] or "#"
    return "".join(cells)
