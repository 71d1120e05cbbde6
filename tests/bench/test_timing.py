"""`jaxscale bench --time` (jaxscale/bench/timing.py): the alpha-beta prediction of a census
from fits, the fits from profiled isolated collectives, and the table end to end."""

import json

import pytest

from jaxscale.analysis.hlo import Collective
from jaxscale.bench import timing
from jaxscale.cli import main as cli_main


def _collective(op, nbytes, group, trips=1):
    return Collective(op, "f32", nbytes, group, 8 // group, "x", "main", trips=trips)


class _Report:
    def __init__(self, collectives):
        self.collectives = collectives


def test_a_census_is_predicted_collective_by_collective_with_its_trips():
    """alpha + bus bytes / busbw per collective (bus bytes: all-reduce 2(g-1)/g of the
    message, all-gather (g-1)/g), times the loop trips, summed per op; a group size no fit
    covers is left out."""
    fits = {
        ("all-reduce", 8): timing.Fit("all-reduce", 8, 1e-4, 1e9, ()),
        ("all-gather", 4): timing.Fit("all-gather", 4, 2e-4, 2e9, ()),
    }
    report = _Report(
        [
            _collective("all-reduce", 1e6, 8),
            _collective("all-reduce", 2e6, 8, trips=3),
            _collective("all-gather", 4e6, 4),
            _collective("all-gather", 4e6, 2),  # no fit for groups of 2
        ]
    )
    got = timing.predict(report, fits)
    want_ar = (1e-4 + 1e6 * 2 * 7 / 8 / 1e9) + 3 * (1e-4 + 2e6 * 2 * 7 / 8 / 1e9)
    want_ag = 2e-4 + 4e6 * 3 / 4 / 2e9
    assert got == pytest.approx({"all-reduce": want_ar, "all-gather": want_ag})
    assert timing.needed([type("R", (), {"report": report})()]) == {
        ("all-reduce", 8),
        ("all-gather", 4),
        ("all-gather", 2),
    }


def test_a_fit_from_profiled_collectives_grows_with_the_message():
    """An all-reduce over 8 devices timed from its trace events at four sizes: 4 MiB takes
    longer than 4 KiB, and the fit has a non-negative alpha and a finite bus bandwidth."""
    f = timing.fit("all-reduce", 8)
    sizes = [b for b, _ in f.points]
    seconds = [t for _, t in f.points]
    assert sizes == list(timing.FIT_SIZES) and all(t > 0 for t in seconds)
    assert seconds[-1] > seconds[0]
    assert f.alpha_s >= 0 and 0 < f.busbw_Bps < float("inf")


@pytest.mark.slow  # two rows compiled, run, profiled; five fits
def test_bench_profile_prints_measured_beside_predicted_and_keeps_the_traces(tmp_path, capsys):
    argv = ["bench", "--model", "tiny", "--strategies", "manual:dp,manual:zero3", "--steps", "1"]
    argv += ["--profile", str(tmp_path / "traces"), "--time-steps", "2"]
    argv += ["--out", str(tmp_path), "--no-plot"]
    rc = cli_main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "time per step (ms" in out
    saved = json.loads((tmp_path / "bench_time.json").read_text())
    rows = {r["label"]: r for r in saved["rows"]}
    assert set(rows) == {"manual:dp", "manual:zero3"}
    assert set(rows["manual:dp"]["predicted_s"]) == {"all-reduce"}
    assert {"all-gather", "reduce-scatter"} <= set(rows["manual:zero3"]["predicted_s"])
    for r in rows.values():  # every op predicted was also measured in the trace
        assert set(r["predicted_s"]) <= set(r["measured"]["collectives_s"])
        assert all(v > 0 for v in r["predicted_s"].values())
    assert {(f["op"], f["group"]) for f in saved["fits"]} >= {("all-reduce", 8)}
    # --profile is --time with each row's trace kept
    kept = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert kept == ["manual_dp@dp=8", "manual_zero3@fsdp=8"], kept
    assert all(list((tmp_path / "traces" / k).rglob("*.xplane.pb")) for k in kept)
