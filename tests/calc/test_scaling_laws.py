"""Chinchilla tokens and MoE parameter counts (seed 001 §2-§3)."""

import pytest

from jaxscale.calc import scaling_laws as sl

B = 1e9
REL = 1e-12


def test_chinchilla_twenty_tokens_per_param():
    # seed 001 §2: 20 x N
    assert sl.chinchilla_optimal_tokens(70 * B) == pytest.approx(1400 * B, rel=REL)
    assert sl.chinchilla_optimal_tokens(70 * B, tokens_per_param=10) == pytest.approx(700 * B)


@pytest.mark.parametrize(
    "name, params_b, zetta",
    # 6 * N * 20N / 1e21, printed with two decimals by seed 001 §2's compute_budget
    [("GPT-3", 175, 3675.00), ("Chinchilla", 70, 588.00), ("LLaMA-2-7B", 7, 5.88)]
    + [("LLaMA-2-13B", 13, 20.28), ("LLaMA-2-70B", 70, 588.00)],
)
def test_compute_budget(name, params_b, zetta):
    row = sl.chinchilla_row(name, params_b * B)
    assert round(row.compute_zettaflops, 2) == zetta
    assert row.compute_flops == pytest.approx(6 * params_b * B * 20 * params_b * B, rel=REL)


def test_seed_models_and_actual_ratios():
    assert dict(sl.CHINCHILLA_MODELS)["GPT-3"] == 175 * B  # seed 001 §2
    # seed 001 §2: GPT-3 1.7x, LLaMA-2-70B 28.6x
    ratios = [round(sl.tokens_per_param(n, t), 1) for _, n, t in sl.ACTUAL_TRAINING_TOKENS]
    assert ratios == [1.7, 28.6]


@pytest.mark.parametrize(
    "name, total_b, active_b, pct, tokens_b",
    # seed 001 §3: the seed's code values (shared + experts, shared + top_k)
    [
        ("GPT-4 (rumored)", 1860, 320, 17.2, 6400),
        ("Mixtral-8x7B", 61, 19, 31.1, 380),
        ("Switch-C (Google)", 1380, 110, 8.0, 2200),
    ],
)
def test_moe_seed_presets(name, total_b, active_b, pct, tokens_b):
    m = sl.MOE_MODELS[name]
    assert m.total_params == pytest.approx(total_b * B, rel=REL)
    assert m.active_params == pytest.approx(active_b * B, rel=REL)
    assert round(m.active_fraction * 100, 1) == pct
    assert m.optimal_tokens() == pytest.approx(tokens_b * B, rel=REL)


def test_deepseek_v3_totals():
    # seed 002 ch7 "Why MoE?": 671B total, 37B active
    m = sl.MOE_MODELS["DeepSeek-V3"]
    assert m.total_params == pytest.approx(671 * B, rel=1e-9)
    assert m.active_params == pytest.approx(37 * B, rel=1e-9)
    assert (m.num_experts, m.top_k) == (256, 8)


def test_from_totals_round_trip():
    original = sl.MoEConfig(3 * B, 16, 2 * B, 2)
    solved = sl.MoEConfig.from_totals(original.total_params, original.active_params, 16, 2)
    assert solved.shared_params == pytest.approx(3 * B, rel=1e-12)
    assert solved.expert_params == pytest.approx(2 * B, rel=1e-12)


def test_moe_bad_input():
    with pytest.raises(ValueError, match="top_k"):
        sl.MoEConfig(1 * B, 8, 1 * B, 9)
    with pytest.raises(ValueError, match="expert_params"):
        sl.MoEConfig(1 * B, 8, 0, 1)
    with pytest.raises(ValueError, match="negative"):
        sl.MoEConfig.from_totals(100 * B, 10 * B, 8, 2)  # 2 * 15 > 10
    with pytest.raises(ValueError, match="n_params must be > 0"):
        sl.chinchilla_optimal_tokens(0)


def test_mixtral_seed003_totals_and_memory_ratio():
    # seed 003's concepts table: ~47B total, ~13B active, "~3.5x more memory" than active
    m = sl.MOE_MODELS["Mixtral-8x7B (seed 003)"]
    assert m.total_params == pytest.approx(47 * B, rel=1e-9)
    assert m.active_params == pytest.approx(13 * B, rel=1e-9)
    assert round(m.total_params / m.active_params, 1) == 3.6  # the seed rounds to ~3.5x
