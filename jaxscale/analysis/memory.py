"""Per-device memory of a compiled program, from `compiled.memory_analysis()`.

Every field is reported as the compiler gives it (bytes, per device). The peak is estimated as

    peak = arguments + outputs + temporaries - aliased

(aliased bytes are outputs written in place over donated arguments, so they are counted once).
The backend's own `peak_memory_in_bytes`, where it exists, is reported beside it but not trusted
alone: on CPU it can be smaller than the temporaries.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

_FIELDS = {
    "argument": "argument_size_in_bytes",
    "output": "output_size_in_bytes",
    "temp": "temp_size_in_bytes",
    "alias": "alias_size_in_bytes",
    "generated_code": "generated_code_size_in_bytes",
    "host_argument": "host_argument_size_in_bytes",
    "host_output": "host_output_size_in_bytes",
    "host_temp": "host_temp_size_in_bytes",
    "host_alias": "host_alias_size_in_bytes",
    "backend_peak": "peak_memory_in_bytes",
}


@dataclass(frozen=True)
class MemoryReport:
    argument: int
    output: int
    temp: int
    alias: int
    generated_code: int
    host_argument: int = 0
    host_output: int = 0
    host_temp: int = 0
    host_alias: int = 0
    backend_peak: int | None = None

    @property
    def peak(self) -> int:
        """arguments + outputs + temporaries - aliased (the formula; see the module docstring)."""
        return self.argument + self.output + self.temp - self.alias

    def as_dict(self) -> dict:
        return {**asdict(self), "peak": self.peak, "peak_formula": "argument+output+temp-alias"}


def memory_report(compiled) -> MemoryReport:
    stats = compiled.memory_analysis()
    values = {}
    for key, attr in _FIELDS.items():
        value = getattr(stats, attr, None)
        values[key] = int(value) if value is not None else (None if key == "backend_peak" else 0)
    return MemoryReport(**values)


def bytes_per_device(abstract_tree, shardings_tree) -> int:
    """Bytes one device holds of a sharded tree (from the shardings alone; nothing compiled).

    Uses the first device's shard shape: under the even splits jaxscale requires, every device
    holds the same amount."""
    import math

    import jax

    total = 0
    for x, s in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings_tree), strict=True):
        total += math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
    return total


def host_argument_bytes(hlo_text: str) -> float:
    """Bytes of the entry parameters the compiled layout places in host memory (memory space
    S(5): pinned_host), from the module's entry_computation_layout. XLA:CPU reports no host
    figures in memory_analysis (host and device are one memory there); the layout still says
    where each argument lives, which is what an offloaded state changes."""
    from jaxscale.analysis.hlo_text import _split_top, array_shapes, matching, nbytes

    start = hlo_text.find("entry_computation_layout={(")
    if start < 0:
        return 0.0
    open_at = start + len("entry_computation_layout={")
    params = hlo_text[open_at + 1 : matching(hlo_text, open_at) - 1]
    return sum(nbytes(array_shapes(p)) for p in _split_top(params) if re.search(r":S\(5\)\}", p))
