"""How many GPUs serve a load: requests per second at a latency target.

Seed: seed 001 §9 (`estimate_serving_gpus`). It divides the load by the
throughput of ONE unbatched request on ONE GPU (23.8 tokens/s -> 0.48 requests/s for LLaMA-2-70B),
although 140 GB of weights do not fit in that GPU's 80 GB, and the latency target and KV memory it
computes are never used (its weight memory is also off by 1e9: `model_params_b * 2 / 1e9`).

Corrected (default) plan: a replica is a tensor-parallel group of tp GPUs (1, 2, 4 or 8) that must
hold the weights plus the KV of its batch; it serves static batches of B requests, each finishing
within the target latency (roofline prefill + decode from `inference.py`); B is the largest batch
that meets the target and fits in memory, a replica then completes B requests per batch latency, and
the plan takes the tp that needs the fewest GPUs in all. Queueing and TP communication are ignored.
"""

import math
from dataclasses import dataclass

from jaxscale.calc.inference import SEED001_H100, SEED_WEIGHT_BYTES, inference_latency

# (name, users, requests per second per user) (seed 001 §9's example), prompt 100, gen 50,
# 1 s target.
SEED_LOAD_SCENARIOS = (
    ("Low load", 1000, 0.01),
    ("Medium load", 5000, 0.02),
    ("High load", 10000, 0.05),
)
SEED_PROMPT_LEN = 100
SEED_GEN_LEN = 50
SEED_TARGET_LATENCY_S = 1.0
TP_DEGREES = (1, 2, 4, 8)  # one node at most
OVERHEAD_BYTES_PER_GPU = 2e9  # CUDA context and buffers, as seed 002's KV calculator assumes


@dataclass(frozen=True)
class SeedServingEstimate:
    total_rps: float
    requests_per_gpu: float  # one unbatched request's tokens/s / generated tokens
    gpus_needed: int
    single_request_latency_s: float
    max_concurrent_requests: float  # computed by the seed but never used


def seed_serving_estimate(
    n_params: float,
    total_rps: float,
    prompt_len: int,
    gen_len: int,
    target_latency_s: float,
    *,
    kv_bytes_per_token: float,
    gpu_memory_bytes: float = SEED001_H100.memory_bytes,
    flops_per_s: float = SEED001_H100.flops_per_s,
    hbm_bytes_per_s: float = SEED001_H100.hbm_bytes_per_s,
) -> SeedServingEstimate:
    """The seed's arithmetic, slips included (seed 001 `estimate_serving_gpus`)."""
    if not total_rps > 0 or not target_latency_s > 0:
        raise ValueError("requests per second and target latency must be > 0")
    single = inference_latency(
        n_params,
        prompt_len,
        gen_len,
        1,
        kv_bytes_per_token=kv_bytes_per_token,
        flops_per_s=flops_per_s,
        hbm_bytes_per_s=hbm_bytes_per_s,
        seed_faithful=True,
    )
    requests_per_gpu = single.tokens_per_s / gen_len
    model_memory_gb = (n_params / 1e9) * 2 / 1e9  # the seed's unit slip: 1.4e-7 "GB" for 70B
    by_memory = (gpu_memory_bytes / 1e9 - model_memory_gb) / (single.kv_per_seq_bytes / 1e9)
    by_latency = target_latency_s / single.total_s
    return SeedServingEstimate(
        total_rps=total_rps,
        requests_per_gpu=requests_per_gpu,
        gpus_needed=math.ceil(total_rps / requests_per_gpu),
        single_request_latency_s=single.total_s,
        max_concurrent_requests=min(by_memory, by_latency),
    )


@dataclass(frozen=True)
class ServingPlan:
    total_rps: float
    tp: int  # GPUs per replica
    batch_per_replica: int
    request_latency_s: float  # prefill + decode of one batch
    max_batch_memory: int  # requests whose KV fits next to the weights
    replicas: int

    @property
    def rps_per_replica(self) -> float:
        return self.batch_per_replica / self.request_latency_s

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp


def plan_serving(
    n_params: float,
    total_rps: float,
    prompt_len: int,
    gen_len: int,
    target_latency_s: float,
    *,
    kv_bytes_per_token: float,
    gpu_memory_bytes: float = SEED001_H100.memory_bytes,
    flops_per_s: float = SEED001_H100.flops_per_s,
    hbm_bytes_per_s: float = SEED001_H100.hbm_bytes_per_s,
    weight_bytes: float = SEED_WEIGHT_BYTES,
    overhead_bytes_per_gpu: float = OVERHEAD_BYTES_PER_GPU,
    tp_degrees: tuple[int, ...] = TP_DEGREES,
) -> ServingPlan | None:
    """Fewest GPUs over the tp degrees (ties: smaller tp); None if no degree meets the target."""
    if not total_rps > 0 or not target_latency_s > 0:
        raise ValueError("requests per second and target latency must be > 0")
    if not gpu_memory_bytes > overhead_bytes_per_gpu:
        raise ValueError("GPU memory must exceed the per-GPU overhead")

    def latency(batch: int, tp: int) -> float:
        return inference_latency(
            n_params,
            prompt_len,
            gen_len,
            batch,
            kv_bytes_per_token=kv_bytes_per_token,
            flops_per_s=flops_per_s,
            hbm_bytes_per_s=hbm_bytes_per_s,
            weight_bytes=weight_bytes,
            tp=tp,
        ).total_s

    kv_per_request = (prompt_len + gen_len) * kv_bytes_per_token
    best = None
    for tp in tp_degrees:
        free = tp * (gpu_memory_bytes - overhead_bytes_per_gpu) - n_params * weight_bytes
        max_batch = int(free // kv_per_request) if free > 0 else 0
        if max_batch < 1 or latency(1, tp) > target_latency_s:
            continue
        lo, hi = 1, max_batch  # latency grows with the batch: largest batch within target
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if latency(mid, tp) <= target_latency_s else (lo, mid - 1)
        batch_latency = latency(lo, tp)
        replicas = math.ceil(total_rps * batch_latency / lo - 1e-9)  # float noise, not load
        plan = ServingPlan(total_rps, tp, lo, batch_latency, max_batch, replicas)
        if best is None or plan.gpus < best.gpus:
            best = plan
    return best
