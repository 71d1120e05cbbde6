"""Smoke test: experiments/16_context_parallel.py runs end to end with small arguments."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "16_context_parallel.py"


@pytest.mark.slow  # the whole experiment in a subprocess
@pytest.mark.first_line
def test_experiment_16_runs(tmp_path):
    argv = [sys.executable, str(SCRIPT), "--seq-len", "256", "--budget-mib", "4", "--start", "128"]
    out = subprocess.run(
        [*argv, "--out", str(tmp_path)], capture_output=True, text=True, check=True, timeout=600
    ).stdout
    part1 = [line.split() for line in out.splitlines() if line[:2] in ("1 ", "2 ", "4 ", "8 ")]
    flops = {int(r[0]): float(r[2]) for r in part1[:4]}
    # each device computes part of the sequence: cp devices each do about 1/cp of the step
    for c in (2, 4, 8):
        assert flops[c] < 1.5 / c, flops
    assert "cp_ring               collective-permute" in out
    assert "the ring runs no all-gather" in out
    longest = [int(line.split()[-1]) for line in out.splitlines() if "longest T within" in line]
    assert len(longest) == 4 and longest == sorted(longest) and longest[-1] > longest[0]
    assert (tmp_path / "16_context_parallel.png").read_bytes()[:4] == b"\x89PNG"
