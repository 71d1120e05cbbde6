"""Scaling efficiency, Amdahl's law and naive model parallelism (seed 004).

Strong scaling: fixed problem, ideal t_N = t_1 / N, efficiency = (t_1 / N) / t_N.
Weak scaling: per-GPU batch fixed, ideal t_N = t_1, efficiency = t_1 / t_N.
"""

from dataclasses import dataclass

from jaxscale.checks import positive_ints


@dataclass(frozen=True)
class ScalingPoint:
    num_gpus: int
    time_s: float
    speedup: float  # t_1 / t_N
    efficiency: float  # fraction, 1.0 = ideal


def _check_series(gpus: list[int], times_s: list[float]) -> None:
    if len(gpus) != len(times_s) or not gpus:
        raise ValueError("need one time per GPU count, and at least one point")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in gpus):
        raise ValueError(f"GPU counts must be positive integers, got {gpus}")
    if any(not t > 0 for t in times_s):
        raise ValueError(f"times must be > 0, got {times_s}")


def strong_scaling(
    gpus: list[int], times_s: list[float], baseline_time_s: float | None = None
) -> list[ScalingPoint]:
    """Speedup and efficiency against the first point (or an explicit single-GPU time).

    The baseline is taken as a 1-GPU time: efficiency = (baseline / N) / t_N
    (seed 004 §4 `calculate_scaling_efficiency`, §10 `measure_scaling_efficiency`).
    """
    _check_series(gpus, times_s)
    base = times_s[0] if baseline_time_s is None else baseline_time_s
    if not base > 0:
        raise ValueError(f"baseline time must be > 0, got {base!r}")
    return [ScalingPoint(n, t, base / t, base / n / t) for n, t in zip(gpus, times_s, strict=True)]


def weak_scaling(gpus: list[int], times_s: list[float]) -> list[ScalingPoint]:
    """Efficiency t_1 / t_N (seed 004 §10); speedup in work per second is N * efficiency."""
    _check_series(gpus, times_s)
    base = times_s[0]
    return [ScalingPoint(n, t, n * base / t, base / t) for n, t in zip(gpus, times_s, strict=True)]


# Seed 004 §10 "Strong Scaling vs Weak Scaling" (strong, weak) and §4 (ResNet).
SEED_STRONG = ([1, 2, 4, 8, 16, 32], [1000, 520, 270, 145, 80, 50])
SEED_WEAK = ([1, 2, 4, 8, 16, 32], [1000, 1020, 1050, 1100, 1180, 1300])
SEED_WEAK_BATCH_PER_GPU = 32
SEED_RESNET = ([2, 4, 8, 16, 32], [52, 27, 15, 9, 6])
SEED_RESNET_SINGLE_GPU_S = 100


# Seed 004 §10 analyze_scaling_bottlenecks: the warning threshold on the communication fraction.
COMM_WARNING_FRACTION = 0.3


@dataclass(frozen=True)
class AmdahlAnalysis:
    compute_s: float
    comm_s: float
    num_gpus: int

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def comm_fraction(self) -> float:
        return self.comm_s / self.total_s

    @property
    def compute_fraction(self) -> float:
        return self.compute_s / self.total_s

    @property
    def max_speedup(self) -> float:
        """Amdahl: communication does not parallelise, compute splits N ways."""
        return 1 / (self.comm_fraction + self.compute_fraction / self.num_gpus)

    @property
    def comm_bound(self) -> bool:
        return self.comm_fraction > COMM_WARNING_FRACTION


def amdahl(compute_s: float, comm_s: float, num_gpus: int) -> AmdahlAnalysis:
    """Seed 004 §10 `analyze_scaling_bottlenecks`."""
    if not compute_s >= 0 or not comm_s >= 0 or not compute_s + comm_s > 0:
        raise ValueError("compute and communication times must be >= 0 and not both 0")
    positive_ints(num_gpus=num_gpus)
    return AmdahlAnalysis(compute_s, comm_s, num_gpus)


# The same function's scenarios: (name, compute s, communication s, GPUs).
SEED_AMDAHL_SCENARIOS = (
    ("Small model, fast network", 90.0, 10.0, 8),
    ("Large model, slow network", 60.0, 40.0, 8),
)
COMM_BOUND_SUGGESTIONS = (
    "use gradient accumulation",
    "optimize network (InfiniBand, RDMA)",
    "use gradient compression",
    "increase batch size per GPU",
)


@dataclass(frozen=True)
class NaiveModelParallel:
    layers_per_gpu: tuple[int, ...]
    forward_ms: float
    total_ms: float  # forward + backward (backward taken equal to forward, as the seed does)
    utilization: float  # fraction of GPU-time spent computing


def naive_model_parallel(
    n_layers: int = 12,
    n_gpus: int = 3,
    layer_time_ms: float = 10,
    transfer_time_ms: float = 5,
    *,
    seed_faithful: bool = False,
) -> NaiveModelParallel:
    """Seed 004 §5 `simulate_naive_model_parallel_time`: layers split over GPUs run in turn.

    Only one GPU works at a time, so utilisation = busy GPU-time / (n_gpus * total) =
    2*L*t / (n_gpus * total). The seed gives every GPU L // n_gpus layers, so with 13 layers on
    3 GPUs one layer is never timed (seed_faithful); corrected spreads the remainder.
    """
    positive_ints(n_layers=n_layers, n_gpus=n_gpus)
    if n_gpus > n_layers:
        raise ValueError(f"n_gpus ({n_gpus}) must not exceed n_layers ({n_layers})")
    if not layer_time_ms > 0 or not transfer_time_ms >= 0:
        raise ValueError("layer_time_ms must be > 0 and transfer_time_ms >= 0")
    base, extra = divmod(n_layers, n_gpus)
    if seed_faithful:
        layers = tuple([base] * n_gpus)
    else:
        layers = tuple(base + (1 if gpu < extra else 0) for gpu in range(n_gpus))
    forward = sum(layers) * layer_time_ms + (n_gpus - 1) * transfer_time_ms
    total = 2 * forward
    busy = 2 * n_layers * layer_time_ms
    return NaiveModelParallel(layers, forward, total, busy / (n_gpus * total))
