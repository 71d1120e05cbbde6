"""Scaling efficiency, Amdahl and naive model parallelism (seed 004)."""

import pytest

from jaxscale.calc import scaling as sc

REL = 1e-12


def pct(x: float) -> float:
    """Efficiency as the seed prints it: percent with one decimal."""
    return round(x * 100, 1)


def test_strong_scaling_goldens():
    # seed 004 §10 measure_scaling_efficiency prints [RUN]
    points = sc.strong_scaling(*sc.SEED_STRONG)
    assert [pct(p.efficiency) for p in points] == [100.0, 96.2, 92.6, 86.2, 78.1, 62.5]
    assert [round(p.speedup, 2) for p in points] == [1.0, 1.92, 3.70, 6.90, 12.50, 20.0]


def test_weak_scaling_goldens():
    # seed 004 §10: measure_scaling_efficiency's weak-scaling values
    points = sc.weak_scaling(*sc.SEED_WEAK)
    assert [pct(p.efficiency) for p in points] == [100.0, 98.0, 95.2, 90.9, 84.7, 76.9]


def test_resnet_goldens():
    # seed 004 §4 prints [RUN]: 96.2 / 92.6 / 83.3 / 69.4 / 52.1 %
    points = sc.strong_scaling(*sc.SEED_RESNET, baseline_time_s=100)
    assert [pct(p.efficiency) for p in points] == [96.2, 92.6, 83.3, 69.4, 52.1]


def test_ideal_scaling_is_one():
    points = sc.strong_scaling([1, 2, 4], [80.0, 40.0, 20.0])
    assert [p.efficiency for p in points] == pytest.approx([1, 1, 1], rel=REL)
    assert [p.efficiency for p in sc.weak_scaling([1, 8], [5.0, 5.0])] == [1.0, 1.0]


@pytest.mark.parametrize(
    "compute, comm, speedup, comm_pct, bound",
    # seed 004 §10 analyze_scaling_bottlenecks [RUN]: 4.71x (10.0%) and 2.11x (40.0%, warning)
    [(90, 10, 4.71, 10.0, False), (60, 40, 2.11, 40.0, True)],
)
def test_amdahl_scenarios(compute, comm, speedup, comm_pct, bound):
    a = sc.amdahl(compute, comm, 8)
    assert round(a.max_speedup, 2) == speedup
    assert pct(a.comm_fraction) == comm_pct
    assert a.comm_bound is bound
    # closed form: total / (comm + compute / N)
    assert a.max_speedup == pytest.approx((compute + comm) / (comm + compute / 8), rel=REL)


def test_naive_model_parallel_golden():
    # seed 004 §5 prints [RUN]: 130 ms / 260 ms / 30.8 % (the comment's 50/100/40 is wrong)
    mp = sc.naive_model_parallel()
    assert (mp.forward_ms, mp.total_ms) == (130, 260)
    assert pct(mp.utilization) == 30.8


def test_naive_model_parallel_remainder():
    # 13 layers on 3 GPUs: corrected times all 13 layers; the seed's L // N times only 12
    fixed = sc.naive_model_parallel(13, 3)
    seed = sc.naive_model_parallel(13, 3, seed_faithful=True)
    assert fixed.layers_per_gpu == (5, 4, 4)
    assert fixed.forward_ms == 13 * 10 + 2 * 5
    assert fixed.utilization == pytest.approx(2 * 13 * 10 / (3 * 2 * 140), rel=REL)
    assert seed.layers_per_gpu == (4, 4, 4)
    assert seed.utilization > fixed.utilization  # busy time counts a layer it never timed


def test_one_gpu_without_transfers_is_fully_used():
    assert sc.naive_model_parallel(6, 1, 10, 5).utilization == pytest.approx(1.0, rel=REL)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sc.strong_scaling([1, 2], [10.0]), "one time per GPU count"),
        (lambda: sc.strong_scaling([0, 2], [10.0, 5.0]), "positive integers"),
        (lambda: sc.weak_scaling([1, 2], [10.0, -5.0]), "times must be > 0"),
        (lambda: sc.amdahl(0, 0, 8), "not both 0"),
        (lambda: sc.amdahl(1, 1, 0), "num_gpus must be a positive integer"),
        (lambda: sc.naive_model_parallel(2, 3), "must not exceed n_layers"),
        (lambda: sc.naive_model_parallel(12, 3, 0), "layer_time_ms must be > 0"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()
