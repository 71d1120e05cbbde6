"""Training memory per device: model state under ZeRO 0-3 and TP/PP/DP, plus activations.

Mixed-precision Adam keeps, per parameter, bf16 weights (2 B), bf16 gradients (2 B) and fp32 Adam
moments m and v (4 + 4 B) — 12 B/param (seed 000 Exercise 1, "Training Memory Calculator"). Some
recipes also keep an fp32 master copy of the weights (+4 B, 16 B/param); it is sharded with the
optimizer state.

Tensor and pipeline parallelism split the model itself, so every model-state term is divided by
tp*pp. ZeRO then shards over the data-parallel group: stage 1 the optimizer state (and master copy),
stage 2 also the gradients, stage 3 also the weights (the same exercise's `training_memory`).

Context parallelism (cp devices, seed 001 §6) splits the sequence: every device keeps T/cp of each
row's tokens, so the activations per device are divided by cp, while the parameters stay whole on
every context device (their state is not divided). The attention scores each CP form holds are
`jaxscale.calc.context.attention_scores`.
"""

import math
from dataclasses import dataclass

from jaxscale.checks import non_negative, positive, positive_ints

# Mixed-precision Adam, bytes per parameter (seed 000 Exercise 1).
BF16_BYTES = 2
FP32_BYTES = 4
ADAM_OPTIMIZER_BYTES = 2 * FP32_BYTES  # m and v
MIXED_ADAM_BYTES_PER_PARAM = BF16_BYTES + BF16_BYTES + ADAM_OPTIMIZER_BYTES  # 12
MIXED_ADAM_MASTER_BYTES_PER_PARAM = MIXED_ADAM_BYTES_PER_PARAM + FP32_BYTES  # 16

ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes PER DEVICE for each kind of training state."""

    weights: float
    gradients: float
    optimizer: float  # Adam m and v (and anything else the optimizer keeps)
    master: float  # fp32 master copy, 0 if none
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.master + self.activations

    @property
    def model_state(self) -> float:
        """Everything except activations (what ZeRO shards)."""
        return self.weights + self.gradients + self.optimizer + self.master


def training_memory_per_device(
    n_params: float,
    *,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    zero_stage: int = 0,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 8,
    master_bytes: float = 0,
    activation_bytes: float = 0.0,
) -> TrainingMemory:
    """Model state is divided by tp*pp; ZeRO-1 shards optimizer(+master) over dp, ZeRO-2 also grads,
    ZeRO-3 also weights. activation_bytes is per device and added as is."""
    positive(n_params=n_params)
    positive_ints(dp=dp, tp=tp, pp=pp)
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of 0, 1, 2, 3, got {zero_stage!r}")
    non_negative(
        weight_bytes=weight_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes=optimizer_bytes,
        master_bytes=master_bytes,
        activation_bytes=activation_bytes,
    )

    params_per_device = n_params / (tp * pp)
    # Each ZeRO stage adds one more state kind sharded over the data-parallel group.
    optimizer_shards = dp if zero_stage >= 1 else 1
    grad_shards = dp if zero_stage >= 2 else 1
    weight_shards = dp if zero_stage >= 3 else 1
    return TrainingMemory(
        weights=params_per_device * weight_bytes / weight_shards,
        gradients=params_per_device * grad_bytes / grad_shards,
        optimizer=params_per_device * optimizer_bytes / optimizer_shards,
        master=params_per_device * master_bytes / optimizer_shards,
        activations=float(activation_bytes),
    )


def zero_stage_memories(
    n_params: float,
    *,
    dp: int,
    tp: int = 1,
    pp: int = 1,
    master_bytes: float = 0,
    activation_bytes: float = 0.0,
    seed_faithful: bool = False,
) -> list[TrainingMemory]:
    """Per-device memory for ZeRO stages 0, 1, 2, 3 (list index = stage), mixed-precision Adam.

    seed_faithful reproduces seed 002 ch5 "Memory Comparison", whose ZeRO-2 row (210 GB for 70B on 8
    GPUs) leaves the sharded gradients out: 140 + 560/8 = 210. Counting them gives 227.5.
    """
    rows = [
        training_memory_per_device(
            n_params,
            dp=dp,
            tp=tp,
            pp=pp,
            zero_stage=stage,
            master_bytes=master_bytes,
            activation_bytes=activation_bytes,
        )
        for stage in ZERO_STAGES
    ]
    if seed_faithful:
        z2 = rows[2]
        rows[2] = TrainingMemory(z2.weights, 0.0, z2.optimizer, z2.master, z2.activations)
    return rows


def activation_bytes_simple(
    batch_size: int,
    seq_len: int,
    hidden_size: int,
    n_layers: int,
    *,
    checkpointing: bool = False,
    cp: int = 1,
) -> float:
    """Activation memory as seed 004 §12 `estimate_memory_per_gpu` estimates it.

    b*s*h values per layer, 4 bytes each (fp32), times 2 for the intermediates a layer keeps.
    Checkpointing keeps only ~sqrt(L) layers' activations (checkpoint every sqrt(L) layers, then
    recompute one segment at a time), hence sqrt(n_layers) in place of n_layers. Context
    parallelism over cp devices keeps s/cp tokens per device: the whole divided by cp.
    """
    positive(batch_size=batch_size, seq_len=seq_len, hidden_size=hidden_size, n_layers=n_layers)
    positive_ints(cp=cp)
    layers_kept = math.sqrt(n_layers) if checkpointing else n_layers
    return batch_size * seq_len * hidden_size * layers_kept * FP32_BYTES * 2 / cp


# Seed 001 §6 `calculate_memory_per_gpu`: activations ~ 10x (3x with checkpointing) the per-device
# parameter count, in the compute dtype. A batch-independent rule of thumb, kept as the seed has it.
PARAM_HEURISTIC_ACTIVATION_MULTIPLIER = 10
PARAM_HEURISTIC_ACTIVATION_MULTIPLIER_CHECKPOINTED = 3


def activation_bytes_param_heuristic(
    n_params: float,
    *,
    tp: int = 1,
    pp: int = 1,
    checkpointing: bool = False,
    dtype_bytes: float = 2,
    cp: int = 1,
) -> float:
    """Seed 001's rule of thumb: params/(tp*pp) * (3 if checkpointing else 10) * dtype_bytes,
    divided by cp: whatever the activations, context parallelism leaves 1/cp of the tokens."""
    positive(n_params=n_params)
    positive_ints(tp=tp, pp=pp, cp=cp)
    multiplier = (
        PARAM_HEURISTIC_ACTIVATION_MULTIPLIER_CHECKPOINTED
        if checkpointing
        else PARAM_HEURISTIC_ACTIVATION_MULTIPLIER
    )
    return n_params / (tp * pp) * multiplier * dtype_bytes / cp


# Optimizer state bytes per parameter in seed 004 §12 "Memory Requirements".
OPTIMIZER_STATE_BYTES = {"adam": 2 * FP32_BYTES, "sgd": FP32_BYTES, "none": 0}


def single_gpu_memory(
    n_params: float,
    *,
    batch_size: int,
    seq_len: int,
    hidden_size: int,
    n_layers: int,
    optimizer: str = "adam",
    mixed_precision: bool = False,
    activation_checkpointing: bool = False,
) -> TrainingMemory:
    """Seed 004 §12 `estimate_memory_per_gpu`: one GPU, no sharding.

    Weights and gradients are 2 B/param with mixed precision, else 4; Adam keeps m and v in fp32
    (8 B), SGD with momentum one fp32 buffer (4 B); activations from `activation_bytes_simple`.
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(
            f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZER_STATE_BYTES)}"
        )
    param_bytes = BF16_BYTES if mixed_precision else FP32_BYTES
    activations = activation_bytes_simple(
        batch_size, seq_len, hidden_size, n_layers, checkpointing=activation_checkpointing
    )
    return training_memory_per_device(
        n_params,
        weight_bytes=param_bytes,
        grad_bytes=param_bytes,
        optimizer_bytes=OPTIMIZER_STATE_BYTES[optimizer],
        activation_bytes=activations,
    )


def fits(memory: TrainingMemory, device_memory_bytes: float) -> bool:
    """Whether the per-device total fits in one device's memory (no headroom)."""
    return memory.total <= device_memory_bytes
