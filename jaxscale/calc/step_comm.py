"""Predicted collectives of one training step, per op: bytes per device (pure Python, no jax).

The byte convention is the census's (jaxscale/analysis/hlo.py): all-reduce counts its operand,
all-gather its output (the gathered buffer), reduce-scatter its input. Counts are not predicted:
XLA combines independent collectives into tuple-shaped ones, which changes the count but not the
bytes. Inputs are the step's shapes; everything is f32 unless `act_bytes`/`grad_bytes` say so.

Notation: M = parameters in matrices (every one has an embed axis, split by ZeRO, and a
heads/mlp/vocab axis, split by tensor parallelism), Nn = norm-scale parameters (replicated),
n = ZeRO/data group size, t = tensor group size, L layers, ACT = B_local*T*D*4 bytes (one
residual-stream activation), ROW = B_local*T*4 bytes.

Manual strategies (jaxscale/parallel), per step:
  data group   loss pmean: AR 4 B
               stage 0/1  AR grads 4(M/t + Nn)
               stage 2    RS grads 4M/t, AR norm grads 4Nn
               stage 3    AG params 4M/t (forward, each layer once), RS grads 4M/t (autodiff),
                          AR norm grads 4Nn
               stage 1/2  AG params after the update 4M/t
               grad norm  AR one f32 per leaf split over any axis (stage 2/3: every matrix leaf)
  tensor group megatron   AR ACT x (4L + 2) [2 per layer forward (g), 2 backward (f), embedding,
                          unembedding input] + 3 ROW (cross-entropy). The norm scales' gradients
                          need nothing here: the block's input gradient is summed (f) before the
                          norm's backward sees it.
               sequence   the ACT all-reduces become AG + RS of ACT each; norms now run on
                          sequence shards, so their gradients are all-reduced over tensor (4Nn),
                          in the same op as the data group's under ZeRO-3 (autodiff reduces a
                          replicated parameter's gradient over all axes at once)
               gather_output  megatron's, plus per layer AG of the fused QKV and of the MLP
                          activation forward and RS of both backward
Auto path (GSPMD): DP = AR 4(M + Nn); TP like megatron; FSDP's choices are the compiler's
(reported, compared where they follow the textbook: AG 2 x 4M/n ... see `auto_step`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

F32 = 4


@dataclass(frozen=True)
class StepShape:
    matrix_params: int  # M
    norm_params: int  # Nn
    matrix_leaves: int
    norm_leaves: int
    n_layers: int
    tokens_local: int  # B_local * T on one device (rows of the data shard x sequence)
    d_model: int
    qkv_width: int = 0  # (H + 2G) * K: the fused QKV output (gather_output mode)
    d_ff: int = 0


def manual_step(shape: StepShape, *, n: int, t: int, stage: int, tp_mode: str | None) -> dict:
    """{op: bytes per device} for jaxscale.parallel.manual.build(stage, tp_mode)."""
    out: dict[str, float] = defaultdict(float)
    M, Nn = shape.matrix_params / t, shape.norm_params
    if n > 1:
        out["all-reduce"] += F32  # the loss pmean
        if stage in (0, 1):
            out["all-reduce"] += F32 * (M + Nn)
        if stage == 2:
            out["reduce-scatter"] += F32 * M
            out["all-reduce"] += F32 * Nn
        if stage == 3:
            out["all-gather"] += F32 * M
            out["reduce-scatter"] += F32 * M
            out["all-reduce"] += F32 * Nn
        if stage in (1, 2):
            out["all-gather"] += F32 * M
    # the gradient norm: one scalar psum per leaf that is split over some axis
    split = (stage in (2, 3) and n > 1) or t > 1
    out["all-reduce"] += F32 * shape.matrix_leaves * split
    if t > 1:
        act = F32 * shape.tokens_local * shape.d_model
        row = F32 * shape.tokens_local
        n_act = 4 * shape.n_layers + 2
        if tp_mode == "sequence":
            out["all-gather"] += act * n_act
            out["reduce-scatter"] += act * n_act
            if not (stage == 3 and n > 1):  # else folded into the data group's norm all-reduce
                out["all-reduce"] += F32 * Nn
        else:
            out["all-reduce"] += act * n_act
        if tp_mode == "gather_output":
            gathered = F32 * shape.tokens_local * (shape.qkv_width + shape.d_ff) * shape.n_layers
            out["all-gather"] += gathered
            out["reduce-scatter"] += gathered
        out["all-reduce"] += 3 * row
    return dict(out)


def compare(measured: dict, predicted: dict, rtol: float = 0.05) -> dict[str, tuple]:
    """{op: (measured, predicted, within rtol)} over the ops either side names."""
    ops = sorted(set(measured) | set(predicted))
    result = {}
    for op in ops:
        m, p = measured.get(op, 0.0), predicted.get(op, 0.0)
        ok = abs(m - p) <= rtol * max(p, 1.0)
        result[op] = (m, p, ok)
    return result
