"""Where a compiled program's bytes go: each instruction of the entry computation and of its loop
bodies counted as the bytes it reads and writes, times its loop's trips, and grouped by what it
does -- the layer scan's stack traffic apart from the compute (docs/performance.md).

An instruction reads its operands and writes its output, with XLA's own rules for slices: a
dynamic-update-slice (alone or at the root of a fusion) reads and writes the update, not the
buffer it updates in place; a dynamic-slice, or a fusion operand that only a dynamic-slice
reads, reads the slice. For a scanned training step the sum equals XLA's cost analysis with
every trip counted (`loop_cost`; tested), so the groups split that figure.
"""

from __future__ import annotations

import collections
import re

from jaxscale.analysis.hlo_text import array_shapes, nbytes

_LINE = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\((.*?)\)(.*)")
_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) [^\n]*\{\n(.*?)^\}", re.M | re.S)
_LOOP = re.compile(r"while\([^\n]*?body=%?([\w.\-]+)[^\n]*?known_trip_count\":\{\"n\":\"(\d+)\"")
_FREE = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while")
KINDS = ("compute", "stack fill", "stack writes", "stack reads")
SLOT_KINDS = ("matmuls", "matmul reads", "matmul writes", "reads apart", "writes apart")


def by_kind(compiled) -> dict[str, float]:
    """{kind: bytes} of a compiled program, every loop trip counted: `stack writes`
    (dynamic-update-slices into loop-carried buffers; a scatter that XLA:CPU's older emitters
    expand into a loop counts here too, a few MB), `stack reads` (dynamic-slices out of them),
    `stack fill` (the entry's broadcasts and copies that initialise them) and `compute`
    (everything else)."""
    text = compiled.as_text()
    comps = {m[2]: (bool(m[1]), m[3]) for m in _COMPUTATION.finditer(text)}
    trips = {body: int(n) for body, n in _LOOP.findall(text)}
    out = dict.fromkeys(KINDS, 0.0)
    for name, (entry, body) in comps.items():
        weight = 1 if entry else trips.get(name)
        if weight is None:  # a fusion's or reduction's computation: counted at its call
            continue
        for kind, b in _instructions(body, comps, entry):
            out[kind] += weight * b
    return out


def _instructions(body: str, comps: dict, entry: bool):
    """(kind, bytes) of each instruction of one computation."""
    sizes: dict[str, int] = {}
    for line in body.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        name, shape, op, args, rest = m.groups()
        sizes[name] = _bytes(shape)
        if op in _FREE:
            continue
        operands = [a for a in re.findall(r"%([\w.\-]+)", args) if a in sizes]
        if op == "fusion":
            called = re.search(r"calls=%?([\w.\-]+)", rest)[1]
            reads, update = _fused(comps[called][1])
            b = sum(reads.get(i, sizes[a]) for i, a in enumerate(operands))
            b += sizes[name] if update is None else update
        elif op == "dynamic-slice":
            b = 2 * sizes[name]
        elif op == "dynamic-update-slice":
            b = 2 * sizes[operands[1]]
        else:
            b = sizes[name] + sum(sizes[a] for a in operands)
        if "dynamic-update-slice" in name or op == "dynamic-update-slice":
            kind = "stack writes"
        elif "dynamic-slice" in name or op == "dynamic-slice":
            kind = "stack reads"
        elif entry and (op == "copy" or "broadcast" in name):
            kind = "stack fill"
        else:
            kind = "compute"
        yield kind, b


def _bytes(type_text: str) -> int:
    return int(nbytes(array_shapes(type_text)))


def _fused(body: str) -> tuple[dict[int, int], int | None]:
    """A fused computation's bytes read per parameter (where XLA's rules make it less than the
    whole operand) and, if its root updates a buffer in place, the update's bytes."""
    shape_op_args, users, params, root = {}, collections.defaultdict(list), {}, None
    for line in body.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        name, shape, op, args, _ = m.groups()
        operands = re.findall(r"%([\w.\-]+)", args)
        shape_op_args[name] = (shape, op, operands)
        if op == "parameter":
            params[int(args)] = name
        for i, a in enumerate(operands):
            users[a].append((name, i))
        if line.strip().startswith("ROOT"):
            root = name
    reads = {}
    for i, p in params.items():
        uses = users[p]
        as_buffer = {shape_op_args[u][1] if j == 0 else None for u, j in uses}
        if uses and as_buffer <= {"dynamic-slice", "dynamic-update-slice"}:
            # sliced out, or updated in place (a scatter's read-modify-write: both): the slices
            sliced = [u for u, _ in uses if shape_op_args[u][1] == "dynamic-slice"]
            reads[i] = sum(_bytes(shape_op_args[u][0]) for u in sliced)
    update = None
    if root is not None and shape_op_args[root][1] == "dynamic-update-slice":
        update = _bytes(shape_op_args[shape_op_args[root][2][1]][0])
    return reads, update


def slot_access(compiled) -> list[dict[str, int]]:
    """Per loop body, in program order: how many of its instructions slice a loop-carried stack
    (dynamic-slice: a slot read) or update one (dynamic-update-slice: a slot write), split by
    whether a matmul does it inside its own fusion ("matmul reads", "matmul writes": the slot is
    the matmul's operand or output, no copy) or an instruction apart from any matmul does it
    ("reads apart", "writes apart"); and "matmuls", the body's matmuls. A backend that fuses
    slices into its matmuls (XLA:TPU, XLA:GPU's dynamic-slice fusion) shows the first two; one
    that cannot (XLA:CPU) copies each slot into or out of a buffer of its own."""
    text = compiled.as_text()
    comps = {m[2]: m[3] for m in _COMPUTATION.finditer(text)}
    bodies = re.findall(r"while\([^\n]*?body=%?([\w.\-]+)", text)
    out = []
    for body in bodies:
        counts = dict.fromkeys(SLOT_KINDS, 0)
        for line in comps[body].splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            _, _, op, _, rest = m.groups()
            ops, text_of = {op}, line
            if op == "fusion":
                text_of = comps[re.search(r"calls=%?([\w.\-]+)", rest)[1]]
                ops = set(re.findall(r"= (?:\(.*?\)|\S+) ([\w\-]+)\(", text_of))
            # XLA:GPU calls cuBLAS as a custom call, alone or (dynamic-slice fusion) in a fusion
            library = "custom-call" in ops and "gemm" in text_of.lower()
            matmul = bool(ops & {"dot", "convolution"}) or library
            counts["matmuls"] += matmul
            if "dynamic-slice" in ops:
                counts["matmul reads" if matmul else "reads apart"] += 1
            if "dynamic-update-slice" in ops:
                counts["matmul writes" if matmul else "writes apart"] += 1
        out.append(counts)
    return out
