"""RLHF memory against seed 002 ch13 ("Memory Requirements") and ch14 memory_timeline.py
([R] = printed by the seed's code when run)."""

import math

import pytest

from jaxscale.calc import rlhf_memory as rm

GB_TOL = 0.05  # the seed prints GB with one decimal
M70 = rm.get_timeline_model("70b")


def test_ch13_seven_b_table():
    # seed 002 ch13: 4 x 14 + 56 + ~20 = "~130 GB" (the rows sum to 132); 70B x10 -> ~1.3 TB
    r = rm.rlhf_model_memory()
    assert (r.weights_gb_each, r.optimizer_gb, r.activations_gb) == (14, 56, 20)
    assert r.total_gb == 132
    assert rm.rlhf_model_memory(70).total_gb == pytest.approx(1320)
    # defect 22: counting the critic's Adam states too adds another 8 B/param
    assert rm.rlhf_model_memory(adam_for="actor+critic").total_gb == 132 + 56


@pytest.mark.parametrize(
    "phase, total",
    [("generation", 443.5), ("scoring", 161.5), ("training", 1227.4), ("full_rlhf", 1528.8)],
)
def test_timeline_phase_totals(phase, total):
    # [R] 70B, batch 4, seq 2048: gen 443.5, scoring 161.5, train 1227.4, full 1528.8 GB
    assert rm.phase_memory(M70, 4, 2048, phase).total_gb == pytest.approx(total, abs=GB_TOL)


def test_timeline_components():
    # [R] KV 21.5 GB (4 x 2048 x 2 x 80 x 8192 x 2 B), activations 107.4 GB, misc 2.0 GB
    assert rm.kv_cache_gb(M70, 4, 2048) == 4 * 2048 * 2 * 80 * 8192 * 2 / 1e9
    assert rm.kv_cache_gb(M70, 4, 2048) == pytest.approx(21.5, abs=GB_TOL)
    assert rm.activations_gb(M70, 4, 2048) == pytest.approx(107.4, abs=GB_TOL)
    gen = {i.name: i.gb for i in rm.phase_memory(M70, 4, 2048, "generation").items}
    assert gen["Misc (buffers)"] == 2.0 and gen["Actor (weights)"] == 140


def test_fixed_scaling_classifier():
    # defect 12: the seed's substring classifier prints Fixed 560.0 / Scaling 968.8 [R];
    # by kind, weights (560) + optimizer (560) + gradients (280) are fixed: 1400.0 / 128.8
    full = rm.phase_memory(M70, 4, 2048, "full_rlhf")
    assert full.seed_fixed_gb() == pytest.approx(560.0)
    assert full.total_gb - full.seed_fixed_gb() == pytest.approx(968.8, abs=GB_TOL)
    assert full.fixed_gb == pytest.approx(1400.0)
    assert full.scaling_gb == pytest.approx(128.8, abs=GB_TOL)


@pytest.mark.parametrize(
    "bs, kv_gb, act_gb, seed_total",
    [
        (1, 5.4, 26.8, 592.2),
        (2, 10.7, 53.7, 624.4),
        (4, 21.5, 107.4, 688.8),
        (8, 42.9, 214.7, 817.7),
        (16, 85.9, 429.5, 1075.4),
        (32, 171.8, 859.0, 1590.8),
    ],
)
def test_batch_sweep(bs, kv_gb, act_gb, seed_total):
    # [R] the seed adds KV and activations to its 560 GB "fixed"; with the right fixed part the
    # batch-4 row equals the full-RLHF total, as it must
    kv, act = rm.kv_cache_gb(M70, bs, 2048), rm.activations_gb(M70, bs, 2048)
    assert (kv, act) == (pytest.approx(kv_gb, abs=GB_TOL), pytest.approx(act_gb, abs=GB_TOL))
    assert 560.0 + kv + act == pytest.approx(seed_total, abs=GB_TOL)
    full = rm.phase_memory(M70, bs, 2048, "full_rlhf")
    assert full.fixed_gb + kv + act == pytest.approx(full.total_gb)


def test_recommendation_gpu_count():
    # [R] "Need 19 GPUs" = 1528.8 / 80 printed with :.0f; 19 x 80 = 1520 GB cannot hold it
    seed = rm.recommend(1528.84, 80, 8, seed_faithful=True)
    fixed = rm.recommend(1528.84, 80, 8)
    assert (seed.verdict, seed.gpus_needed) == ("does not fit", 19)
    assert fixed.gpus_needed == 20 and 19 * 80 < 1528.84 <= 20 * 80


def test_recommendation_tp_holds_the_model():
    # 7B full RLHF (165.8 GB) on 8 x 80 GB: the seed's int(2.07 x 0.7) = 1 GPU of TP cannot hold
    # it; corrected: ceil(2.07 / 0.7) = 3 -> 4 (power of two), 4 x 80 x 0.7 = 224 >= 165.8
    required = rm.phase_memory(rm.get_timeline_model("7b"), 4, 2048, "full_rlhf").total_gb
    seed = rm.recommend(required, 80, 8, seed_faithful=True)
    fixed = rm.recommend(required, 80, 8)
    assert seed.tp == 1 and seed.tp * 80 < required
    assert (fixed.tp, fixed.data_or_pipeline) == (4, 2)
    assert fixed.tp * 80 * rm.SEED_TP_EFFICIENCY >= required
    assert rm.recommend(50, 80, 8).verdict == "single GPU"


def test_tp8_prose_example():
    # memory_timeline.py's "Run It" page (70B, TP=8 per GPU): each model's weights 17.5 GB, Adam
    # 70.0 GB; training = 4 x 17.5 + 70 + 10 (activations) = 150.0 GB (the prose prints 150.5,
    # defect 22)
    train = {i.name: i.gb for i in rm.phase_memory(M70, 4, 2048, "training", tp=8).items}
    assert train["Actor (weights)"] == train["Critic (gradients)"] == 17.5
    assert train["Optimizer States (actor)"] == 70.0
    weights_grads_adam = sum(gb for name, gb in train.items() if name != "Activations")
    assert weights_grads_adam + 10 == 150.0


def test_gqa_kv_dim_and_adam_for_both():
    gqa = rm.kv_cache_gb(M70, 4, 2048, kv_dim=1024)
    assert gqa == pytest.approx(rm.kv_cache_gb(M70, 4, 2048) / 8)
    both = rm.phase_memory(M70, 4, 2048, "training", adam_for="actor+critic")
    assert both.total_gb == pytest.approx(1227.4 + 560, abs=GB_TOL)
    assert math.isclose(both.fixed_gb, 4 * 140 + 1120)


@pytest.mark.parametrize(
    "call",
    [
        lambda: rm.phase_memory(M70, 0, 2048, "training"),
        lambda: rm.phase_memory(M70, 4, 2048, "warmup"),
        lambda: rm.phase_memory(M70, 4, 2048, "training", adam_for="critic"),
        lambda: rm.get_timeline_model("175b"),
        lambda: rm.rlhf_model_memory(-7),
        lambda: rm.recommend(100, 0, 8),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
