"""Smoke test: experiments/07_pipeline_schedules.py runs end to end with small arguments."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "07_pipeline_schedules.py"


@pytest.mark.slow  # whole experiment in a subprocess
@pytest.mark.first_line
def test_experiment_07_runs(tmp_path):
    argv = [sys.executable, str(SCRIPT), "-s", "3", "-m", "6", "--out", str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith("1f1b ")]
    equal, slow_backward = [r for r in rows if r[1].isdigit()]  # table rows, not grid titles
    # P=3, M=6: makespan (M+P-1)(t_F+t_B), bubble (P-1)/(M+P-1) = 2/8 whatever t_B is, and
    # 1F1B holds P-s microbatches of activations on stage s
    assert equal[1:3] == ["16", "25.00%"]
    assert slow_backward[1:3] == ["24", "25.00%"]
    assert equal[-3:] == ["3", "2", "1"]
    assert "interleaved v=2" in out
    # the executor's program: ZB-H1 at P=3, M=6 (t_F = B = W = 1) ends at 3M + P - 1 = 20
    assert "zb-h1        executed makespan 20 (simulated 20)" in out
    for name in ("07_pipeline_gantt.png", "07_bubble_vs_microbatches.png", "07_executed_grids.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
