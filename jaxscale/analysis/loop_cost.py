"""A compiled program's FLOPs and bytes accessed with every loop trip counted.

XLA's cost analysis (`compiled.cost_analysis()`) counts a while loop's body once, so a program
that scans its layers reports one layer's work: its figures cannot be compared with the same
step's unrolled program. `loop_cost` re-costs each loop body as a module of its own (the body
made the entry computation) and adds (known trips - 1) x that body to the whole program's count.
Loops must not nest (a nested loop's trips would multiply): the training step's layer scans do
not; a loop without a known trip count is refused.
"""

from __future__ import annotations

import re

import jax

_WHILE = re.compile(r"while\([^\n]*?body=%?([\w.\-]+)")
_TRIPS = re.compile(r'known_trip_count":\{"n":"(\d+)"')


def _cost(text: str) -> dict:
    # XLA's HloCostAnalysis on a module parsed from text: the same analysis as
    # compiled.cost_analysis(), on a module we choose (jaxlib has no public door to it)
    from jax._src.lib import xla_client as xc
    from jaxlib import _hlo

    module = _hlo.hlo_module_from_text(text)
    return xc._xla.hlo_module_cost_analysis(jax.devices()[0].client, module)


def _computations(text: str) -> dict[str, str]:
    """Each computation's body text, by name."""
    found = re.finditer(r"^(?:ENTRY )?%?([\w.\-]+) [^\n]*\{\n(.*?)^\}", text, re.M | re.S)
    return {m.group(1): m.group(2) for m in found}


def _has_loop(name: str, comps: dict[str, str], seen: set[str]) -> bool:
    """Whether computation `name`, or any it calls (fusions, calls, branches), holds a loop."""
    if name in seen or name not in comps:
        return False
    seen.add(name)
    body = comps[name]
    if _WHILE.search(body):
        return True
    called = set(re.findall(r"%([\w.\-]+)", body)) & comps.keys()
    return any(_has_loop(c, comps, seen) for c in called)


def _entry_free_header(text: str) -> str:
    """The module with its header's `input_output_alias` and `entry_computation_layout` left
    out: both describe the entry's parameters and outputs (a donated training state's aliases),
    and a loop body made the entry has others."""
    header, sep, rest = text.partition("\n")
    for attr in ("input_output_alias", "entry_computation_layout"):
        start = header.find(f", {attr}={{")
        if start < 0:
            continue
        depth, i = 0, header.index("{", start)
        while True:  # to the matching brace
            depth += {"{": 1, "}": -1}.get(header[i], 0)
            if depth == 0:
                break
            i += 1
        header = header[:start] + header[i + 1 :]
    return header + sep + rest


def loop_cost(compiled) -> dict[str, float]:
    """{"flops", "bytes accessed"} of a compiled program, each loop body counted once per trip."""
    text = compiled.as_text()
    whole = _cost(text)
    total = {k: float(whole[k]) for k in ("flops", "bytes accessed")}
    comps = _computations(text)
    for line in text.splitlines():
        m = _WHILE.search(line)
        if m is None:
            continue
        trips = _TRIPS.search(line)
        if trips is None:
            raise ValueError(f"a loop without a known trip count: {line.strip()[:120]}")
        body = m.group(1)
        if _has_loop(body, comps, set()):
            raise ValueError(f"nested loops in {body}: their trips would multiply")
        as_entry = re.sub(r"^ENTRY ", "", _entry_free_header(text), flags=re.M)
        as_entry = re.sub(rf"^(%?{re.escape(body)} )", r"ENTRY \1", as_entry, flags=re.M)
        cost = _cost(as_entry)
        for k in total:
            total[k] += (int(trips.group(1)) - 1) * float(cost[k])
    return total
