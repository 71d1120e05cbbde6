"""Collective census: the collectives a compiled program really runs, read from its HLO text.

`cost_analysis()` has no collective-bytes key, so we parse `compiled.as_text()` (post-partitioning
HLO). Pure text processing: this module does not import jax.

What one `Collective` records (one per collective instruction, in every computation):
  op               all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute |
                   ragged-all-to-all (async `X-start`/`X-done` pairs are one collective, named X)
  dtype            element type as printed ("mixed" for a tuple of several types)
  bytes_per_device bytes of ONE device's buffer, defined per op (tuple-shaped combined ops sum
                   their elements once):
                     all-reduce          the operand (= the result)
                     all-gather          the output, i.e. the gathered buffer (N x the input)
                     reduce-scatter      the input, i.e. N x the output
                     all-to-all          the operand (= the result)
                     collective-permute  the operand each source sends (= what a target receives)
                     ragged-all-to-all   the output buffer
                   The wire traffic of an algorithm is a different number: a ring all-reduce of
                   B bytes sends 2(N-1)/N x B per device (`jaxscale.calc.comm`).
  group_size       devices per replica group (N above); for collective-permute, the number of
                   distinct devices named in source_target_pairs
  num_groups       replica groups (for collective-permute: the number of source->target pairs)

A collective inside a while loop runs once per trip: `trips` is the product of the known trip
counts of the loops around it (XLA records `known_trip_count` in a loop's backend config; a loop
without one counts once and sets `unknown_trips`). `census` and `summarize` count executions, so
a scanned layer stack or a pipeline's scanned steady state moves what the unrolled program moves.
A collective in a conditional's branch is counted once per branch (the branch taken is data).

Two CPU habits are recognised rather than hidden (XLA:CPU's collectives differ from XLA:TPU's):
  * XLA:CPU computes bf16 collectives in f32: `upcast_from` names the narrow type when the operand
    comes straight from a convert, or the result goes straight into one.
  * XLA:CPU (and TPU, inside a fusion) may emit all-reduce + dynamic-slice for a reduce-scatter:
    `scattered` is True when an all-reduce's result is dynamic-sliced to 1/N of its elements.
`normalize()` rewrites both (op -> reduce-scatter; dtype and bytes -> the narrow type), so that a
prediction made for bf16 reduce-scatters can be compared with a CPU compile.

Replica groups are read in every form jax 0.10-0.12 prints: explicit `{{0,1},{2,3}}`, iota
`[2,4]<=[8]` and `[4,2]<=[2,4]T(1,0)`, and mesh `mesh['a'=2,'b'=4] {'a'}`.
"""

import re
from collections import Counter
from dataclasses import dataclass, replace
from math import prod

from jaxscale.analysis.hlo_text import (
    DTYPE_BYTES,
    Instruction,
    array_shapes,
    int_list,
    module_devices,
    nbytes,
    parse_hlo,
    parse_replica_groups,
)

OPS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "ragged-all-to-all",
)
_ASYNC_STARTS = {f"{op}-start": op for op in OPS}
_ASYNC_DONES = {f"{op}-done" for op in OPS}
_NARROW_FLOATS = ("bf16", "f16")


@dataclass(frozen=True)
class Collective:
    op: str
    dtype: str
    bytes_per_device: float
    group_size: int
    num_groups: int
    name: str  # the instruction's name (the -start for async forms)
    computation: str
    is_async: bool = False
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # result arrays (dtype, dims)
    upcast_from: str | None = None  # narrow float converted to dtype around the collective
    scattered: bool = False  # all-reduce whose result is dynamic-sliced to 1/group_size
    # per element of a tuple-shaped all-reduce (combined ops mix scattered and whole arrays)
    scattered_elements: tuple[bool, ...] = ()
    trips: int = 1  # executions per run of the program: the known trip counts of enclosing loops
    unknown_trips: bool = False  # inside a loop whose trip count XLA does not know


@dataclass(frozen=True)
class CensusRow:
    op: str
    dtype: str
    bytes_per_device: float
    group_size: int
    count: int


@dataclass(frozen=True)
class OpTotals:
    count: int
    total_bytes: float  # sum of bytes_per_device over the op's collectives


# --- the census -------------------------------------------------------------------------------


def _is_convert_like(instr: Instruction, computations) -> bool:
    if instr.opcode == "convert":
        return True
    if instr.opcode != "fusion":
        return False
    called = computations.get(instr.attrs.get("calls", "").lstrip("%"), [])
    ops = {i.opcode for i in called} - {"parameter"}
    return "convert" in ops and ops <= {"convert", "bitcast", "copy"}


def _fusion_has(instr: Instruction, opcode: str, computations) -> bool:
    called = computations.get(instr.attrs.get("calls", "").lstrip("%"), [])
    return any(i.opcode == opcode for i in called)


def _upcast_from(coll_dtype, operands, users, by_name, computations) -> str | None:
    if coll_dtype != "f32":
        return None
    for instr in operands:  # operand converted up just before the collective
        if instr is not None and _is_convert_like(instr, computations):
            for src in instr.operands:
                src_shapes = array_shapes(by_name[src].result_type) if src in by_name else ()
                if src_shapes and src_shapes[0][0] in _NARROW_FLOATS:
                    return src_shapes[0][0]
    for instr in users:  # result converted back down right after
        out = array_shapes(instr.result_type)
        if _is_convert_like(instr, computations) and out and out[0][0] in _NARROW_FLOATS:
            return out[0][0]
    return None


def _is_scattered(result: Instruction, elements: int, group: int, users_of, computations) -> bool:
    """The all-reduce result is only ever used cut to 1/group of its elements by a dynamic-slice
    (maybe fused, maybe after a convert/copy): a reduce-scatter in disguise. A result that is
    also used whole (say, for a gradient norm before the slice) is a real all-reduce."""
    if group <= 1:
        return False
    frontier, seen, sliced = [result.name], set(), False
    for _ in range(3):  # look through up to two convert/copy steps
        nxt = []
        for name in frontier:
            for user in users_of.get(name, ()):
                if user.name in seen:
                    continue
                seen.add(user.name)
                out = array_shapes(user.result_type)
                n_out = prod(out[0][1]) if out else 0
                is_slice = user.opcode == "dynamic-slice" or (
                    user.opcode == "fusion" and _fusion_has(user, "dynamic-slice", computations)
                )
                if is_slice and n_out * group == elements:
                    sliced = True
                elif _is_convert_like(user, computations):
                    nxt.append(user.name)
                else:
                    return False  # the full result is needed somewhere
        frontier = nxt
    return sliced


def _scattered_elements(result, shapes, group, users_of, computations) -> tuple[bool, ...]:
    """For a tuple-shaped all-reduce: is element i read (get-tuple-element index=i) and then
    dynamic-sliced to 1/group of its elements?"""
    flags = []
    for i, (_, dims) in enumerate(shapes):
        gtes = [
            u
            for u in users_of.get(result.name, ())
            if u.opcode == "get-tuple-element" and u.attrs.get("index") == str(i)
        ]
        flags.append(any(_is_scattered(g, prod(dims), group, users_of, computations) for g in gtes))
    return tuple(flags)


_CALLED = ("calls", "to_apply", "condition", "true_computation", "false_computation")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


def loop_trips(computations: dict) -> dict[str, tuple[int, bool]]:
    """Per computation: (times it runs per run of the module, whether an enclosing loop's trip
    count is unknown). A while body runs its loop's `known_trip_count` times per entry; every
    other called computation (branches, calls, fusions, conditions) once per call."""
    calls: dict[str, list[tuple[str, int, bool]]] = {}  # callee -> [(caller, factor, unknown)]
    for caller, instrs in computations.items():
        for instr in instrs:
            for key in _CALLED:
                if key in instr.attrs:
                    calls.setdefault(instr.attrs[key].lstrip("%"), []).append((caller, 1, False))
            for name in re.findall(r"%?([\w.\-]+)", instr.attrs.get("branch_computations", "")):
                calls.setdefault(name, []).append((caller, 1, False))
            if instr.opcode == "while" and "body" in instr.attrs:
                m = _TRIP_COUNT.search(instr.attrs.get("backend_config", ""))
                calls.setdefault(instr.attrs["body"].lstrip("%"), []).append(
                    (caller, int(m.group(1)) if m else 1, m is None)
                )
    memo: dict[str, tuple[int, bool]] = {}

    def trips(name: str) -> tuple[int, bool]:  # HLO's call graph has no cycles
        if name not in memo:
            total, unknown = 0, False
            for caller, factor, unk in calls.get(name, ()):
                n, u = trips(caller)
                total, unknown = total + n * factor, unknown or u or unk
            memo[name] = (total, unknown) if name in calls else (1, False)  # the entry: once
        return memo[name]

    return {name: trips(name) for name in computations}


def collectives_from_text(text: str) -> list[Collective]:
    """Every collective in an HLO module's text (see the module docstring for the fields)."""
    computations = parse_hlo(text)
    num_devices = module_devices(text)
    runs = loop_trips(computations)
    found = []
    for comp_name, instrs in computations.items():
        by_name = {i.name: i for i in instrs}
        users_of: dict[str, list[Instruction]] = {}
        for i in instrs:
            for o in i.operands:
                users_of.setdefault(o, []).append(i)
        for instr in instrs:
            if instr.opcode in _ASYNC_DONES:
                continue
            op = _ASYNC_STARTS.get(instr.opcode, instr.opcode if instr.opcode in OPS else None)
            if op is None:
                continue
            is_async = instr.opcode in _ASYNC_STARTS
            result = instr
            if is_async:
                done = [u for u in users_of.get(instr.name, ()) if u.opcode == f"{op}-done"]
                result = done[0] if done else instr
            shapes = _output_shapes(op, result, is_async and result is instr)
            if op == "collective-permute":
                pairs = [tuple(p) for p in _pairs(instr.attrs.get("source_target_pairs", "{}"))]
                group_size = len({d for p in pairs for d in p})
                num_groups = len(pairs)
            else:
                rg = instr.attrs.get("replica_groups", "{}")
                if rg.startswith("mesh") and "device_ids" in instr.attrs:
                    # the attribute splitter cut `mesh[...], device_ids=(...) {...}` in two
                    rg = f"{rg}, device_ids={instr.attrs['device_ids']}"
                groups = parse_replica_groups(rg, num_devices)
                group_size, num_groups = len(groups[0]), len(groups)
            size = nbytes(shapes) * (group_size if op == "reduce-scatter" else 1)
            dtypes = {d for d, _ in shapes}
            dtype = dtypes.pop() if len(dtypes) == 1 else "mixed"
            operands = [by_name.get(o) for o in instr.operands]
            users = users_of.get(result.name, ())
            elements = sum(prod(d) for _, d in shapes)
            per_element = ()
            if op == "all-reduce" and len(shapes) > 1:
                per_element = _scattered_elements(
                    result, shapes, group_size, users_of, computations
                )
            found.append(
                Collective(
                    op=op,
                    dtype=dtype,
                    bytes_per_device=size,
                    group_size=group_size,
                    num_groups=num_groups,
                    name=instr.name,
                    computation=comp_name,
                    is_async=is_async,
                    shapes=shapes,
                    upcast_from=_upcast_from(dtype, operands, users, by_name, computations),
                    scattered=(
                        all(per_element)
                        if per_element
                        else op == "all-reduce"
                        and _is_scattered(result, elements, group_size, users_of, computations)
                    ),
                    scattered_elements=per_element,
                    trips=runs[comp_name][0],
                    unknown_trips=runs[comp_name][1],
                )
            )
    return found


def _pairs(text: str) -> list[list[int]]:
    return [int_list(p) for p in re.findall(r"\{(\d+\s*,\s*\d+)\}", text)]


def _output_shapes(op: str, result: Instruction, start_without_done: bool):
    """The collective's output arrays; a lone `-start` tuple is cut to its output part."""
    shapes = array_shapes(result.result_type)
    if not start_without_done:
        return shapes
    arrays = [s for s in shapes if s[1] or s[0] not in ("u32", "s32")]
    if op == "all-gather":  # (operands..., outputs...)
        return tuple(arrays[len(arrays) // 2 :])
    if op == "collective-permute":  # (operand, output, context...)
        return tuple(arrays[:1])
    return shapes


def collectives_of(compiled) -> list[Collective]:
    """Census of anything with `.as_text()` (a jax `Compiled`), or of HLO text itself."""
    return collectives_from_text(compiled if isinstance(compiled, str) else compiled.as_text())


def normalize(collectives: list[Collective]) -> list[Collective]:
    """Undo CPU habits: scattered all-reduce -> reduce-scatter; f32 upcast -> the narrow dtype."""
    out = []
    for c in _split_mixed(collectives):
        if c.scattered:
            c = replace(c, op="reduce-scatter", scattered=False)
        if c.upcast_from:
            ratio = DTYPE_BYTES[c.upcast_from] / DTYPE_BYTES[c.dtype]
            c = replace(
                c,
                dtype=c.upcast_from,
                bytes_per_device=c.bytes_per_device * ratio,
                upcast_from=None,
            )
        out.append(c)
    return out


def _split_mixed(collectives: list[Collective]) -> list[Collective]:
    """A combined all-reduce whose tuple mixes scattered and whole elements becomes two: the
    scattered elements (a reduce-scatter once normalised) and the rest (an all-reduce)."""
    out = []
    for c in collectives:
        flags = c.scattered_elements
        if not flags or all(flags) or not any(flags):
            out.append(c)
            continue
        for want in (True, False):
            part = tuple(s for s, f in zip(c.shapes, flags, strict=True) if f == want)
            dtypes = {d for d, _ in part}
            out.append(
                replace(
                    c,
                    shapes=part,
                    bytes_per_device=nbytes(part),
                    scattered=want,
                    scattered_elements=(),
                    dtype=dtypes.pop() if len(dtypes) == 1 else "mixed",
                )
            )
    return out


def census(collectives: list[Collective]) -> list[CensusRow]:
    """Identical collectives (op, dtype, bytes, group size) folded into one row with a count of
    executions (a collective in a loop body counts once per trip)."""
    counts: Counter = Counter()
    for c in collectives:
        counts[c.op, c.dtype, c.bytes_per_device, c.group_size] += c.trips
    return [CensusRow(*key, count=n) for key, n in sorted(counts.items(), key=lambda kv: kv[0])]


def summarize(collectives: list[Collective]) -> dict[str, OpTotals]:
    """Per op: how many collectives run and their total bytes per device (loop trips counted)."""
    totals: dict[str, OpTotals] = {}
    for c in collectives:
        t = totals.get(c.op, OpTotals(0, 0.0))
        totals[c.op] = OpTotals(t.count + c.trips, t.total_bytes + c.bytes_per_device * c.trips)
    return totals


def format_census(rows: list[CensusRow]) -> str:
    """An aligned text table of census rows."""
    lines = [f"{'op':<20} {'dtype':<6} {'bytes/device':>14} {'group':>6} {'count':>6}"]
    for r in rows:
        lines.append(
            f"{r.op:<20} {r.dtype:<6} {r.bytes_per_device:>14,.0f} {r.group_size:>6} {r.count:>6}"
        )
    return "\n".join(lines)
