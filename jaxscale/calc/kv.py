"""KV cache calculator: bytes per token and request, serving capacity, paging and fragmentation.

Port of seed 002 ch9 `kv_cache_calculator.py` (ML Systems Infrastructure Tutorial):
KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes (its
`kv_bytes_per_token`).

Units. The seed divides KV bytes by 1024**3 and prints "GB" (analyze_capacity), while GPU memory and
model sizes are quoted as "80 GB" and "14 GB"; its capacity arithmetic (same function) divides one
by the other, i.e. it reads every "GB" as GiB. We keep that convention, so memory budgets here are
GiB and the seed's capacity table is reproduced, and we label binary units honestly (KiB, GiB) in
output.

Capacity. The seed only models one GPU (available = gpu - model - 2 GB), so its default, LLaMA-70B
on one H100, "does not fit" at every context (seed defect 8). Its prose plans 70B on 8 x H100 (ch9
"Memory Budget Planning"), which `kv_capacity(..., num_gpus=8)` models: weights split by tensor
parallelism, overhead per GPU.
"""

from dataclasses import dataclass

from jaxscale.calc import models
from jaxscale.checks import non_negative, positive, positive_ints

GIB = 1024**3
SEED_OVERHEAD_GB_PER_GPU = 2.0  # "CUDA kernels, activations, etc." (analyze_capacity)
UTILISATION_WITHOUT_PAGING = 0.5  # contiguous pre-allocation (analyze_capacity)
UTILISATION_WITH_PAGING = 0.95  # PagedAttention
SEED_CONTEXTS = (2048, 4096, 8192, 32768)  # capacity table (print_capacity_analysis)
COMPARISON_CONTEXTS = (8192, 32768)  # print_model_comparison's columns
SEED_NODE_GPUS = 8  # the prose deploys 70B on one 8 x H100 node
SEED_CUSTOM_MODEL_SIZE_GB = 14.0  # the seed's fallback for --custom


@dataclass(frozen=True)
class KvModel:
    name: str  # display name, as the seed prints it
    num_layers: int
    num_kv_heads: int  # K/V heads (fewer than query heads under GQA)
    head_dim: int
    model_size_gb: float  # FP16 weights (print_capacity_analysis's sizes)


def kv_model(preset: models.ModelPreset) -> KvModel:
    """A preset of calc/models.py as the seed lists it: its name and FP16 weight size."""
    if preset.fp16_weights_gb is None:
        raise ValueError(f"{preset.name}: no FP16 weight size in the seed's KV calculator")
    return KvModel(
        preset.kv_name or preset.name,
        preset.n_layers,
        preset.n_kv_heads,
        preset.head_dim,
        preset.fp16_weights_gb,
    )


# The seed's six models (its MODELS) with its weight sizes (print_capacity_analysis): models.py's
# KV_PRESETS, in its order.
MODELS: dict[str, KvModel] = {key: kv_model(models.MODELS[key]) for key in models.KV_PRESETS}

# Fragmentation scenarios (print_fragmentation_analysis): (requests, average context, max context,
# description).
FRAGMENTATION_SCENARIOS = (
    (100, 512, 8192, "Short prompts, 8K max"),
    (50, 2048, 8192, "Medium prompts, 8K max"),
    (20, 4096, 32768, "Long prompts, 32K max"),
    (10, 8192, 131072, "Very long, 128K max"),
)


def get_model(name: str) -> KvModel:
    """The seed model called `name` (case-insensitive); ValueError naming the valid choices."""
    return kv_model(models.get_model(name, models.KV_PRESETS))


def custom_model(
    num_layers: int, num_kv_heads: int, head_dim: int, model_size_gb: float | None = None
) -> KvModel:
    """A --custom model; without a weight size it takes the seed's fallback of 14 GB."""
    positive_ints(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim)
    size = SEED_CUSTOM_MODEL_SIZE_GB if model_size_gb is None else model_size_gb
    positive(model_size_gb=size)
    return KvModel("Custom", num_layers, num_kv_heads, head_dim, size)


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2
) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x dtype bytes ("KV Cache Size Calculation")."""
    positive_ints(
        num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes
    )
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def model_kv_bytes_per_token(model: KvModel, dtype_bytes: int = 2) -> int:
    return kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim, dtype_bytes)


@dataclass(frozen=True)
class KvCapacity:
    context_len: int
    num_gpus: int
    available_gib: float  # left for KV across all GPUs; <= 0 means the weights do not fit
    kv_per_request_gib: float
    max_tokens: int  # tokens of KV that fit at 100% utilisation
    max_requests: int  # full-context requests at 100% utilisation
    requests_without_paging: int  # at 50% utilisation
    requests_with_paging: int  # at 95% utilisation

    @property
    def fits(self) -> bool:
        return self.available_gib > 0

    @property
    def paging_improvement(self) -> float | None:
        """Relative gain of paging; None when no request fits unpaged (the seed divides by 0)."""
        if self.requests_without_paging == 0:
            return None
        return self.requests_with_paging / self.requests_without_paging - 1


def available_kv_gib(
    model_size_gb: float,
    gpu_memory_gb: float,
    num_gpus: int = 1,
    overhead_gb_per_gpu: float = SEED_OVERHEAD_GB_PER_GPU,
) -> float:
    """Memory left for KV when the weights are split over `num_gpus` (tensor parallelism)."""
    positive_ints(num_gpus=num_gpus)
    positive(gpu_memory_gb=gpu_memory_gb, model_size_gb=model_size_gb)
    non_negative(overhead_gb_per_gpu=overhead_gb_per_gpu)
    return num_gpus * (gpu_memory_gb - overhead_gb_per_gpu) - model_size_gb


def kv_capacity(
    model: KvModel,
    gpu_memory_gb: float,
    context_len: int,
    num_gpus: int = 1,
    overhead_gb_per_gpu: float = SEED_OVERHEAD_GB_PER_GPU,
    dtype_bytes: int = 2,
) -> KvCapacity:
    """Concurrent full-context requests (analyze_capacity), for one GPU or a TP group of them."""
    positive_ints(context_len=context_len)
    available = available_kv_gib(model.model_size_gb, gpu_memory_gb, num_gpus, overhead_gb_per_gpu)
    per_token = model_kv_bytes_per_token(model, dtype_bytes)
    per_request_gib = per_token * context_len / GIB
    if available <= 0:
        return KvCapacity(context_len, num_gpus, available, per_request_gib, 0, 0, 0, 0)
    max_requests = int(available / per_request_gib)
    return KvCapacity(
        context_len=context_len,
        num_gpus=num_gpus,
        available_gib=available,
        kv_per_request_gib=per_request_gib,
        max_tokens=int(available * GIB / per_token),
        max_requests=max_requests,
        requests_without_paging=int(max_requests * UTILISATION_WITHOUT_PAGING),
        requests_with_paging=int(max_requests * UTILISATION_WITH_PAGING),
    )


def min_gpus_to_fit(
    model_size_gb: float,
    gpu_memory_gb: float,
    overhead_gb_per_gpu: float = SEED_OVERHEAD_GB_PER_GPU,
    max_gpus: int = 1024,
) -> int | None:
    """Fewest GPUs whose memory holds the weights with room left for KV; None if none up to max."""
    for n in range(1, max_gpus + 1):
        if available_kv_gib(model_size_gb, gpu_memory_gb, n, overhead_gb_per_gpu) > 0:
            return n
    return None


def deployment_gpus(
    model_size_gb: float,
    gpu_memory_gb: float,
    overhead_gb_per_gpu: float = SEED_OVERHEAD_GB_PER_GPU,
) -> int:
    """The GPU count the corrected calculator assumes: one GPU if the model fits there (as the
    script does), otherwise one 8-GPU node, as the seed's prose deploys 70B."""
    if available_kv_gib(model_size_gb, gpu_memory_gb, 1, overhead_gb_per_gpu) > 0:
        return 1
    return SEED_NODE_GPUS


@dataclass(frozen=True)
class Fragmentation:
    requests: int
    avg_context: int
    max_context: int
    bytes_without_paging: int  # every request pre-allocates max_context
    bytes_with_paging: int  # pages hold only what is used

    @property
    def wasted_bytes(self) -> int:
        return self.bytes_without_paging - self.bytes_with_paging

    @property
    def waste_fraction(self) -> float:
        """1 - avg/max: the share of pre-allocated KV never used (compare_fragmentation)."""
        return self.wasted_bytes / self.bytes_without_paging


def fragmentation(
    kv_per_token: int, requests: int, avg_context: int, max_context: int
) -> Fragmentation:
    positive_ints(
        requests=requests,
        avg_context=avg_context,
        max_context=max_context,
        kv_per_token=kv_per_token,
    )
    if avg_context > max_context:
        raise ValueError(f"avg context {avg_context} exceeds max context {max_context}")
    return Fragmentation(
        requests,
        avg_context,
        max_context,
        requests * max_context * kv_per_token,
        requests * avg_context * kv_per_token,
    )
