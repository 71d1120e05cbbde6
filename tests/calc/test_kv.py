"""KV cache calculator against seed 002 ch9 (kv_cache_calculator.py, [R] = printed by
the seed's code when run) and independent closed forms."""

import pytest

from jaxscale.calc import kv
from jaxscale.render import fmt_bytes

GIB = 1024**3
PCT_TOL = 0.05  # percentage points: the seed prints one decimal
REL_TOL = 1e-12


def binary(num_bytes: float) -> str:
    return fmt_bytes(num_bytes, binary=True, digits=2)  # as `calc kv` prints sizes


def test_llama70b_kv_per_token_is_327680_bytes():
    # seed 002 ch9 "KV Cache Size Calculation": 2 x 80 x 8 x 128 x 2 = 327,680 bytes
    assert kv.model_kv_bytes_per_token(kv.get_model("llama-70b")) == 327_680
    assert kv.kv_bytes_per_token(80, 8, 128, 2) == 2 * 80 * 8 * 128 * 2


@pytest.mark.parametrize(
    "name, per_token_kib, at_8k, at_32k",
    [  # the comparison table kv_cache_calculator.py prints [R]
        ("llama-7b", "512.00 KiB", "4.00 GiB", "16.00 GiB"),
        ("llama-13b", "800.00 KiB", "6.25 GiB", "25.00 GiB"),
        ("llama-70b", "320.00 KiB", "2.50 GiB", "10.00 GiB"),
        ("mistral-7b", "128.00 KiB", "1.00 GiB", "4.00 GiB"),
        ("qwen-72b", "320.00 KiB", "2.50 GiB", "10.00 GiB"),
        ("deepseek-67b", "380.00 KiB", "2.97 GiB", "11.88 GiB"),
    ],
)
def test_six_model_table(name, per_token_kib, at_8k, at_32k):
    per_token = kv.model_kv_bytes_per_token(kv.get_model(name))
    assert binary(per_token) == per_token_kib
    assert binary(per_token * 8192) == at_8k
    assert binary(per_token * 32768) == at_32k


def test_70b_request_sizes_binary_vs_prose():
    # [R] 8K -> 2.50 GiB, 32K -> 10.00 GiB exactly; the prose's "10.24 GB" is 320 KB x 32K decimal
    per_token = kv.model_kv_bytes_per_token(kv.get_model("llama-70b"))
    assert per_token * 8192 == 2.5 * GIB
    assert per_token * 32768 == 10 * GIB
    assert 320 * 32 * 1e6 / 1e9 == pytest.approx(10.24)  # ch9's arithmetic


def test_gpt2_kv_per_sequence_matches_seed003():
    # seed 003 (concepts): GPT-2 ~37.7 MB per sequence at 1024 tokens (12 layers, 12 x 64 heads)
    assert kv.kv_bytes_per_token(12, 12, 64) * 1024 == 37_748_736
    assert round(37_748_736 / 1e6, 1) == 37.7


def test_ch8_exercise3_mha_model():
    # seed 002 ch8 Exercise 3: 32 layers, 128 heads of 64, FP16 -> 1 MiB per token, 32 GiB per 32K
    per_token = kv.kv_bytes_per_token(32, 128, 64)
    assert per_token == 1024**2
    assert per_token * 32768 == 32 * GIB


@pytest.mark.parametrize(
    "ctx, kv_gib, without, with_, gain",
    [
        (2048, 1.0, 32, 60, 0.875),
        (4096, 2.0, 16, 30, 0.875),
        (8192, 4.0, 8, 15, 0.875),
        (32768, 16.0, 2, 3, 0.5),
    ],
)
def test_llama7b_on_h100_capacity(ctx, kv_gib, without, with_, gain):
    # [R] llama-7b on h100: available 64.0 GB; 8K: 8 / 15 requests (+88%); 32K: 2 / 3 (+50%)
    c = kv.kv_capacity(kv.get_model("llama-7b"), 80, ctx)
    assert c.available_gib == 64.0
    assert c.kv_per_request_gib == kv_gib
    assert (c.requests_without_paging, c.requests_with_paging) == (without, with_)
    assert c.paging_improvement == pytest.approx(gain, rel=REL_TOL)
    assert f"{c.paging_improvement * 100:.0f}%" in ("88%", "50%")


def test_seed_default_70b_does_not_fit_one_h100():
    # defect 8: the seed prints "Model does not fit in GPU memory" at 2K/4K/8K/32K
    for ctx in kv.SEED_CONTEXTS:
        c = kv.kv_capacity(kv.get_model("llama-70b"), 80, ctx)
        assert not c.fits and c.max_requests == 0
    assert kv.available_kv_gib(140, 80) == 80 - 140 - 2


def test_eight_h100_capacity_for_70b_vs_prose():
    # seed 002 ch9 "Memory Budget Planning": 640 GB - 140 weights - ~20 overhead = ~480 GB for KV ->
    # ~1.5M tokens -> ~375 @4K, ~187 @8K, ~46 @32K. The prose rounds (1.5M tokens, 4K = 4000); exact
    # in the calculator's GiB units: 480 GiB / (327,680 B x ctx).
    model = kv.get_model("llama-70b")
    prose = {4096: 375, 8192: 187, 32768: 46}
    for ctx, seed_value in prose.items():
        c = kv.kv_capacity(model, 80, ctx, num_gpus=8, overhead_gb_per_gpu=2.5)
        assert c.available_gib == 480.0
        assert c.max_tokens == 480 * GIB // 327_680 == 1_572_864
        assert c.max_requests == 480 * GIB // (327_680 * ctx)
        assert c.max_requests == pytest.approx(seed_value, rel=0.05)
    assert [kv.kv_capacity(model, 80, c, 8, 2.5).max_requests for c in prose] == [384, 192, 48]


def test_deployment_gpus_and_minimum():
    assert kv.deployment_gpus(14, 80) == 1  # llama-7b fits one H100: the script's case
    assert kv.deployment_gpus(140, 80) == kv.SEED_NODE_GPUS == 8  # the prose's 8 x H100
    assert kv.min_gpus_to_fit(140, 80) == 2  # 2 x (80 - 2) = 156 > 140; 1 x 78 < 140
    assert kv.min_gpus_to_fit(140, 24) == 7  # 6 x 22 = 132 < 140 < 7 x 22 = 154


def test_paging_improvement_is_none_where_the_seed_divides_by_zero():
    # llama-7b on a100-40 at 32K: 24 GB / 16 GiB -> 1 request, 0 without paging; the seed crashes
    # with ZeroDivisionError (its analyze_capacity divides by requests_without_paging)
    c = kv.kv_capacity(kv.get_model("llama-7b"), 40, 32768)
    assert (c.max_requests, c.requests_without_paging) == (1, 0)
    assert c.paging_improvement is None


@pytest.mark.parametrize(
    "requests, avg, most, without, with_, waste_pct",
    [  # [R] fragmentation for LLaMA-70B
        (100, 512, 8192, "250.00 GiB", "15.62 GiB", 93.8),
        (50, 2048, 8192, "125.00 GiB", "31.25 GiB", 75.0),
        (20, 4096, 32768, "200.00 GiB", "25.00 GiB", 87.5),
        (10, 8192, 131072, "400.00 GiB", "25.00 GiB", 93.8),
    ],
)
def test_fragmentation_scenarios(requests, avg, most, without, with_, waste_pct):
    f = kv.fragmentation(327_680, requests, avg, most)
    assert binary(f.bytes_without_paging) == without
    assert binary(f.bytes_with_paging) == with_
    assert f.waste_fraction * 100 == pytest.approx(waste_pct, abs=PCT_TOL)
    assert f.waste_fraction == pytest.approx(1 - avg / most, rel=REL_TOL)


def test_custom_model_uses_seed_fallback_size():
    m = kv.custom_model(80, 8, 128)
    assert m.model_size_gb == 14.0  # the seed's --custom fallback
    assert kv.custom_model(80, 8, 128, 140).model_size_gb == 140


@pytest.mark.parametrize(
    "call",
    [
        lambda: kv.kv_bytes_per_token(0, 8, 128),
        lambda: kv.kv_bytes_per_token(80, -8, 128),
        lambda: kv.get_model("llama-9000"),
        lambda: kv.kv_capacity(kv.get_model("llama-7b"), 80, 0),
        lambda: kv.kv_capacity(kv.get_model("llama-7b"), -80, 2048),
        lambda: kv.kv_capacity(kv.get_model("llama-7b"), 80, 2048, num_gpus=0),
        lambda: kv.fragmentation(327_680, 10, 9000, 8192),
        lambda: kv.custom_model(80, 8, 128, -1.0),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
