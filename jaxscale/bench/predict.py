"""Predicted beside laid-out and compiled, for one built strategy: per-device state bytes and
collective bytes.

State bytes are predicted by the ZeRO calculator (`calc.memory.training_memory_per_device`,
generalised to data x fsdp x tensor) applied to the matrices, which both ZeRO and tensor
parallelism split, plus the norm scales, which nothing splits. They are compared with the
strategy's *layout* (the shard shapes its declared shardings give each state leaf) and, for the
sum of parameters, optimizer state and batch, with the compiled program's argument bytes
(`memory_analysis`). Collective bytes come from the axis modules' predictions
(`Built.predict_comm`) and are compared with the census of the compiled HLO.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxscale.analysis.memory import bytes_per_device
from jaxscale.calc.memory import training_memory_per_device
from jaxscale.config import ModelConfig
from jaxscale.parallel.compose import Built, step_shape
from jaxscale.tolerances import COMM_RTOL

F32 = 4


@dataclass(frozen=True)
class StateBytes:
    params: float
    grads: float
    optimizer: float  # Adam m and v (and optax's scalar counters when laid out)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def predicted_state(built: Built, cfg: ModelConfig) -> StateBytes:
    """Under a pipeline each device holds 1/P of the layers' parameters (and their gradients and
    Adam moments) beside the whole embedding, final norm and unembedding."""
    shape = step_shape(cfg, 0)
    matrix, norm = shape.matrix_params, shape.norm_params
    if built.plan is not None:  # one layer's parameters from two depths; the rest is outside
        one, two = step_shape(cfg.replace(n_layers=1), 0), step_shape(cfg.replace(n_layers=2), 0)
        per_m, per_n = two.matrix_params - one.matrix_params, two.norm_params - one.norm_params
        p, L = built.plan.config.stages, cfg.n_layers
        matrix = matrix - per_m * L + per_m * L / p
        norm = norm - per_n * L + per_n * L / p
    kw = dict(weight_bytes=F32, grad_bytes=F32, optimizer_bytes=2 * F32)
    split = training_memory_per_device(
        matrix,
        dp=built.zero_ways,
        tp=built.tensor_ways,
        zero_stage=built.zero_stage,
        **kw,
    )
    whole = training_memory_per_device(norm, **kw)
    return StateBytes(
        split.weights + whole.weights,
        split.gradients + whole.gradients,
        split.optimizer + whole.optimizer,
    )


def layout_state(built: Built) -> StateBytes:
    """From the strategy's declared layout: shard shapes of its parameters, gradients and
    optimizer state (nothing compiled; the argument bytes are the compiled cross-check)."""
    abstract, sh = built.abstract_state, built.state_shardings
    return StateBytes(
        bytes_per_device(abstract["params"], sh["params"]),
        bytes_per_device(abstract["params"], built.grad_shardings),
        bytes_per_device(abstract["opt_state"], sh["opt_state"]),
    )


def batch_bytes(built: Built, batch: int, seq_len: int) -> float:
    """One device's int32 token rows [B_data, T+1]."""
    return batch * (seq_len + 1) * 4 / built.data_ways


def compare_comm(measured: dict, predicted: dict, rtol: float = COMM_RTOL) -> dict[str, tuple]:
    """{op: (measured, predicted, within rtol)} over the ops either side names."""
    out = {}
    for op in sorted(set(measured) | set(predicted)):
        m, p = measured.get(op, 0.0), predicted.get(op, 0.0)
        out[op] = (m, p, abs(m - p) <= rtol * max(p, 1.0))
    return out
