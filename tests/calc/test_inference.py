"""Inference latency against seed 001 §9 and independent derivations.

Seed-faithful goldens are what the seed's cell prints when run (its calculate_inference_latency and
the four LLaMA-2-70B scenarios of its example cell); the corrected model is checked against a
step-by-step brute-force sum and the roofline's closed forms."""

import pytest

from jaxscale.calc import inference as inf

N_70B = 70e9
KV_GQA = 2 * 80 * 8 * 128 * 2  # LLaMA-2-70B: 8 K/V heads of 128 (seed 002 ch9)
KV_SEED = 2 * 80 * 8192 * 2  # seed 001 §9: d_model instead of K/V heads
H100_FLOPS, H100_BW = 990e12, 3.35e12  # seed 001 §9
ONE_DECIMAL = 0.05  # the seed prints ms and tokens/s with one decimal
REL_TOL = 1e-9


@pytest.mark.parametrize(
    "prompt, gen, batch, prefill, total_decode, total, tok_s, kv_seq_gb, kv_total_gb",
    [  # printed by the seed (one decimal for ms and tokens/s, two for GB)
        (100, 50, 1, 14.1, 2089.6, 2103.7, 23.8, 0.39, 0.39),
        (2000, 50, 1, 282.8, 2089.6, 2372.4, 21.1, 5.37, 5.37),
        (100, 500, 1, 14.1, 20895.5, 20909.7, 23.9, 1.57, 1.57),
        (100, 50, 8, 113.1, 2089.6, 2202.7, 181.6, 0.39, 3.15),
    ],
)
def test_seed_faithful_reproduces_seed_table(
    prompt, gen, batch, prefill, total_decode, total, tok_s, kv_seq_gb, kv_total_gb
):
    r = inf.inference_latency(
        N_70B, prompt, gen, batch, kv_bytes_per_token=KV_SEED, seed_faithful=True
    )
    assert r.prefill_s * 1e3 == pytest.approx(prefill, abs=ONE_DECIMAL)
    assert r.decode_per_token_s * 1e3 == pytest.approx(41.8, abs=ONE_DECIMAL)
    assert r.decode_total_s * 1e3 == pytest.approx(total_decode, abs=ONE_DECIMAL)
    assert r.total_s * 1e3 == pytest.approx(total, abs=ONE_DECIMAL)
    assert r.tokens_per_s == pytest.approx(tok_s, abs=ONE_DECIMAL)
    assert round(r.kv_per_seq_bytes / 1e9, 2) == kv_seq_gb
    assert round(r.kv_total_bytes / 1e9, 2) == kv_total_gb


def test_seed_kv_formula_is_eight_times_gqa_for_70b():
    assert inf.seed_kv_bytes_per_token(80, 8192) == KV_SEED == 8 * KV_GQA


def _brute_force_decode_s(n, prompt, gen, batch, kv, flops=H100_FLOPS, bw=H100_BW, wb=2):
    total = 0.0
    for t in range(gen):
        memory_s = (n * wb + batch * (prompt + t) * kv) / bw
        total += max(memory_s, 2 * n * batch / flops)
    return total


@pytest.mark.parametrize(
    "prompt, gen, batch",
    [(100, 50, 1), (2000, 50, 1), (100, 1000, 512), (4096, 300, 64), (1, 1, 1), (10, 700, 700)],
)
def test_corrected_decode_equals_step_by_step_sum(prompt, gen, batch):
    # (100, 1000, 512) crosses from compute-bound to memory-bound mid-generation
    r = inf.inference_latency(N_70B, prompt, gen, batch, kv_bytes_per_token=KV_GQA)
    expected = _brute_force_decode_s(N_70B, prompt, gen, batch, KV_GQA)
    assert r.decode_total_s == pytest.approx(expected, rel=REL_TOL)


def test_corrected_prefill_is_the_roofline_max():
    short = inf.inference_latency(N_70B, 100, 50, 1, kv_bytes_per_token=KV_GQA)
    # 100 tokens at batch 1: intensity ~100 FLOP/B < 296 ridge -> reading 140 GB of weights binds
    assert short.prefill_s == pytest.approx((140e9 + 100 * KV_GQA) / H100_BW, rel=REL_TOL)
    assert short.prefill_s * 1e3 == pytest.approx(41.8, abs=ONE_DECIMAL)
    long = inf.inference_latency(N_70B, 2000, 50, 1, kv_bytes_per_token=KV_GQA)
    assert long.prefill_s == pytest.approx(2 * N_70B * 2000 / H100_FLOPS, rel=REL_TOL)
    bound = lambda r: inf.bound(r.prefill_intensity, H100_FLOPS, H100_BW)  # noqa: E731
    assert (bound(short), bound(long)) == ("memory", "compute")


def test_kv_per_sequence_gqa():
    r = inf.inference_latency(N_70B, 100, 50, 8, kv_bytes_per_token=KV_GQA)
    assert r.kv_per_seq_bytes == 150 * 327_680 == 49_152_000
    assert r.kv_total_bytes == 8 * 49_152_000


def test_decode_is_memory_bound_at_small_batch_and_tp_halves_it():
    one = inf.inference_latency(N_70B, 100, 50, 1, kv_bytes_per_token=KV_GQA)
    two = inf.inference_latency(N_70B, 100, 50, 1, kv_bytes_per_token=KV_GQA, tp=2)
    assert inf.bound(one.decode_intensity, H100_FLOPS, H100_BW) == "memory"
    assert two.decode_total_s == pytest.approx(one.decode_total_s / 2, rel=REL_TOL)


def test_ridge_points():
    # seed 003 (concepts): A100 312 TFLOPS vs 2 TB/s -> 156 FLOP/B; H100 (seed 001) 990 / 3.35
    assert inf.ridge_point(312e12, 2e12) == pytest.approx(156.0)
    assert inf.ridge_point(H100_FLOPS, H100_BW) == pytest.approx(295.52, abs=0.01)


def test_nvlink_transfer_cost_seed003():
    # seed 003 (misconceptions): 1 GB over ~600 GB/s takes ~1.7 ms, ~530 GFLOP of A100 time
    c = inf.transfer_cost()
    assert c.seconds == pytest.approx(1 / 600)
    assert c.flops_forgone == pytest.approx(312e12 / 600)
    assert round(c.seconds * 1e3, 1) == 1.7
    assert 1.7e-3 * 312e12 / 1e9 == pytest.approx(530.4)  # the seed's arithmetic, rounded first


def test_serving_memory_table():
    # seed 002 ch8: 70B, 100 requests at 32K. Corrected KV per request 327,680 x 32,768 B
    # = 10.74 GB (ch9's formula); the seed's table says ~2 GB, i.e. 200 GB in all (defect 19)
    m = inf.serving_memory(N_70B, KV_GQA)
    assert m.weights_bytes == 140e9
    assert m.kv_per_request_bytes == 10 * 1024**3
    assert m.kv_total_bytes / 1e9 == pytest.approx(1073.74, abs=0.01)
    seed = inf.serving_memory(N_70B, KV_GQA, seed_faithful=True)
    assert seed.kv_total_bytes == 200e9
    assert seed.total_bytes == 341e9


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_params=-1, prompt_len=10, gen_len=10, batch_size=1),
        dict(n_params=N_70B, prompt_len=0, gen_len=10, batch_size=1),
        dict(n_params=N_70B, prompt_len=10, gen_len=10, batch_size=0),
        dict(n_params=N_70B, prompt_len=10, gen_len=10, batch_size=1, tp=0),
        dict(n_params=N_70B, prompt_len=10, gen_len=10, batch_size=1, flops_per_s=0),
    ],
)
def test_bad_input_raises_value_error(kwargs):
    with pytest.raises(ValueError):
        inf.inference_latency(kv_bytes_per_token=KV_GQA, **kwargs)
