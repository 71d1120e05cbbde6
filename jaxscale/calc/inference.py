"""Inference latency: prefill and decode on a roofline, KV cache per sequence, serving memory.

Seed: seed 001 §9 "Inference: Latency and Throughput". The seed times prefill as compute only
(batch x prompt x 2N FLOPs / peak) and a decode step as a read of the weights only (2N bytes /
bandwidth), and sizes the KV cache as 2 x layers x d_model x 2 B per token.

Corrected (default) model, each step on a roofline, time = max(FLOPs / peak, bytes / bandwidth):
- prefill reads the weights once and writes the prompt's KV; for short prompts at batch 1 its
  arithmetic intensity (~ batch x prompt FLOP/B) is below the ridge point (H100: 990e12 / 3.35e12
  = 296 FLOP/B), so it is memory-bound, not compute-bound as the seed says;
- decode step t reads the weights plus every sequence's KV so far (prompt + t tokens), which the
  seed's text names ("Decode Phase") but its formula drops; at large batch a step turns
  compute-bound;
- KV per token uses the K/V heads: 2 x layers x kv_heads x head_dim x 2 B (GQA; the seed's d_model
  form is 8x too large for LLaMA-2-70B, which has 8 K/V heads of 128 for 64 query heads).
Tensor parallelism over `tp` GPUs is ideal here: peak and bandwidth scale by tp, communication is
not modelled. Sizes are decimal (1 GB = 1e9 B) as in seed 001.
"""

import math
from dataclasses import dataclass, replace

from jaxscale.checks import positive, positive_ints
from jaxscale.hardware import get_device

# Seed 001 prices the H100 at 990 TFLOPS and 3.35 TB/s (§9); jaxscale/hardware.py has the
# datasheet's 989.5 TFLOPS. The seed's tables are computed with its own figure, named here; an
# explicit `--gpu h100` takes the hardware table's.
SEED001_H100 = replace(get_device("h100"), bf16_tflops=990)
SEED_WEIGHT_BYTES = 2.0  # BF16 (seed 001 calculate_inference_latency)
# (name, prompt tokens, generated tokens, batch) of the seed's table (seed 001 §9).
SEED_SCENARIOS = (
    ("Short prompt, short gen", 100, 50, 1),
    ("Long prompt, short gen", 2000, 50, 1),
    ("Short prompt, long gen", 100, 500, 1),
    ("Batched (bs=8)", 100, 50, 8),
)
# Seed 002 ch8 memory table for a 70B server ("Memory: The Inference Bottleneck").
SEED_KV_PER_REQUEST_32K_BYTES = 2e9  # "~2 GB for 32K context" (seed defect 19; ch9 gives 10.24 GB)
SEED_ACTIVATIONS_BYTES = 1e9  # "~1 GB"
SEED_SERVING_CONTEXT = 32768
SEED_SERVING_REQUESTS = 100
# Seed 003's communication example: A100 compute vs NVLink (its concepts and misconceptions
# tables).
A100 = get_device("a100")  # 312 TFLOPS, 2 TB/s as seed 003 says
NVLINK_BYTES_PER_S = 600e9


def seed_kv_bytes_per_token(num_layers: int, d_model: int, dtype_bytes: int = 2) -> int:
    """The seed's 2 x layers x d_model x 2 B (seed 001 §9): counts every head as a K/V head."""
    return 2 * num_layers * d_model * dtype_bytes


def _sum_max_linear(a: float, b: float, c: float, n: int) -> float:
    """sum over t = 0..n-1 of max(a + b*t, c), for b >= 0, in closed form."""
    if b == 0:
        return n * max(a, c)
    t0 = min(n, max(0, math.ceil((c - a) / b)))  # first step where a + b*t >= c
    rest = n - t0
    return c * t0 + a * rest + b * (t0 + n - 1) * rest / 2


@dataclass(frozen=True)
class InferenceLatency:
    prompt_len: int
    gen_len: int
    batch_size: int
    prefill_s: float  # time to first token
    decode_total_s: float  # all gen_len decode steps
    kv_per_seq_bytes: float  # (prompt + generated) tokens of K/V for one sequence
    prefill_intensity: float  # FLOPs per byte moved
    decode_intensity: float  # FLOPs per byte moved, first decode step

    @property
    def decode_per_token_s(self) -> float:
        return self.decode_total_s / self.gen_len

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_total_s

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size * self.gen_len / self.total_s

    @property
    def kv_total_bytes(self) -> float:
        return self.batch_size * self.kv_per_seq_bytes


def inference_latency(
    n_params: float,
    prompt_len: int,
    gen_len: int,
    batch_size: int,
    *,
    kv_bytes_per_token: float,
    flops_per_s: float = SEED001_H100.flops_per_s,
    hbm_bytes_per_s: float = SEED001_H100.hbm_bytes_per_s,
    weight_bytes: float = SEED_WEIGHT_BYTES,
    tp: int = 1,
    seed_faithful: bool = False,
) -> InferenceLatency:
    """Prefill then `gen_len` decode steps for a batch of equal requests (seed 001 §9)."""
    positive(
        n_params=n_params,
        kv_bytes_per_token=kv_bytes_per_token,
        flops_per_s=flops_per_s,
        hbm_bytes_per_s=hbm_bytes_per_s,
        weight_bytes=weight_bytes,
    )
    positive_ints(prompt_len=prompt_len, gen_len=gen_len, batch_size=batch_size, tp=tp)
    flops, bandwidth = tp * flops_per_s, tp * hbm_bytes_per_s
    weights = n_params * weight_bytes
    prefill_flops = 2 * n_params * batch_size * prompt_len
    prefill_bytes = weights + batch_size * prompt_len * kv_bytes_per_token
    step_flops = 2 * n_params * batch_size
    if seed_faithful:
        prefill_s = prefill_flops / flops
        decode_total_s = gen_len * weights / bandwidth
    else:
        prefill_s = max(prefill_flops / flops, prefill_bytes / bandwidth)
        # step t reads the weights and batch x (prompt + t) K/V entries
        first_step_s = (weights + batch_size * prompt_len * kv_bytes_per_token) / bandwidth
        growth_s = batch_size * kv_bytes_per_token / bandwidth
        decode_total_s = _sum_max_linear(first_step_s, growth_s, step_flops / flops, gen_len)
    return InferenceLatency(
        prompt_len=prompt_len,
        gen_len=gen_len,
        batch_size=batch_size,
        prefill_s=prefill_s,
        decode_total_s=decode_total_s,
        kv_per_seq_bytes=(prompt_len + gen_len) * kv_bytes_per_token,
        prefill_intensity=prefill_flops / prefill_bytes,
        decode_intensity=step_flops / (weights + batch_size * prompt_len * kv_bytes_per_token),
    )


def ridge_point(flops_per_s: float, hbm_bytes_per_s: float) -> float:
    """FLOPs per byte above which a kernel is compute-bound (A100: 312e12 / 2e12 = 156)."""
    positive(flops_per_s=flops_per_s, hbm_bytes_per_s=hbm_bytes_per_s)
    return flops_per_s / hbm_bytes_per_s


def bound(intensity: float, flops_per_s: float, hbm_bytes_per_s: float) -> str:
    return "compute" if intensity >= ridge_point(flops_per_s, hbm_bytes_per_s) else "memory"


@dataclass(frozen=True)
class TransferCost:
    num_bytes: float
    seconds: float  # on the link
    flops_forgone: float  # what the GPU could have computed meanwhile


def transfer_cost(
    num_bytes: float = 1e9,
    link_bytes_per_s: float = NVLINK_BYTES_PER_S,
    flops_per_s: float = A100.flops_per_s,
) -> TransferCost:
    """Seed 003 (misconception 4): 1 GB over 600 GB/s NVLink takes ~1.7 ms, ~530 GFLOP of A100 time
    (exactly 1.67 ms and 520 GFLOP; the seed rounds the time up first)."""
    positive(num_bytes=num_bytes, link_bytes_per_s=link_bytes_per_s, flops_per_s=flops_per_s)
    seconds = num_bytes / link_bytes_per_s
    return TransferCost(num_bytes, seconds, seconds * flops_per_s)


@dataclass(frozen=True)
class ServingMemory:
    weights_bytes: float
    kv_per_request_bytes: float
    num_requests: int
    activations_bytes: float

    @property
    def kv_total_bytes(self) -> float:
        return self.kv_per_request_bytes * self.num_requests

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_total_bytes + self.activations_bytes


def serving_memory(
    n_params: float,
    kv_bytes_per_token: float,
    context_len: int = SEED_SERVING_CONTEXT,
    num_requests: int = SEED_SERVING_REQUESTS,
    *,
    weight_bytes: float = SEED_WEIGHT_BYTES,
    activations_bytes: float = SEED_ACTIVATIONS_BYTES,
    seed_faithful: bool = False,
) -> ServingMemory:
    """Weights + KV of every concurrent request + activations (seed 002 ch8). The seed's table
    says ~2 GB of KV per 32K request (100 requests -> 200 GB); by ch9's own formula
    it is 327,680 B x 32,768 = 10.74 GB (10.00 GiB) for LLaMA-70B (seed defect 19)."""
    positive(n_params=n_params, kv_bytes_per_token=kv_bytes_per_token)
    positive_ints(context_len=context_len, num_requests=num_requests)
    if seed_faithful:
        per_request = SEED_KV_PER_REQUEST_32K_BYTES * context_len / SEED_SERVING_CONTEXT
    else:
        per_request = kv_bytes_per_token * context_len
    return ServingMemory(n_params * weight_bytes, per_request, num_requests, activations_bytes)
