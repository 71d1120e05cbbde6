"""The measurement spine: compile a function for abstract inputs and report what the compiler did.

One report per compiled program: per-device memory fields, FLOPs and bytes accessed per device
(cost_analysis is per device for SPMD programs), compile time, and the census of collectives
parsed from the partitioned HLO. The calculators in `jaxscale.calc` predict the same quantities;
the bench and the tests compare the two. Works for the fake CPU mesh and an abstract TPU topology
alike, because nothing here executes the program.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from jaxscale import compat
from jaxscale.analysis import hlo
from jaxscale.analysis.memory import MemoryReport, memory_report


@dataclass(frozen=True)
class CompiledReport:
    compile_s: float  # lowering + compilation, wall seconds
    memory: MemoryReport
    flops: float  # per device; a loop body is counted once (unroll loops to count every trip)
    bytes_accessed: float  # per device
    collectives: tuple[hlo.Collective, ...]
    optimal_seconds: float | None = None  # the TPU compiler's own estimate, where given

    def collective_totals(self, normalized: bool = True) -> dict[str, hlo.OpTotals]:
        cs = hlo.normalize(list(self.collectives)) if normalized else list(self.collectives)
        return hlo.summarize(cs)


def compile_with_report(jitted, *abstract_args):
    """(compiled, report) for `jitted` (a jax.jit-wrapped function) at the given abstract args."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*abstract_args).compile()
    compile_s = time.perf_counter() - t0
    cost = compat.cost_analysis(compiled)
    report = CompiledReport(
        compile_s=compile_s,
        memory=memory_report(compiled),
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        collectives=tuple(hlo.collectives_of(compiled)),
        optimal_seconds=cost.get("optimal_seconds"),
    )
    return compiled, report
