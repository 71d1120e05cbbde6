"""HLO text, parsed just enough for the collective census: computations, instructions, array
types and replica groups. Pure text processing (no jax).

Replica groups come in every form jax 0.10-0.12 prints: explicit `{{0,1},{2,3}}`, iota
`[2,4]<=[8]` and `[4,2]<=[2,4]T(1,0)`, and mesh `mesh['a'=2,'b'=4] {'a'}` (sub-axes `'a':(1)2`).
"""

import re
from dataclasses import dataclass
from math import prod

import numpy as np

DTYPE_BYTES = {
    "pred": 1.0,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1.0,
    "u8": 1.0,
    "s16": 2.0,
    "u16": 2.0,
    "s32": 4.0,
    "u32": 4.0,
    "s64": 8.0,
    "u64": 8.0,
    "f16": 2.0,
    "bf16": 2.0,
    "f32": 4.0,
    "f64": 8.0,
    "c64": 8.0,
    "c128": 16.0,
    "token": 0.0,
}

_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY_TYPE = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9]\w*)?)\[([0-9,\s]*)\]")


@dataclass(frozen=True)
class Instruction:
    name: str
    result_type: str  # as printed, e.g. "f32[8]{0}" or "(f32[8]{0}, bf16[4]{0})"
    opcode: str
    operands: tuple[str, ...]  # instruction names, without '%'
    attrs: dict[str, str]
    computation: str


# --- low-level text parsing -------------------------------------------------------------------


_SPECIAL = re.compile(r'[()\[\]{}",]')  # the characters the scanners below act on
_OPEN, _CLOSE = "([{", ")]}"


def _in_quote_end(text: str, i: int) -> int:
    """Index of the quote that closes the string opened at text[i] (escapes respected)."""
    j = i
    while True:
        j = text.find('"', j + 1)
        if j < 0:  # unterminated: the rest of the text is the string
            return len(text) - 1
        if text[j - 1] != "\\":
            return j


def matching(text: str, start: int) -> int:
    """Index just past the bracket that closes text[start] (quotes respected). Jumps from one
    bracket or quote to the next: HLO lines are long and mostly plain text."""
    depth, i = 0, start
    while True:
        m = _SPECIAL.search(text, i)
        if m is None:
            raise ValueError(f"unbalanced brackets in HLO text: {text[start : start + 80]!r}")
        i, c = m.start(), m.group()
        if c == '"':
            i = _in_quote_end(text, i)
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1


def _split_top(text: str) -> list[str]:
    """Split at commas that are outside brackets and quotes."""
    parts, depth, last, i = [], 0, 0, 0
    while True:
        m = _SPECIAL.search(text, i)
        if m is None:
            break
        i, c = m.start(), m.group()
        if c == '"':
            i = _in_quote_end(text, i)
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0:  # a top-level comma
            parts.append(text[last:i].strip())
            last = i + 1
        i += 1
    if text[last:].strip():
        parts.append(text[last:].strip())
    return parts


def _parse_instruction(body: str, name: str, computation: str) -> Instruction | None:
    body = body.strip()
    if body.startswith("("):
        end = matching(body, 0)
    else:
        end = body.find(" ")
        if end < 0:
            return None
    result_type, rest = body[:end], body[end:].lstrip()
    m = re.match(r"([\w\-]+)\(", rest)
    if not m:
        return None
    close = matching(rest, m.end() - 1)
    operands = tuple(
        o.split()[-1].lstrip("%") for o in _split_top(rest[m.end() : close - 1]) if o.strip()
    )
    attrs = {}
    for part in _split_top(rest[close:].lstrip(", ")):
        key, sep, value = part.partition("=")
        if sep:
            attrs[key.strip()] = value.strip()
    return Instruction(name, result_type, m.group(1), operands, attrs, computation)


def parse_hlo(text: str) -> dict[str, list[Instruction]]:
    """Computations of an HLO module, each a list of its instructions in text order."""
    computations: dict[str, list[Instruction]] = {}
    current = None
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            computations[current] = []
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTRUCTION.match(line) if current is not None else None
        if m:
            instr = _parse_instruction(m.group(2), m.group(1), current)
            if instr is not None:
                computations[current].append(instr)
    return computations


def array_shapes(type_text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(dtype, dims) of every array in a printed type; tuples are flattened in order."""
    clean = re.sub(r"/\*.*?\*/", "", type_text)
    clean = re.sub(r"\{[^{}]*\}", "", clean)  # layouts such as {1,0} or {1,0:T(8,128)}
    shapes = []
    for dtype, dims in _ARRAY_TYPE.findall(clean):
        size = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
        shapes.append((dtype, size))
    return tuple(shapes)


def nbytes(shapes) -> float:
    total = 0.0
    for dtype, dims in shapes:
        key = "f8" if dtype.startswith("f8") else dtype
        total += (1.0 if key == "f8" else DTYPE_BYTES.get(key, 0.0)) * prod(dims)
    return total


# --- replica groups ---------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"-?\d+", text)]


def _iota_groups(text: str) -> np.ndarray:
    m = re.fullmatch(r"\s*\[([\d,\s]+)\]\s*<=\s*\[([\d,\s]+)\](?:\s*T\(([\d,\s]+)\))?\s*", text)
    if not m:
        raise ValueError(f"unrecognised iota replica groups: {text!r}")
    out_dims, in_dims = int_list(m.group(1)), int_list(m.group(2))
    ids = np.arange(prod(in_dims)).reshape(in_dims)
    if m.group(3):
        ids = ids.transpose(int_list(m.group(3)))
    return ids.reshape(out_dims).reshape(-1, out_dims[-1])


def _mesh_groups(text: str) -> np.ndarray:
    """`mesh['a'=2,'b'=4] {'a'}`: groups vary over the listed axes (sub-axes 'a':(1)2 allowed).

    A mesh whose devices are not in id order carries them after the shape, as an iota or a list:
    `mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'a'}`.
    """
    m = re.fullmatch(r"\s*mesh\[(.*?)\]\s*(?:,?\s*device_ids=\((.*?)\))?\s*\{(.*)\}\s*", text)
    if not m:
        raise ValueError(f"unrecognised mesh replica groups: {text!r}")
    axes = [(n, int(s)) for n, s in re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))]
    order = _device_order(m.group(2)) if m.group(2) else None
    # Split each mesh axis into the sub-axes the selection mentions, major to minor.
    selected = re.findall(r"'([^']+)'(?:\s*:\s*\((\d+)\)(\d+))?", m.group(3))
    dims, names = [], []
    for axis, size in axes:
        subs = sorted((int(p), int(s)) for n, p, s in selected if n == axis and p)
        if not subs:
            dims.append(size)
            names.append(axis if any(n == axis for n, _, _ in selected) else None)
            continue
        covered = 1  # pre-size of the next piece, counted from the major end
        for pre, sub in subs:
            if pre > covered:
                dims.append(pre // covered)
                names.append(None)
            dims.append(sub)
            names.append(axis)
            covered = pre * sub
        if size // covered > 1:
            dims.append(size // covered)
            names.append(None)
    ids = np.arange(prod(dims)).reshape(dims)
    keep = [i for i, n in enumerate(names) if n is None]
    vary = [i for i, n in enumerate(names) if n is not None]
    group_size = prod(dims[i] for i in vary)
    groups = ids.transpose(keep + vary).reshape(-1, group_size)
    return groups if order is None else order[groups]


def _device_order(text: str) -> np.ndarray:
    """Device id at each mesh position: an iota `[2,4]T(1,0)` (flattened) or a list `0,4,1,5`."""
    m = re.fullmatch(r"\s*\[([\d,\s]+)\]\s*(?:T\(([\d,\s]+)\))?\s*", text)
    if m:
        dims = int_list(m.group(1))
        ids = np.arange(prod(dims)).reshape(dims)
        return (ids.transpose(int_list(m.group(2))) if m.group(2) else ids).reshape(-1)
    return np.asarray(int_list(text.strip("[] ")))


def parse_replica_groups(text: str, num_devices: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Replica groups as explicit tuples of device ids, from any printed form.

    `{}` (one group of everything) needs `num_devices`, read from the module header.
    """
    text = text.strip()
    if text.startswith("mesh"):
        return tuple(tuple(int(i) for i in g) for g in _mesh_groups(text))
    if text.startswith("["):
        return tuple(tuple(int(i) for i in g) for g in _iota_groups(text))
    if text.startswith("{"):
        groups = tuple(tuple(int_list(g)) for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1]))
        groups = tuple(g for g in groups if g)
        if groups:
            return groups
        if num_devices is None:
            raise ValueError("replica_groups={} means all devices; the device count is unknown")
        return (tuple(range(num_devices)),)
    raise ValueError(f"unrecognised replica_groups: {text!r}")


def module_devices(text: str) -> int | None:
    head = text[:2000]
    parts = re.search(r"num_partitions=(\d+)", head)
    replicas = re.search(r"replica_count=(\d+)", head)
    if not parts and not replicas:
        return None
    return (int(parts.group(1)) if parts else 1) * (int(replicas.group(1)) if replicas else 1)
