"""`jaxscale doctor` and platform facts."""

import json

import jax
import pytest

from jaxscale import devices
from jaxscale.cli import main as cli_main

pytestmark = pytest.mark.smoke


def test_psum_smoke_equals_closed_form():
    measured, expected = devices.psum_smoke_test()
    n = jax.device_count()
    assert expected == n * (n + 1) // 2
    assert measured == expected


def test_doctor_json_reports_the_simulated_devices(capsys):
    assert cli_main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device_count"] == jax.device_count() == 8
    assert report["backend"] == "cpu" and report["fake_cpu_devices"] is True
    assert report["process_count"] == 1 and report["process_index"] == 0
    assert report["jax"] == jax.__version__
    assert report["psum_smoke"] == {"measured": 36, "expected": 36, "ok": True}


def test_peak_flops_known_for_accelerators_and_never_guessed():
    assert devices.peak_flops("TPU v5 lite") == 197e12
    assert devices.peak_flops("NVIDIA H100 80GB HBM3") == 989.5e12
    assert devices.peak_flops("TPU v5p") == 459e12  # not taken for a v5 lite
    assert devices.peak_flops("NVIDIA GeForce RTX 4090") == 165.2e12
    assert devices.peak_flops("cpu") is None and devices.peak_flops("NVIDIA V100") is None


def test_mfu_is_model_flops_rate_over_peak_and_never_on_cpu():
    # 989.5e12 peak; 494.75e12 model FLOPs in one second is half of it
    assert devices.mfu(494.75e12, 1.0, "NVIDIA H100 80GB HBM3") == pytest.approx(0.5)
    assert devices.mfu(1e12, 1.0, "cpu") is None
    assert devices.mfu(1e12, 0.0, "TPU v5 lite") is None


@pytest.mark.parametrize("value", ["0", "abc", "-3", ""])
def test_a_bad_device_count_is_one_line_not_a_traceback(value, monkeypatch, capsys):
    """Before: a jax traceback for 0 and abc, and -3 silently ran on one device."""
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", value)
    monkeypatch.delenv("JAXSCALE_DEFAULTED_CPU_DEVICES", raising=False)
    assert cli_main(["doctor"]) == 2
    assert f"JAX_NUM_CPU_DEVICES={value}: expected a positive integer" in capsys.readouterr().err
