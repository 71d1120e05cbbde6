"""experiments/12_rl_fundamentals.py runs end to end and writes its plot (slow)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.first_line
def test_experiment_12_runs(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "12_rl_fundamentals.py"),
            "--seeds",
            "1",
            "--steps",
            "32768",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    for algo in ("reinforce", "reinforce-baseline", "actor-critic", "ppo"):
        assert algo in r.stdout
    assert "0.7018, 0.7504, 0.8000" in r.stdout and "clipped (zero gradient)" in r.stdout
    assert (tmp_path / "rl_fundamentals.png").stat().st_size > 10_000
