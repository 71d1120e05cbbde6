"""Three of the seeds' parallelism rule sets, ported as pure functions (seed 002's calculator is
in `advisor_seed002.py`).

- seed 000 exercise 4: the decision tree "DP -> ZeRO 1/2/3 -> TP x PP x DP", 12 B/param
  (Exercise 4 "Parallelism Strategy Advisor", its `recommend_parallelism`);
- seed 001 `recommend_parallelism`: a size rule of thumb, TP in node, PP across nodes
  (§8 "Parallelism Trade-offs and Best Practices");
- seed 004 `get_parallelism_config`: fixed size bands (§8 "Hybrid Parallelism") and the
  strategy matrix (§3 "Parallelism Strategies").

Each returns a `RuleAdvice` with the layout exactly as the seed computes it, even where that
layout leaves GPUs idle or has a zero degree. The seed's mistakes on a given input are listed in
`notes`; where the seed's own code would raise, `error` says so instead of raising. `jaxscale
advise` shows them side by side; docs/seed-notes.md explains each.
"""

from dataclasses import dataclass

from jaxscale.calc.memory import training_memory_per_device
from jaxscale.checks import positive, positive_ints

GB = 1e9  # the seeds use decimal gigabytes throughout


@dataclass(frozen=True)
class RuleAdvice:
    """One rule set's answer. Degrees are None where the rule gives no layout."""

    rule: str  # short name for tables, e.g. "seed 000 tree"
    source: str  # seed and section
    strategy: str  # the seed's own wording
    tp: int | None
    pp: int | None
    dp: int | None
    zero_stage: int | None
    ep: int | None = None
    per_gpu_bytes: float | None = None  # the rule's own per-GPU memory estimate, if it has one
    reason: str = ""
    notes: tuple[str, ...] = ()  # defects this input triggers
    error: str | None = None  # the seed's code raises here

    @property
    def gpus_used(self) -> int | None:
        if None in (self.tp, self.pp, self.dp):
            return None
        return self.tp * self.pp * self.dp * (self.ep or 1)


def _check(n_params: float, num_gpus: int) -> None:
    positive(n_params=n_params)
    positive_ints(num_gpus=num_gpus)


def _idle_note(advice_gpus: int, num_gpus: int) -> tuple[str, ...]:
    if advice_gpus == num_gpus:
        return ()
    return (f"layout uses {advice_gpus} of {num_gpus} GPUs (the seed never checks tp*pp*dp)",)


# --- seed 000, exercise 4 ------------------------------------------------------------------------

SEED000_BYTES_PER_PARAM = 12  # bf16 weights + bf16 grads + fp32 Adam m, v (seed 000)
_ZERO_NAMES = {1: "optimizer states", 2: "optimizer + gradients", 3: "everything"}


def seed000_decision_tree(n_params: float, num_gpus: int, gpu_memory_gb: float) -> RuleAdvice:
    """Seed 000 `recommend_parallelism` (Exercise 4): the first of DP, ZeRO-1, -2, -3 that fits,
    else its TP x PP x DP search, else "INSUFFICIENT RESOURCES"."""
    _check(n_params, num_gpus)
    common = {"rule": "seed 000 tree", "source": "seed 000 Exercise 4"}
    total_bytes = n_params * SEED000_BYTES_PER_PARAM
    gpu_bytes = gpu_memory_gb * GB
    if total_bytes <= gpu_bytes:
        reason = f"full model ({total_bytes / GB:.1f} GB) fits on one GPU"
        return RuleAdvice(
            **common,
            strategy="DATA PARALLELISM",
            tp=1,
            pp=1,
            dp=num_gpus,
            zero_stage=0,
            per_gpu_bytes=total_bytes,
            reason=reason,
        )
    for stage in (1, 2, 3):
        mem = training_memory_per_device(n_params, dp=num_gpus, zero_stage=stage)
        if mem.total <= gpu_bytes:
            reason = f"ZeRO-{stage} shards {_ZERO_NAMES[stage]} across {num_gpus} GPUs"
            return RuleAdvice(
                **common,
                strategy=f"ZeRO Stage {stage} + DATA PARALLELISM",
                tp=1,
                pp=1,
                dp=num_gpus,
                zero_stage=stage,
                per_gpu_bytes=mem.total,
                reason=reason,
            )
    # Next the seed searches tp in (1,2,4,8) x pp in (1,2,4,8,16) with dp = rest. It
    # calls that layout "ZeRO Stage 3" but divides only the optimizer state by dp (weights and
    # gradients by tp*pp): ZeRO-1. Its per-GPU memory, 4N/(tp*pp) + 8N/G bytes, is never below
    # ZeRO-3's 12N/G, which has just failed -- so the search never finds a layout and the seed
    # always ends here. tests/calc/test_advisor_rules.py runs the seed's search to show it.
    reason = f"{num_gpus} x {gpu_memory_gb:g} GB cannot hold {total_bytes / GB:.1f} GB"
    return RuleAdvice(
        **common,
        strategy="INSUFFICIENT RESOURCES",
        tp=None,
        pp=None,
        dp=None,
        zero_stage=None,
        reason=reason,
        notes=("its TP x PP search is dead code: that memory is >= ZeRO-3's, which failed",),
    )


# --- seed 001, recommend_parallelism --------------------------------------------------------------

SEED001_MEMORY_FACTOR = 20  # "params_gb * 20 < gpu_memory" rule of thumb (seed 001 §8)


def seed001_recommend(
    n_params: float, num_gpus: int, gpus_per_node: int = 8, gpu_memory_gb: float = 80
) -> RuleAdvice:
    """Seed 001 `recommend_parallelism` (§8) as written: pure DP + ZeRO-2 when 2 B/param x 20
    fits one GPU; on one node TP = node size; else TP = node, PP by size band, DP = the rest."""
    _check(n_params, num_gpus)
    common = {"rule": "seed 001 rule", "source": "seed 001 §8 recommend_parallelism"}
    params_b = n_params / 1e9
    num_nodes = num_gpus // gpus_per_node
    notes: list[str] = []
    if params_b * 2 * SEED001_MEMORY_FACTOR <= gpu_memory_gb:
        tp, pp, dp, zero, recompute = 1, 1, num_gpus, 2, False
        reason = "Model fits on single GPU, use pure DP with ZeRO-2"
    elif num_nodes == 1:
        tp = min(gpus_per_node, 8)
        pp, dp, zero, recompute = 1, num_gpus // tp, 1, True
        reason = f"Single node, use TP={tp} within node"
    else:
        if num_nodes == 0:
            notes.append(f"{num_gpus} GPUs < one node: num_nodes = 0 takes the multi-node branch")
        tp = gpus_per_node
        if params_b > 100:
            pp = min(4, num_nodes // 2)
        elif params_b > 50:
            pp = 2
        else:
            pp = 1
        zero, recompute = 2, True
        if pp == 0:
            return RuleAdvice(
                **common,
                strategy="3D parallelism",
                tp=tp,
                pp=0,
                dp=None,
                zero_stage=zero,
                notes=(*notes, "pp = min(4, num_nodes // 2) = 0"),
                error="ZeroDivisionError: num_gpus // (tp_size * pp_size) with pp_size = 0",
            )
        dp = num_gpus // (tp * pp)
        reason = (
            f"Multi-node 3D parallelism: TP={tp} (within node), PP={pp} (across nodes), DP={dp}"
        )
    notes.extend(_idle_note(tp * pp * dp, num_gpus))
    strategy = f"TP {tp} x PP {pp} x DP {dp}, ZeRO-{zero}" + (", recompute" if recompute else "")
    return RuleAdvice(
        **common,
        strategy=strategy,
        tp=tp,
        pp=pp,
        dp=dp,
        zero_stage=zero,
        reason=reason,
        notes=tuple(notes),
    )


# --- seed 004, get_parallelism_config -------------------------------------------------------------


def seed004_strategy_matrix(n_params: float) -> tuple[str, str]:
    """Seed 004's 'Strategy Selection Matrix' (§3): (best, secondary) strategy by model size."""
    if n_params < 1e9:
        return "Data Parallelism", "None needed"
    if n_params < 10e9:
        return "Data Parallelism", "Pipeline (optional)"
    if n_params < 100e9:
        return "Pipeline + Data", "Model Parallelism"
    return "Hybrid (all strategies)", "ZeRO optimization"


def seed004_config(n_params: float, num_gpus: int) -> RuleAdvice:
    """Seed 004 `get_parallelism_config` (§8) as written. Its bands (<1B, <10B, <100B, else)
    compare with '<', so exactly 1e9 is already 'medium' (TP 8). ZeRO stays at its default 0."""
    _check(n_params, num_gpus)
    common = {"rule": "seed 004 config", "source": "seed 004 §8 get_parallelism_config"}
    best, secondary = seed004_strategy_matrix(n_params)
    reason = f"strategy matrix (seed 004 §3): {best}; secondary: {secondary}"
    notes: list[str] = []
    if n_params < 1e9:
        tp, pp, dp = 1, 1, num_gpus
        strategy = "data parallelism only"
    elif n_params < 10e9:
        tp = min(8, num_gpus)
        pp, dp = 1, num_gpus // tp
        strategy = "TP + DP"
    elif n_params < 100e9:
        tp, pp = 8, min(8, num_gpus // 8)
        strategy = "full 3D parallelism"
        if pp == 0:
            return RuleAdvice(
                **common,
                strategy=strategy,
                tp=tp,
                pp=0,
                dp=None,
                zero_stage=0,
                reason=reason,
                notes=("pp = min(8, total_gpus // 8) = 0 with fewer than 8 GPUs",),
                error="ZeroDivisionError: total_gpus // (tp_size * pp_size) with pp_size = 0",
            )
        dp = num_gpus // (tp * pp)
    else:
        tp, pp, dp = 8, num_gpus // 64, 8
        strategy = "3D, virtual pipeline stages 2, sequence parallel"
        if pp == 0:
            notes.append("pp = total_gpus // 64 = 0 with fewer than 64 GPUs")
    notes.extend(_idle_note(tp * pp * dp, num_gpus))
    return RuleAdvice(
        **common,
        strategy=strategy,
        tp=tp,
        pp=pp,
        dp=dp,
        zero_stage=0,
        reason=reason,
        notes=tuple(notes),
    )
