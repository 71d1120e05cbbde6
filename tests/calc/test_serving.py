"""Serving GPU count against seed 001 §9 `estimate_serving_gpus` (what its cell prints when run) and
a brute-force search for the corrected plan."""

import math

import pytest

from jaxscale.calc import inference as inf
from jaxscale.calc import serving as srv

N_70B = 70e9
KV_GQA = 2 * 80 * 8 * 128 * 2
KV_SEED = 2 * 80 * 8192 * 2
MEMORY = 80e9
TWO_DECIMALS = 0.005


@pytest.mark.parametrize("rps, gpus", [(10.0, 22), (100.0, 211), (500.0, 1052)])
def test_seed_faithful_gpu_counts(rps, gpus):
    # printed by the seed: Requests per GPU 0.48, GPUs needed 22 / 211 / 1052, latency 2103.7 ms
    e = srv.seed_serving_estimate(N_70B, rps, 100, 50, 1.0, kv_bytes_per_token=KV_SEED)
    assert e.requests_per_gpu == pytest.approx(0.48, abs=TWO_DECIMALS)
    assert e.gpus_needed == gpus
    assert e.single_request_latency_s * 1e3 == pytest.approx(2103.7, abs=0.05)
    # computed but unused by the seed: its latency leg (1 s / 2.1 s) is below one request
    assert e.max_concurrent_requests == pytest.approx(1 / 2.1036936, rel=1e-6)


def _latency(batch, tp):
    r = inf.inference_latency(N_70B, 100, 50, batch, kv_bytes_per_token=KV_GQA, tp=tp)
    return r.total_s


def _brute_force_plan(rps, target_s):
    """Linear scan over tp and batch (no bisection): fewest GPUs, ties to smaller tp."""
    best = None
    for tp in srv.TP_DEGREES:
        free = tp * (MEMORY - srv.OVERHEAD_BYTES_PER_GPU) - 2 * N_70B
        max_batch = int(free // (150 * KV_GQA)) if free > 0 else 0
        batch = 0
        for b in range(1, max_batch + 1):
            if _latency(b, tp) > target_s:
                break
            batch = b
        if batch:
            gpus = tp * math.ceil(rps * _latency(batch, tp) / batch - 1e-9)
            if best is None or gpus < best[0]:
                best = (gpus, tp, batch)
    return best


@pytest.mark.parametrize("rps", [10.0, 100.0, 500.0, 2000.0])
def test_corrected_plan_matches_brute_force(rps):
    plan = srv.plan_serving(N_70B, rps, 100, 50, 1.0, kv_bytes_per_token=KV_GQA)
    assert (plan.gpus, plan.tp, plan.batch_per_replica) == _brute_force_plan(rps, 1.0)
    assert plan.request_latency_s <= 1.0
    assert plan.replicas * plan.rps_per_replica >= rps


def test_corrected_plan_for_the_seed_high_load():
    # 70B cannot be served within 1 s on 1 GPU (does not fit) or 2 (one request alone takes
    # 140 GB / 6.7 TB/s x 50 steps > 1 s); 4 GPUs batch 129 requests per second of latency.
    assert _latency(1, 2) > 1.0
    plan = srv.plan_serving(N_70B, 500.0, 100, 50, 1.0, kv_bytes_per_token=KV_GQA)
    assert (plan.tp, plan.batch_per_replica, plan.replicas, plan.gpus) == (4, 129, 4, 16)
    assert _latency(130, 4) > 1.0 >= _latency(129, 4)


def test_infeasible_target_returns_none():
    assert srv.plan_serving(N_70B, 10.0, 100, 50, 0.01, kv_bytes_per_token=KV_GQA) is None


@pytest.mark.parametrize(
    "call",
    [
        lambda: srv.plan_serving(N_70B, 0.0, 100, 50, 1.0, kv_bytes_per_token=KV_GQA),
        lambda: srv.plan_serving(N_70B, 10.0, 100, 50, -1.0, kv_bytes_per_token=KV_GQA),
        lambda: srv.plan_serving(
            N_70B, 10, 100, 50, 1.0, kv_bytes_per_token=KV_GQA, gpu_memory_bytes=1e9
        ),
        lambda: srv.seed_serving_estimate(N_70B, -5.0, 100, 50, 1.0, kv_bytes_per_token=KV_SEED),
        lambda: srv.plan_serving(N_70B, 10.0, 0, 50, 1.0, kv_bytes_per_token=KV_GQA),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
