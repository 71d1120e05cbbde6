"""Matmul FLOPs of a compiled program, read from its HLO: 2 x (result elements) x (contracted
size) for every dot, those inside fusions included. cost_analysis adds elementwise work
(softmax, norms, activations) to the same total; this is the part the model's matmul counts
(model/counts.py) predict exactly. A loop body counts once, as in cost_analysis: read programs
whose layers are unrolled."""

from math import prod

from jaxscale.analysis.hlo_text import array_shapes, int_list, parse_hlo


def matmul_flops(text: str) -> float:
    """Matmul FLOPs of the HLO module `text` (compiled.as_text())."""
    computations = parse_hlo(text)
    types = {i.name: i.result_type for body in computations.values() for i in body}
    total = 0
    for body in computations.values():
        for instr in body:
            if instr.opcode != "dot":
                continue
            ((_, out),) = array_shapes(instr.result_type)
            ((_, lhs),) = array_shapes(types[instr.operands[0]])
            contracted = int_list(instr.attrs.get("lhs_contracting_dims", "{}"))
            total += 2 * prod(out) * prod(lhs[d] for d in contracted)
    return float(total)
