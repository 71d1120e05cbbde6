"""The parallelism advisor: jaxscale's own recommendation, beside the four seed rule sets.

Own recommendation: enumerate every layout tp x pp x dp (x ep with an MoE model) that uses all the
GPUs, with tp dividing the node size, pp at most the number of layers and the global batch
divisible into dp replicas of whole micro-batches, under each ZeRO stage; keep those whose per-GPU
memory fits in the usable fraction of the GPU; rank them by estimated step time -- compute
stretched by the pipeline bubble, plus every communication on its link (advisor_model.py) -- and
explain the choice. The step time ranks layouts; it is not a prediction of wall-clock time.

Context parallelism (a cp degree splitting each sequence, in the ring, all-gather or Ulysses form)
is considered when the sequence is long, by one rule: the activations at this --seq-len do not fit
per GPU without it. Precisely, no layout without CP fits even with full activation recomputation
(the least activation memory it can reach), while some layout's model state alone does fit: what
overflows is the activations, which CP divides by cp (its attention traffic comes on top). A
sequence that recomputation alone makes fit is not long, and a model whose state does not fit is
not helped by splitting the sequence; both keep the advice without CP, as before. When the rule
holds, every cp dividing the GPUs a tensor group leaves (with 2cp dividing the sequence, the
zigzag split's chunks) is enumerated in each allowed form (Ulysses only where heads and kv heads
per tensor shard divide by cp), and the ranking chooses among all the layouts, with and without
CP. `context="always"` enumerates CP layouts whatever fits, "never" never; an MoE model gets none
(the lab's context axis takes an MoE model only with dropless routing). The search space is
advisor_layouts.py's, the rule advisor_context.py's.
"""

import math
from dataclasses import dataclass, replace

from jaxscale.calc.advisor_context import (
    ContextDecision,
    context_decision,
)
from jaxscale.calc.advisor_layouts import (
    RECOMPUTE_CHOICES,
    candidate_layouts,
)
from jaxscale.calc.advisor_model import (
    Hardware,
    Layout,
    LayoutCost,
    Workload,
    attention_shape,
    evaluate,
    model_shape,
)
from jaxscale.calc.advisor_rules import (
    GB,
    RuleAdvice,
    seed000_decision_tree,
    seed001_recommend,
    seed004_config,
)
from jaxscale.calc.advisor_seed002 import Seed002Result, seed002_advice, seed002_calculator
from jaxscale.checks import positive, positive_ints

_ZERO_WHY = {
    0: "every replica keeps the full model state",
    1: "shards the optimizer state over the replicas",
    2: "shards optimizer state and gradients over the replicas, at the traffic of an all-reduce",
    3: "also shards the weights, at 1.5x the traffic of an all-reduce",
}


_CP_WHY = {
    "ring": "K/V blocks travel the ring, 2(cp-1) sends forward and the backward's (overlap with the"
    " block FLOPs, its point, is not modelled)",
    "gather": "one all-gather of K and of V per layer (Llama 3's form), reduce-scatters backward",
    "ulysses": "4 all-to-alls per layer forward and 4 backward, heads split over the group"
    " (DeepSpeed-Ulysses)",
}


@dataclass(frozen=True)
class RuleComparison:
    advice: RuleAdvice
    cost: LayoutCost | None  # our model applied to the rule's layout; None if it has none


@dataclass(frozen=True)
class AdviceReport:
    workload: Workload
    hardware: Hardware
    hidden: int
    layers: int
    best: LayoutCost | None
    ranked: tuple[LayoutCost, ...]  # the layouts that fit, best first
    smallest: LayoutCost  # the layout needing the least memory, fitting or not
    layouts_considered: int
    rules: tuple[RuleComparison, ...]
    seed002: Seed002Result
    reasoning: tuple[str, ...]
    context: ContextDecision | None = None


def validate(workload: Workload, hw: Hardware) -> None:
    """Raise ValueError naming the first bad input."""
    w = workload
    shape = {n: getattr(w, n) for n in ("hidden", "layers") if getattr(w, n) != 0}  # 0 = derive
    positive_ints(
        seq=w.seq,
        batch=w.batch,
        micro_batch=w.micro_batch,
        **shape,
        num_experts=w.num_experts,
        top_k=w.top_k,
    )
    positive(params=w.n_params)
    heads = {n: getattr(w, n) for n in ("heads", "kv_heads") if getattr(w, n) != 0}
    positive_ints(**heads)
    n_heads, n_kv_heads, _ = attention_shape(w)
    if n_heads % n_kv_heads:
        raise ValueError(f"kv_heads={n_kv_heads} does not divide heads={n_heads}")
    if w.top_k > w.num_experts:
        raise ValueError(f"top_k={w.top_k} exceeds num_experts={w.num_experts}")
    if w.micro_batch > w.batch:
        raise ValueError(f"micro_batch={w.micro_batch} exceeds batch={w.batch}")
    positive_ints(gpus=hw.num_gpus, gpus_per_node=hw.gpus_per_node)
    g, node = hw.num_gpus, hw.gpus_per_node
    if (g > node and g % node) or (g < node and node % g):
        raise ValueError(
            f"{g} GPUs do not factor into nodes of {node}: use a multiple of {node}"
            f" or a divisor of it"
        )
    positive(
        **{
            n: getattr(hw, n)
            for n in (
                "gpu_memory_bytes",
                "intra_node_bytes_per_s",
                "inter_node_bytes_per_s",
                "peak_flops",
            )
        }
    )
    for name in ("usable_fraction", "assumed_mfu"):
        if not 0 < getattr(hw, name) <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {getattr(hw, name)!r}")


def _rank_key(cost: LayoutCost):
    # Step times equal up to rounding (ZeRO 0-2 move the same bytes) go to the smaller footprint.
    return (round(cost.step_s, 6), cost.memory.total, cost.layout.zero_stage, cost.layout.recompute)


def _rule_cost(
    workload: Workload, hw: Hardware, advice: RuleAdvice, recompute: str
) -> LayoutCost | None:
    """Our model applied to a rule's layout, with recomputation where the choice allows it."""
    degrees = (advice.tp, advice.pp, advice.dp)
    if advice.error or None in degrees or min(degrees) < 1:
        return None
    costs = [
        evaluate(workload, hw, Layout(*degrees, advice.zero_stage or 0, recompute=rc))
        for rc in RECOMPUTE_CHOICES[recompute]
    ]
    return min(costs, key=lambda c: (not c.fits, _rank_key(c)))


def advise(
    workload: Workload,
    hw: Hardware,
    *,
    recompute: str = "auto",
    seed_faithful: bool = False,
    context: str = "auto",
    cp_form: str = "auto",
) -> AdviceReport:
    """recompute: "auto" lets the ranking choose full activation recomputation per layout (it costs
    a third more compute), "never" or "always" fix it. context: "auto" considers context
    parallelism by the long-sequence rule (module docstring), "always" or "never" decide;
    cp_form: the forms it may take ("auto": ring, gather and ulysses)."""
    validate(workload, hw)
    hidden, layers = model_shape(workload)
    costs = [
        evaluate(workload, hw, layout) for layout in candidate_layouts(workload, hw, recompute)
    ]
    decision = context_decision(workload, hw, context, cp_form)
    if decision.considered:
        split = candidate_layouts(workload, hw, recompute, decision.forms)
        costs += [evaluate(workload, hw, layout) for layout in split if layout.cp > 1]
    if not costs:
        raise ValueError(
            f"no layout of {hw.num_gpus} GPUs (--gpus) splits the batch of {workload.batch} "
            f"(--batch-size) into whole micro-batches of {workload.micro_batch} (--micro-batch)"
        )
    ranked = tuple(sorted((c for c in costs if c.fits), key=_rank_key))
    smallest = min(costs, key=lambda c: c.memory.total)
    gpu_gb = hw.gpu_memory_bytes / GB
    seed002 = seed002_calculator(
        workload.n_params / 1e9,
        hw.num_gpus,
        gpu_gb,
        workload.batch,
        workload.seq,
        moe=workload.is_moe,
        num_experts=workload.num_experts,
        gpus_per_node=hw.gpus_per_node,
        micro_batch=workload.micro_batch,
        hidden=hidden,
        layers=layers,
        seed_faithful=seed_faithful,
    )
    advices = (
        seed000_decision_tree(workload.n_params, hw.num_gpus, gpu_gb),
        seed001_recommend(workload.n_params, hw.num_gpus, hw.gpus_per_node, gpu_gb),
        seed004_config(workload.n_params, hw.num_gpus),
        seed002_advice(seed002),
    )
    rules = tuple(RuleComparison(a, _rule_cost(workload, hw, a, recompute)) for a in advices)
    best = ranked[0] if ranked else None
    report = AdviceReport(
        workload,
        hw,
        hidden,
        layers,
        best,
        ranked,
        smallest,
        len(costs),
        rules,
        seed002,
        (),
        decision,
    )
    return replace(report, reasoning=explain(report))


def explain(report: AdviceReport) -> tuple[str, ...]:
    """Why the recommended layout, one sentence per decision."""
    w, hw, best = report.workload, report.hardware, report.best
    usable_gb = hw.usable_bytes / GB
    lines = [
        f"{len(report.ranked)} of {report.layouts_considered} layouts fit in {usable_gb:.1f} GB"
        f" per GPU ({hw.usable_fraction:.0%} of {hw.gpu_memory_bytes / GB:g} GB)."
    ]
    if report.context is not None and report.context.considered:
        forms = ", ".join(report.context.forms)
        lines.append(f"Context parallelism ({forms}) considered: {report.context.reason}.")
    if best is None:
        s = report.smallest
        lines.append(
            f"Nothing fits: the smallest, {s.layout.label()}, needs {s.memory.total / GB:.1f} GB"
            " per GPU. More or larger GPUs would help"
            + ("" if s.layout.recompute else ", or activation recomputation")
            + (", or a smaller --micro-batch" if w.micro_batch > 1 else "")
            + "."
        )
        return tuple(lines)
    lay, comms = best.layout, {c.kind: c for c in best.comms}
    if lay.tp > 1:
        c = comms["TP"]
        lines.append(
            f"TP={lay.tp} inside a node: its all-reduces (every layer, every micro-batch) stay on"
            f" NVLink, {c.bytes_per_gpu / GB:.1f} GB in {c.seconds:.2f} s per step; it divides"
            f" weights and most activations by {lay.tp}."
        )
    else:
        lines.append(
            "TP=1: memory fits without splitting layers, and TP traffic per GPU grows with"
            " the degree (2(t-1)/t of every activation, every layer)."
        )
    if lay.pp > 1:
        c, m = comms["PP"], best.microbatches
        where = "across nodes" if c.inter_node else "inside a node"
        lines.append(
            f"PP={lay.pp} {where}, {math.ceil(report.layers / lay.pp)} layers per stage: bubble"
            f" (P-1)/(M+P-1) = {lay.pp - 1}/{m + lay.pp - 1} = {best.bubble_fraction:.1%} with"
            f" M={m} micro-batches per replica; point-to-point {c.bytes_per_gpu / GB:.1f} GB."
        )
    if lay.dp * lay.cp > 1:
        c = comms["DP"]
        link = "InfiniBand" if c.inter_node else "NVLink"
        group = f" over the {lay.dp * lay.cp} GPUs of DP x CP" if lay.cp > 1 else ""
        lines.append(
            f"DP={lay.dp} with ZeRO-{lay.zero_stage}{group}, which {_ZERO_WHY[lay.zero_stage]}:"
            f" {c.bytes_per_gpu / GB:.2f} GB per GPU over {link}, {c.seconds:.2f} s per step."
        )
    if lay.cp > 1:
        c = comms["CP"]
        link = "InfiniBand" if c.inter_node else "NVLink"
        lines.append(
            f"CP={lay.cp} ({lay.cp_form}): each GPU keeps {w.seq // lay.cp} of every sequence's"
            f" {w.seq} tokens, so activations are divided by {lay.cp}; {_CP_WHY[lay.cp_form]};"
            f" {c.bytes_per_gpu / GB:.1f} GB per GPU over {link}, {c.seconds:.2f} s per step."
        )
    if lay.ep > 1:
        c = comms["EP"]
        lines.append(
            f"EP={lay.ep}: {w.num_experts // lay.ep} experts per GPU, tokens routed by"
            f" all-to-all, {c.bytes_per_gpu / GB:.1f} GB in {c.seconds:.2f} s per step."
        )
    if lay.recompute:
        lines.append(
            "Full activation recomputation: layers keep only their inputs, at one extra forward"
            f" pass (8N instead of 6N FLOPs per token); {best.memory.activations / GB:.1f} GB of"
            " activations."
        )
    # The runner-up with different degrees says more than the same layout at another ZeRO stage.
    degrees = (lay.tp, lay.pp, lay.dp, lay.ep, lay.cp)
    others = [
        c
        for c in report.ranked[1:]
        if (c.layout.tp, c.layout.pp, c.layout.dp, c.layout.ep, c.layout.cp) != degrees
    ]
    if others:
        nxt = others[0]
        extra = nxt.step_s / best.step_s - 1
        lines.append(
            f"Next best: {nxt.layout.label()} at {nxt.step_s:.2f} s per step (+{extra:.1%})."
        )
    return tuple(lines)
