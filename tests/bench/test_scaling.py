"""`jaxscale bench scaling`: the predictions (worked by hand below), calc scaling's efficiencies
of both series, the argument checks, and one end-to-end run."""

import json

import pytest

from jaxscale.bench import scaling
from jaxscale.cli import main


def _p(mode, n, ms, flops, comm=0.0):
    return scaling.Point(mode, n, 16, ms, flops, comm, True)


def test_device_counts_are_powers_of_two_up_to_the_devices():
    assert scaling.device_counts(8) == [1, 2, 4, 8]
    assert scaling.device_counts(6) == [1, 2, 4]
    assert scaling.device_counts(1) == [1]


def test_cpu_prediction_is_the_total_work_on_the_same_cores():
    # 2 devices each doing 4.2 of 8 units: 8.4 units on one host's cores -> 100 ms x 8.4 / 8
    got = scaling.predict([_p("strong", 1, 100.0, 8.0), _p("strong", 2, 60.0, 4.2)], None)
    assert [p.predicted_ms for p in got] == pytest.approx([100.0, 105.0])
    eff = scaling.efficiencies(got)["strong"]
    # measured: (100 / 2) / 60; predicted: (100 / 2) / 105
    assert eff["measured"][1].efficiency == pytest.approx(50 / 60)
    assert eff["predicted"][1].efficiency == pytest.approx(50 / 105)


def test_accelerator_prediction_is_amdahl_with_the_compiled_work():
    # half the FLOPs per device -> 50 ms compute; 1 GB of collectives over 100 GB/s -> 10 ms
    got = scaling.predict([_p("strong", 1, 100.0, 8.0), _p("strong", 2, 70.0, 4.0, 1e9)], 1e11)
    assert got[1].predicted_ms == pytest.approx(60.0)
    assert got[1].comm_fraction == pytest.approx(10 / 60)
    assert got[0].predicted_ms == pytest.approx(100.0)


def test_weak_efficiency_is_t1_over_tn():
    pts = scaling.predict([_p("weak", 1, 100.0, 8.0), _p("weak", 4, 125.0, 8.0)], None)
    eff = scaling.efficiencies(pts)["weak"]
    assert eff["measured"][1].efficiency == pytest.approx(0.8)
    assert eff["predicted"][1].efficiency == pytest.approx(0.25)  # 4 devices' work, one host


def test_a_series_must_start_at_one_device():
    with pytest.raises(ValueError, match="1 device"):
        scaling.predict([_p("strong", 2, 50.0, 4.0)], None)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--devices", "2,4"], "start at 1"),
        (["--devices", "1,16"], "start at 1"),
        (["--global-batch", "6", "--devices", "1,4"], "does not split over 4"),
        (["--strategies", "manual:zero3+tp"], "single-axis mesh"),
    ],
)
def test_bad_arguments_are_named_before_compiling(args, message, capsys):
    assert main(["bench", "scaling", "--model", "tiny", "--dry-run", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.first_line
def test_strong_and_weak_runs_are_checked_and_plotted(tmp_path, capsys):
    code = main(
        [
            "bench",
            "scaling",
            "--model",
            "tiny",
            "--strategies",
            "auto:fsdp",
            "--devices",
            "1,2",
            "--steps",
            "1",
            "--global-batch",
            "4",
            "--seq-len",
            "32",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "bench_scaling.json").read_text())
    assert [(p["mode"], p["devices"], p["global_batch"]) for p in data["points"]] == [
        ("strong", 1, 4),
        ("strong", 2, 4),
        ("weak", 1, 4),
        ("weak", 2, 8),
    ]
    assert all(p["equivalent"] for p in data["points"])
    two = data["points"][1]
    assert two["comm_bytes_per_device"] > 0 and data["points"][0]["comm_bytes_per_device"] == 0
    assert (tmp_path / "bench_scaling.png").stat().st_size > 10_000
    assert "indicative" in data["label"]
