"""The advisor's analytic model of one layout: per-GPU memory and communication per step.

A layout is tp x cp x pp x dp GPUs with a ZeRO stage; for an MoE model, groups of ep data-parallel
replicas split the experts; cp GPUs split each sequence (context parallelism, in one of three
forms: ring, gather, ulysses; a dense model only, as the lab's context axis). Ranks are numbered tp
fastest, then cp, then ep, then the rest of dp, then pp (Megatron's order), so a group of size n
whose members are s ranks apart spans s*n consecutive ranks and stays inside a node only if that
span does: TP (span tp) always does, because tp divides the node size; CP spans tp*cp, EP tp*ep,
DP tp*cp*dp and PP all GPUs.

Memory: model state from `training_memory_per_device` (dense part over dp x cp, expert part divided
by ep and sharded over the dp/ep replicas of each expert) plus activations. Activations per layer
and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation Recomputation", eq. 2) without
the attention-score term, which flash attention does not store: s*b*h*(10 + (8 + 16k)/tp) bytes in
16-bit (k = experts per token; 8 of the TP-sharded 24 are attention, 16 the MLP), with s the s/cp
tokens a GPU keeps under context parallelism; all-gather CP also holds one layer's gathered K and V
[b, s, G/tp, K] (the ring and Ulysses hold no whole-sequence K/V). 1F1B keeps min(pp, m)
micro-batches in flight on stage 0 (seed 002 ch7). With full recomputation a layer keeps only its
16-bit input, plus one layer's working set. Embedding and logits are not counted: they are what the
`usable_fraction` headroom is for.

Communication per GPU per step, each over the link its group spans, with no overlap assumed:
- TP: 4 all-reduces per layer per micro-batch (2 forward, 2 backward; seed 002 ch6; +2 for the
  recomputed forward), ring traffic 2(t-1)/t of the activation;
- PP: the activation forward and its gradient backward per micro-batch, plus the bubble
  (P-1)/(M+P-1) of the compute time (seed 002 ch7);
- DP: ZeRO 0/1 all-reduce the gradients, ZeRO-2 reduce-scatters them and all-gathers the weights,
  ZeRO-3 all-gathers the weights twice (forward, backward) and reduce-scatters the gradients
  (1.5x); each moves (n-1)/n of the GPU's shard per pass, n = dp x cp (context GPUs hold the
  same parameters, so they reduce gradients and shard ZeRO's state with the replicas, as
  Megatron-LM's distributed optimizer does; the lab's manual path shards ZeRO over its data axes
  alone and all-reduces the gradients over the context axis);
- EP: 4 all-to-alls per MoE layer per micro-batch (dispatch, combine; forward and backward), each
  moving (ep-1)/ep of the k routed copies of the micro-batch's tokens;
- CP: per layer per micro-batch the form's attention collectives (`calc/context.py`, the formulas
  of `jaxscale.parallel.cp.predict_comm`; +the forward's again with recomputation), as bytes sent
  on a ring.
"""

import math
from dataclasses import dataclass

from jaxscale.calc import context
from jaxscale.calc.memory import TrainingMemory, training_memory_per_device
from jaxscale.hardware import get_device

# Defaults: nodes of H100 SXM. The per-GPU figures (dense bf16 peak, memory, NVLink 450 GB/s each
# way) are jaxscale/hardware.py's. Seed 002's calculator (its HardwareConfig) has the same links,
# NVLink "900" (both ways) and InfiniBand "50" -- a figure of the cluster, not of the GPU -- and no
# FLOP/s.
GPU = get_device("h100")
INTER_NODE_BYTES_PER_S = 50e9  # one 400 Gb/s InfiniBand NIC per GPU (the seed's "50")
ASSUMED_MFU = 0.4  # fraction of peak the compute reaches; only converts FLOPs into bubble time
USABLE_FRACTION = 0.9  # seed 002 keeps 10% headroom
ASPECT_RATIO = 128  # hidden / layers of LLaMA-7B and GPT-3 (4096/32, 12288/96)
HEAD_DIM = 128  # head width when the heads are derived (LLaMA's, GPT-3's)
TP_ALL_REDUCES_PER_LAYER = 4
EP_ALL_TO_ALLS_PER_LAYER = 4


@dataclass(frozen=True)
class Workload:
    """What is trained. hidden/layers of 0 are derived from n_params (see `derive_shape`)."""

    n_params: float  # total, all experts included
    seq: int = 4096  # tokens per sequence
    batch: int = 512  # global batch, sequences per step
    micro_batch: int = 1  # sequences per forward pass on one GPU
    hidden: int = 0
    layers: int = 0
    num_experts: int = 1  # > 1: MoE, every layer's MLP is num_experts experts
    top_k: int = 1  # experts per token
    weight_bytes: float = 2  # bf16
    grad_bytes: float = 2
    optimizer_bytes: float = 8  # Adam m, v in fp32
    master_bytes: float = 0  # 4 with an fp32 master copy
    heads: int = 0  # query heads; 0: hidden / HEAD_DIM
    kv_heads: int = 0  # key/value heads (GQA); 0: as many as heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1


@dataclass(frozen=True)
class Hardware:
    num_gpus: int
    gpu_memory_bytes: float
    gpus_per_node: int = 8
    intra_node_bytes_per_s: float = GPU.link_bytes_per_s
    inter_node_bytes_per_s: float = INTER_NODE_BYTES_PER_S
    peak_flops: float = GPU.flops_per_s
    assumed_mfu: float = ASSUMED_MFU
    usable_fraction: float = USABLE_FRACTION

    @property
    def usable_bytes(self) -> float:
        return self.gpu_memory_bytes * self.usable_fraction


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int  # includes the ep replicas
    zero_stage: int
    ep: int = 1
    recompute: bool = False  # full activation recomputation: +1 forward pass, layer inputs only
    cp: int = 1  # context parallelism: GPUs splitting each sequence
    cp_form: str | None = None  # ring | gather | ulysses, with cp > 1

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def label(self) -> str:
        ep = f" EP{self.ep}" if self.ep > 1 else ""
        cp = f" CP{self.cp}-{self.cp_form}" if self.cp > 1 else ""
        recompute = " +recompute" if self.recompute else ""
        return f"TP{self.tp}{cp} PP{self.pp} DP{self.dp}{ep} ZeRO-{self.zero_stage}{recompute}"


@dataclass(frozen=True)
class Comm:
    """Bytes one GPU sends per step and seconds they take on their link."""

    kind: str  # "TP", "PP", "DP", "EP", "CP"
    bytes_per_gpu: float
    inter_node: bool
    seconds: float


@dataclass(frozen=True)
class LayoutCost:
    layout: Layout
    memory: TrainingMemory  # bytes per GPU
    fits: bool
    comms: tuple[Comm, ...]
    microbatches: int  # per replica per step
    bubble_fraction: float
    compute_s: float  # useful compute per step, excluding the bubble
    step_s: float  # compute / (1 - bubble) + all communication

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.comms)


def model_shape(workload: Workload) -> tuple[int, int]:
    """(hidden, layers): as given, else derived with layers ~ hidden/128 and n_params ~
    layers * h^2 * (4 + 8*experts) -- attention 4h^2 and an MLP of ratio 4 (8h^2) per expert;
    embeddings neglected. A given hidden or layers fixes that one and derives the other."""
    n, per_layer_h2 = workload.n_params, 4 + 8 * workload.num_experts
    hidden, layers = workload.hidden, workload.layers
    if hidden and layers:
        return hidden, layers
    if layers:
        return max(128, round(math.sqrt(n / (layers * per_layer_h2)) / 128) * 128), layers
    if not hidden:
        hidden = max(128, round((n * ASPECT_RATIO / per_layer_h2) ** (1 / 3) / 128) * 128)
    return hidden, max(1, round(n / (hidden * hidden * per_layer_h2)))


def attention_shape(workload: Workload) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim): as given, else hidden / HEAD_DIM heads, all of them kv heads."""
    hidden, _ = model_shape(workload)
    heads = workload.heads or max(1, hidden // HEAD_DIM)
    return heads, workload.kv_heads or heads, max(1, hidden // heads)


def context_shape(workload: Workload, layout: Layout) -> context.ContextShape:
    """One micro-batch's attention on one GPU of the layout's context group (16-bit)."""
    heads, kv_heads, head_dim = attention_shape(workload)
    return context.ContextShape(
        batch_local=workload.micro_batch,
        seq_len=workload.seq,
        n_heads=heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        cp=layout.cp,
        tp=layout.tp,
        remat=layout.recompute,
    )


def expert_fraction(workload: Workload) -> float:
    """Share of the parameters in expert MLPs (0 for a dense model)."""
    e = workload.num_experts
    return 0.0 if e == 1 else 8 * e / (4 + 8 * e)


def _sum(a: TrainingMemory, b: TrainingMemory) -> TrainingMemory:
    return TrainingMemory(
        a.weights + b.weights,
        a.gradients + b.gradients,
        a.optimizer + b.optimizer,
        a.master + b.master,
        a.activations + b.activations,
    )


def evaluate(workload: Workload, hw: Hardware, layout: Layout) -> LayoutCost:
    """Memory and communication of one layout (which need not use every GPU)."""
    w, t, p, d, e, c = workload, layout.tp, layout.pp, layout.dp, layout.ep, layout.cp
    hidden, layers = model_shape(w)
    state = {
        "weight_bytes": w.weight_bytes,
        "grad_bytes": w.grad_bytes,
        "optimizer_bytes": w.optimizer_bytes,
        "master_bytes": w.master_bytes,
    }
    n_expert = w.n_params * expert_fraction(w)
    n_dense = w.n_params - n_expert
    z = layout.zero_stage
    # context GPUs hold the same parameters: they join the data-parallel group (gradient
    # reduction, ZeRO's shards), the scaling book's "another kind of data parallelism"
    mem = training_memory_per_device(n_dense, dp=d * c, tp=t, pp=p, zero_stage=z, **state)
    if n_expert:
        experts = training_memory_per_device(
            n_expert / e, dp=d // e, tp=t, pp=p, zero_stage=z, **state
        )
        mem = _sum(mem, experts)

    micro = max(1, w.batch // (d * w.micro_batch))  # micro-batches per replica per step
    in_flight = min(p, micro)
    layers_per_stage = math.ceil(layers / p)
    tokens = w.micro_batch * w.seq // c  # per micro-batch on one GPU
    act_layer = tokens * hidden * (10 + (8 + 16 * w.top_k) / t)
    if layout.recompute:
        activations = 2 * tokens * hidden * layers_per_stage * in_flight + act_layer
    else:
        activations = act_layer * layers_per_stage * in_flight
    if layout.cp_form == "gather":  # one layer's gathered K and V: c blocks each
        activations += 2 * c * context_shape(w, layout).kv_block_bytes
    mem = _sum(mem, TrainingMemory(0.0, 0.0, 0.0, 0.0, activations))

    act_bytes = 2 * tokens * hidden  # one 16-bit activation of a micro-batch
    comms = []
    if t > 1:
        passes = TP_ALL_REDUCES_PER_LAYER + (2 if layout.recompute else 0)
        volume = passes * 2 * (t - 1) / t * act_bytes * layers_per_stage * micro
        comms.append(_comm("TP", volume, t, hw))
    if c > 1:
        comms.append(_comm("CP", _context_volume(w, layout) * layers_per_stage * micro, t * c, hw))
    if p > 1:
        comms.append(_comm("PP", 2 * act_bytes * micro, layout.gpus, hw))
    if d * c > 1:
        # ZeRO-0 all-reduces the gradients (reduce-scatter + all-gather of gradients); ZeRO-1/2
        # reduce-scatter the gradients and all-gather the updated weights; ZeRO-3 gathers twice.
        passes = {0: 2 * w.grad_bytes, 3: w.grad_bytes + 2 * w.weight_bytes}.get(
            z, w.grad_bytes + w.weight_bytes
        )
        shard = n_dense / (t * p) * passes * (d * c - 1) / (d * c)
        if n_expert and d // e > 1:
            shard += n_expert / (e * t * p) * passes * (d // e - 1) / (d // e)
        comms.append(_comm("DP", shard, t * c * d, hw))
    if e > 1:
        volume = (
            EP_ALL_TO_ALLS_PER_LAYER * w.top_k * act_bytes * (e - 1) / e * layers_per_stage * micro
        )
        comms.append(_comm("EP", volume, t * e, hw))

    active = w.n_params - n_expert * (1 - w.top_k / w.num_experts)
    flops = (8 if layout.recompute else 6) * active * w.batch * w.seq  # fwd 2N + bwd 4N (+ fwd)
    compute_s = flops / (layout.gpus * hw.peak_flops * hw.assumed_mfu)
    bubble = (p - 1) / (micro + p - 1)
    step_s = compute_s / (1 - bubble) + sum(c.seconds for c in comms)
    return LayoutCost(
        layout, mem, mem.total <= hw.usable_bytes, tuple(comms), micro, bubble, compute_s, step_s
    )


def _context_volume(workload: Workload, layout: Layout) -> float:
    """Bytes one GPU sends over the context group for one layer and micro-batch: the form's
    attention collectives, forward and backward (their gradients' reduction is DP's)."""
    shape = context_shape(workload, layout)
    return context.wire_bytes(context.layer_census(shape, layout.cp_form), layout.cp)


def _comm(kind: str, volume: float, span: int, hw: Hardware) -> Comm:
    """A group spanning `span` consecutive ranks leaves the node when the span does."""
    inter = span > hw.gpus_per_node
    bandwidth = hw.inter_node_bytes_per_s if inter else hw.intra_node_bytes_per_s
    return Comm(kind, volume, inter, volume / bandwidth)
