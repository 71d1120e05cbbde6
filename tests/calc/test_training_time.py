"""Training time and cost (seed 001 §4, seed 004 §2)."""

import pytest

from jaxscale.calc import training_time as tt

REL = 1e-12


@pytest.mark.parametrize("gpu, tflops", [("a100", 312), ("h100", 989.5), ("H200", 989.5)])
def test_gpu_peaks_come_from_the_hardware_table(gpu, tflops):
    assert tt.gpu_peak_tflops(gpu) == tflops


def test_seed001_peaks():
    # seed 001 §4 GPUSpecs: the seed rounds the H100's 989.5 to 990
    assert tt.SEED001_PEAK_TFLOPS == {"a100": 312, "h100": 990}


@pytest.mark.parametrize("gpu", ["a100", "h100"])
@pytest.mark.parametrize("num_gpus", [512, 1024, 2048])
def test_seed001_llama70b_table(gpu, num_gpus):
    # seed 001 §4's example: 70B params, 2T tokens, MFU 0.5; independent closed form
    peak = tt.SEED001_PEAK_TFLOPS[gpu]
    r = tt.estimate_training_time(70e9, 2e12, num_gpus, peak, mfu=0.5)
    seconds = 6 * 70e9 * 2e12 / (num_gpus * peak * 1e12 * 0.5)
    assert r.seconds == pytest.approx(seconds, rel=REL)
    assert r.days == pytest.approx(seconds / 86400, rel=REL)
    assert r.gpu_hours == pytest.approx(seconds / 3600 * num_gpus, rel=REL)
    assert r.effective_tflops == pytest.approx(num_gpus * peak * 0.5, rel=REL)


def test_a100_512_days_value():
    # 8.4e23 / (512 * 312e12 * 0.5) s = 121.7 days, as the seed's table prints it [C]
    r = tt.estimate_training_time(70e9, 2e12, 512, 312, 0.5)
    assert f"{r.days:6.1f}" == " 121.7"


def test_perfect_scaling_keeps_gpu_hours_and_mfu_is_inverse():
    a = tt.estimate_training_time(7e9, 1e12, 64, 990, 0.4)
    b = tt.estimate_training_time(7e9, 1e12, 128, 990, 0.4)
    c = tt.estimate_training_time(7e9, 1e12, 64, 990, 0.8)
    assert a.gpu_hours == pytest.approx(b.gpu_hours, rel=REL)
    assert a.days == pytest.approx(2 * b.days, rel=REL)
    assert a.days == pytest.approx(2 * c.days, rel=REL)
    assert a.cost_usd(2.0) == pytest.approx(a.gpu_hours * 2.0, rel=REL)


def test_s4_throughput_estimate():
    # seed 004 §2 prints: 83,333 hours (3,472 days); the comment's 20,833 is wrong
    hours = tt.throughput_training_hours(300e9, 4e6, 1, 1000)
    assert f"{hours:,.0f}" == "83,333"
    assert f"{hours / 24:,.0f}" == "3,472"
    # the batch size cancels
    assert tt.throughput_training_hours(300e9, 1, 1, 1000) == pytest.approx(hours, rel=REL)


def test_s4_cost_example():
    # seed 004 §2 "Cost Efficiency": $3 x 24 x 365 = $26,280; $3 x 256 x 36 = $27,648
    assert tt.cluster_cost_usd(1, 24 * 365) == 26_280
    assert tt.cluster_cost_usd(256, 36) == 27_648
    assert tt.implied_scaling_efficiency(24 * 365, 256, 36) == pytest.approx(8760 / 9216)


@pytest.mark.parametrize(
    "args, message",
    [
        ((7e9, 1e12, 0, 312, 0.5), "num_gpus must be a positive integer"),
        ((7e9, 1e12, 8, 312, 0.0), r"mfu must be in \(0, 1\]"),
        ((7e9, 1e12, 8, 312, 1.5), r"mfu must be in \(0, 1\]"),
        ((7e9, 1e12, 8, -1, 0.5), "gpu_tflops must be > 0"),
        ((-7e9, 1e12, 8, 312, 0.5), "n_params must be > 0"),
    ],
)
def test_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        tt.estimate_training_time(*args)


def test_unknown_gpu_and_bad_throughput():
    with pytest.raises(ValueError, match="unknown GPU 'v100'; choose one of: h100"):
        tt.gpu_peak_tflops("v100")
    with pytest.raises(ValueError, match="samples_per_second must be > 0"):
        tt.throughput_training_hours(1e9, 1e6, 1, 0)
