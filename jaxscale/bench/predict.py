"""Predicted vs measured for one built strategy: per-device state bytes and collective bytes.

Predictions come from the pure-Python calculators (jaxscale/calc): `training_memory_per_device`
(the ZeRO formulas, generalised to data x fsdp x tensor) applied to the matrices, which both ZeRO
and tensor parallelism split, plus the norm scales, which nothing splits; and `step_comm` for the
collectives. Measurements come from the strategy's real layout (shard shapes of its state) and from
the compiled program (memory_analysis, the HLO census).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from jaxscale.analysis.memory import bytes_per_device
from jaxscale.calc import step_comm
from jaxscale.calc.memory import training_memory_per_device
from jaxscale.config import ModelConfig
from jaxscale.model import state as model_state
from jaxscale.strategies import Built

MEMORY_RTOL = 0.02  # argument bytes and state bytes vs the prediction
COMM_RTOL = 0.05  # collective bytes per op vs the prediction (normalised census)
F32 = 4


@dataclass(frozen=True)
class StateBytes:
    params: float
    grads: float
    optimizer: float  # Adam m and v (and optax's scalar counters when measured)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def inventory(cfg: ModelConfig) -> step_comm.StepShape:
    """Matrices vs norm scales (by their logical axes), with the shapes step_comm needs."""
    shapes = jax.tree.leaves(model_state.abstract_params(cfg))
    names = jax.tree.leaves(model_state.logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    norm = [s.size for s, n in zip(shapes, names, strict=True) if "norm" in n]
    matrix = [s.size for s, n in zip(shapes, names, strict=True) if "norm" not in n]
    return step_comm.StepShape(
        matrix_params=sum(matrix), norm_params=sum(norm), matrix_leaves=len(matrix),
        norm_leaves=len(norm), n_layers=cfg.n_layers, tokens_local=0, d_model=cfg.d_model,
        qkv_width=(cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, d_ff=cfg.d_ff,
    )  # fmt: skip


def predicted_state(built: Built, cfg: ModelConfig) -> StateBytes:
    _, zero_group, tensor = built.group_sizes
    inv = inventory(cfg)
    kw = dict(weight_bytes=F32, grad_bytes=F32, optimizer_bytes=2 * F32)
    split = training_memory_per_device(inv.matrix_params, dp=zero_group, tp=tensor,
                                       zero_stage=built.zero_stage, **kw)  # fmt: skip
    whole = training_memory_per_device(inv.norm_params, **kw)
    return StateBytes(split.weights + whole.weights, split.gradients + whole.gradients,
                      split.optimizer + whole.optimizer)  # fmt: skip


def measured_state(built: Built) -> StateBytes:
    """From the strategy's real layout: shard shapes of its parameters, gradients, Adam state."""
    abstract = built.abstract_state
    sh = built.state_shardings
    return StateBytes(
        bytes_per_device(abstract["params"], sh["params"]),
        bytes_per_device(abstract["params"], built.grad_shardings),
        bytes_per_device(abstract["opt_state"], sh["opt_state"]),
    )


def predicted_collectives(built: Built, cfg: ModelConfig, batch: int, seq_len: int):
    """({op: bytes per device}, None) or (None, why not predicted)."""
    data, zero_group, tensor = built.group_sizes
    inv = inventory(cfg)
    shape = step_comm.StepShape(**{**inv.__dict__, "tokens_local": batch // data * seq_len})
    case = built.case
    if case.path == "manual":
        tp_mode = case.tp_mode or ("megatron" if tensor > 1 else None)
        return step_comm.manual_step(shape, n=data, t=tensor, stage=case.stage,
                                     tp_mode=tp_mode), None  # fmt: skip
    if tensor == 1 and zero_group == 1:  # auto DP: GSPMD's all-reduce is the textbook one
        return step_comm.manual_step(shape, n=data, t=1, stage=0, tp_mode=None), None
    return None, "GSPMD chooses its own collectives here; the manual row states the schedule"
