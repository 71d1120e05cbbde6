"""Seed 002 ch7 `parallel_strategy_calculator.py` (ML Systems Infrastructure Tutorial), two modes.

seed-faithful reproduces the seed's printout (65.5B "actual"; 130.9 / 130.9 / 523.8 / 785.7 GB;
recommends TP2 PP16 DP2 at 43.2 GB and 421.07 GB of communication per step), defects included:
- `batch_per_gpu = B // (B // pp)` (estimate_activation_memory) is ~pp, not a batch per GPU
  (defect 6, docs/seed-notes.md "The parallelism advisor");
- the parameter count comes from the fixed shape (hidden 8192, 80 layers, vocab 128000), so
  `--params` changes only the DP communication, never the memory (defect 6);
- the volumes use the global batch and every parameter of a stage, as if one GPU did all the work;
- `dp = gpus // (tp * pp)` may leave GPUs idle.
corrected fixes them: the parameter count is `--params`, and the shape behind the activations and
the TP/PP volumes is the model's (hidden and layers as given, else derived from `--params` as the
advisor does), not the seed's fixed 8192 x 80; a GPU holds the activations of one micro-batch per
layer of its stage for min(pp, microbatches) microbatches in flight (1F1B keeps P microbatches,
seed 002 ch7 "Memory in Pipeline Parallelism"); volumes are per GPU (batch B/dp, DP over the GPU's
own 1/(tp*pp) of the parameters); TP counts the backward's two all-reduces per layer as well as the
forward's (the seed counts the forward only); a layout without a pipeline (pp=1) has no stage
boundary, hence no PP traffic; layouts that leave GPUs idle or give a replica no data are skipped.
Both keep the seed's search (tp in 1,2,4,8 within a node; pp in 1..16), its 90% fit threshold,
its "ZeRO-3" memory (optimizer divided by tp*pp*dp; weights and gradients by tp*pp -- which is
really ZeRO-1) and its ranking (TP inside a node first, then total volume).
"""

import math
from dataclasses import dataclass, replace

from jaxscale.calc.advisor_rules import GB, RuleAdvice
from jaxscale.checks import positive, positive_ints

SEED002_TP = (1, 2, 4, 8)  # find_optimal_strategy's search
SEED002_PP = (1, 2, 4, 8, 16)  # same
SEED002_FIT_FRACTION = 0.9  # "90% threshold" (same)
SEED002_EP_DEGREE = 8  # its MoE advice always assumes 8-way EP (its main)


@dataclass(frozen=True)
class Seed002Shape:
    """The seed's fixed model shape (its ModelConfig)."""

    hidden: int = 8192
    layers: int = 80
    vocab: int = 128000
    ffn_ratio: float = 4.0
    num_experts: int = 1  # the seed multiplies every FFN by this under --moe
    dtype_bytes: int = 2  # bf16 weights, gradients, activations (TrainingConfig)

    @property
    def param_count(self) -> int:
        """vocab*h + layers*(4h^2 + 2*h*int(ratio*h)*experts) (estimate_model_memory)."""
        h = self.hidden
        ffn = 2 * h * int(h * self.ffn_ratio) * self.num_experts
        return self.vocab * h + self.layers * (4 * h * h + ffn)


@dataclass(frozen=True)
class Seed002Row:
    """One layout: per-GPU memory (GB) and the seed's communication volumes (GB per step)."""

    tp: int
    pp: int
    dp: int
    params_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    fits: bool
    tp_comm_gb: float
    pp_comm_gb: float
    dp_comm_gb: float
    tp_intra_node: bool

    @property
    def memory_per_gpu_gb(self) -> float:
        return self.params_gb + self.grads_gb + self.optimizer_gb + self.activations_gb

    @property
    def total_comm_gb(self) -> float:
        return self.tp_comm_gb + self.pp_comm_gb + self.dp_comm_gb


@dataclass(frozen=True)
class Seed002Result:
    seed_faithful: bool
    param_count: float  # what the memory is computed from
    params_gb: float  # whole-model totals before any split
    grads_gb: float
    optimizer_gb: float
    rows: tuple[Seed002Row, ...]
    best: Seed002Row | None
    memory_per_gpu_gb: float  # the limit
    moe_advice: str = ""  # the seed's fixed EP paragraph under --moe
    skipped: tuple[str, ...] = ()  # corrected mode: layouts it refuses, and why
    error: str | None = None  # seed-faithful: the seed's code raises here

    @property
    def total_gb(self) -> float:
        return self.params_gb + self.grads_gb + self.optimizer_gb


def _activations_gb(shape, batch, seq, tp, pp, dp, micro_batch, seed_faithful) -> float:
    if seed_faithful:  # estimate_activation_memory, integer arithmetic kept
        batch_per_gpu = batch // (batch // pp)
        per_layer = 10 * batch_per_gpu * seq * shape.hidden // tp
        return per_layer * (shape.layers // pp) * shape.dtype_bytes / GB
    per_layer = 10 * micro_batch * seq * shape.hidden / tp  # same "10 values per token" estimate
    in_flight = min(pp, batch // (dp * micro_batch))  # 1F1B: stage 0 holds P microbatches
    return per_layer * math.ceil(shape.layers / pp) * in_flight * shape.dtype_bytes / GB


def _comm_gb(shape, params_b, batch, seq, tp, pp, dp, seed_faithful) -> tuple[float, float, float]:
    """TP, PP, DP GB per step (calculate_communication_volume); corrected: per GPU, batch B/dp, DP
    over 1/(tp*pp), TP all-reduces of the backward too, no PP traffic without a pipeline."""
    b = batch if seed_faithful else batch / dp
    act_bytes = b * seq * shape.hidden * shape.dtype_bytes
    all_reduces = 2 if seed_faithful else 4  # per layer: forward 2 (the seed's), backward 2
    tp_gb = all_reduces * 2 * act_bytes * (tp - 1) / tp * shape.layers / pp / GB  # ring: 2(t-1)/t
    pp_gb = 2 * act_bytes / GB  # activations forward, gradients backward
    if pp == 1 and not seed_faithful:
        pp_gb = 0.0  # one stage: no boundary to cross
    params_per_gpu = params_b * 1e9 / (pp if seed_faithful else tp * pp)
    dp_gb = 2 * params_per_gpu * shape.dtype_bytes * (dp - 1) / dp / GB
    return tp_gb, pp_gb, dp_gb


def seed002_calculator(
    params_b: float = 70,
    gpus: int = 64,
    memory_gb: float = 80,
    batch_size: int = 512,
    seq_len: int = 4096,
    *,
    moe: bool = False,
    num_experts: int = 64,
    gpus_per_node: int = 8,
    micro_batch: int = 1,
    hidden: int = 0,
    layers: int = 0,
    seed_faithful: bool = False,
) -> Seed002Result:
    """The seed's `find_optimal_strategy` + `print_results` ranking; defaults are its CLI's.
    hidden, layers: the model's shape for the corrected activations and volumes (0: the seed's);
    seed-faithful mode always uses the seed's fixed shape."""
    positive(params_b=params_b, memory_gb=memory_gb)
    positive_ints(
        gpus=gpus,
        batch_size=batch_size,
        seq_len=seq_len,
        num_experts=num_experts,
        gpus_per_node=gpus_per_node,
        micro_batch=micro_batch,
    )
    shape = Seed002Shape(num_experts=num_experts if moe else 1)
    if not seed_faithful:
        shape = replace(shape, hidden=hidden or shape.hidden, layers=layers or shape.layers)
    n = shape.param_count if seed_faithful else params_b * 1e9
    params_gb = n * shape.dtype_bytes / GB
    optimizer_gb = n * 4 * 2 / GB  # Adam m and v in fp32
    rows, skipped, error = [], [], None
    for tp in SEED002_TP:
        if tp > gpus_per_node:
            continue
        for pp in SEED002_PP:
            if tp * pp > gpus:
                continue
            dp = gpus // (tp * pp)
            if not seed_faithful and tp * pp * dp != gpus:
                skipped.append(f"TP{tp} PP{pp}: {gpus - tp * pp * dp} GPUs idle")
                continue
            if not seed_faithful and batch_size % (dp * micro_batch):
                skipped.append(f"TP{tp} PP{pp} DP{dp}: batch {batch_size} not divisible")
                continue
            if seed_faithful and batch_size // pp == 0:
                error = (
                    f"ZeroDivisionError: batch_size // (batch_size // {pp}) with batch {batch_size}"
                )
                break
            act = _activations_gb(
                shape, batch_size, seq_len, tp, pp, dp, micro_batch, seed_faithful
            )
            tp_c, pp_c, dp_c = _comm_gb(
                shape, params_b, batch_size, seq_len, tp, pp, dp, seed_faithful
            )
            mem = (params_gb / (tp * pp), params_gb / (tp * pp), optimizer_gb / (tp * pp) / dp, act)
            rows.append(
                Seed002Row(
                    tp,
                    pp,
                    dp,
                    *mem,
                    fits=sum(mem) < memory_gb * SEED002_FIT_FRACTION,
                    tp_comm_gb=tp_c,
                    pp_comm_gb=pp_c,
                    dp_comm_gb=dp_c,
                    tp_intra_node=tp <= gpus_per_node,
                )
            )
        if error:
            break
    valid = sorted(
        (r for r in rows if r.fits), key=lambda r: (not r.tp_intra_node, r.total_comm_gb)
    )
    moe_advice = ""
    if moe:  # the seed's main, verbatim numbers
        moe_advice = (
            f"With {num_experts} experts and {SEED002_EP_DEGREE}-way EP: "
            f"{num_experts // SEED002_EP_DEGREE} experts per GPU, 2 all-to-all per layer; "
            "use EP instead of/in addition to TP for the FFN experts"
        )
    return Seed002Result(
        seed_faithful=seed_faithful,
        param_count=n,
        params_gb=params_gb,
        grads_gb=params_gb,
        optimizer_gb=optimizer_gb,
        rows=tuple(rows),
        best=None if error or not valid else valid[0],
        memory_per_gpu_gb=memory_gb,
        moe_advice=moe_advice,
        skipped=tuple(skipped),
        error=error,
    )


def seed002_advice(result: Seed002Result) -> RuleAdvice:
    """The calculator's recommendation as a row of the side-by-side table."""
    mode = "seed-faithful" if result.seed_faithful else "corrected"
    common = {
        "rule": f"seed 002 calc ({mode})",
        "source": "seed 002 ch7 parallel_strategy_calculator.py",
    }
    notes = []
    if result.seed_faithful:
        notes.append(f"memory from the fixed shape ({result.param_count / 1e9:.1f}B), not --params")
    if result.moe_advice:
        notes.append(result.moe_advice)
    best = result.best
    if best is None:
        strategy = "no configuration fits" if result.error is None else "crashes"
        return RuleAdvice(
            **common,
            strategy=strategy,
            tp=None,
            pp=None,
            dp=None,
            zero_stage=None,
            notes=tuple(notes),
            error=result.error,
        )
    return RuleAdvice(
        **common,
        strategy=f"TP {best.tp} x PP {best.pp} x DP {best.dp}",
        tp=best.tp,
        pp=best.pp,
        dp=best.dp,
        zero_stage=1,  # its "ZeRO-3" shards only the optimizer state over dp
        per_gpu_bytes=best.memory_per_gpu_gb * GB,
        reason=f"fits under 90% of memory with least volume, {best.total_comm_gb:.2f} GB/step",
        notes=tuple(notes),
    )
