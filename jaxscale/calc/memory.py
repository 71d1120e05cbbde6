"""Training memory per device: model state under ZeRO 0-3 and TP/PP/DP, plus activations.

Mixed-precision Adam keeps, per parameter, bf16 weights (2 B), bf16 gradients (2 B) and fp32 Adam
moments m and v (4 + 4 B) — 12 B/param (shared/seeds/000_*.txt L86-104). Some recipes also keep an
fp32 master copy of the weights (+4 B, 16 B/param); it is sharded with the optimizer state.

Tensor and pipeline parallelism split the model itself, so every model-state term is divided by
tp*pp. ZeRO then shards over the data-parallel group: stage 1 the optimizer state (and master copy),
stage 2 also the gradients, stage 3 also the weights (shared/seeds/000_*.txt L111-146).
"""

from dataclasses import dataclass

# Mixed-precision Adam, bytes per parameter (shared/seeds/000_*.txt L98-104).
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


def _check_degree(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_bytes(name: str, value: float) -> None:
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {value!r}")


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
    if not n_params > 0:
        raise ValueError(f"n_params must be > 0, got {n_params!r}")
    for name, degree in (("dp", dp), ("tp", tp), ("pp", pp)):
        _check_degree(name, degree)
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of 0, 1, 2, 3, got {zero_stage!r}")
    for name, value in (
        ("weight_bytes", weight_bytes),
        ("grad_bytes", grad_bytes),
        ("optimizer_bytes", optimizer_bytes),
        ("master_bytes", master_bytes),
        ("activation_bytes", activation_bytes),
    ):
        _check_bytes(name, value)

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
