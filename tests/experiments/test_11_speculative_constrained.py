"""experiments/11_speculative_constrained.py runs end to end: greedy speculative output equals
the target's (with a noisy copy of the target and with a trained smaller draft), measured tokens
per pass follow the closed form at the measured acceptance, every constrained output matches or
parses."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "11_speculative_constrained.py"


@pytest.mark.slow
@pytest.mark.first_line
def test_experiment_11_speculative_and_constrained(tmp_path):
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "1", "JAX_PLATFORMS": "cpu"}
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--tokens",
        "32",
        "--trained-steps",
        "20",
        "--runs",
        str(tmp_path),
    ]
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, check=True
    ).stdout
    row = r"^\s+([\d.]+)\s+(greedy|T=1)\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)\s+([\d.]+)\s+(\S+)"
    rows = re.findall(row, out, re.M)
    assert len(rows) == 8
    assert all(same == "yes" for _, mode, _, _, same in rows if mode == "greedy")
    for _, _, got, want, _ in rows:  # within one token per pass of (1 - g^(k+1)) / (1 - g)
        assert abs(float(got) - float(want)) < 0.5
    assert out.count("all match") == 3 and "all parse" in out and "MISMATCH" not in out
    assert out.count("tokens per target pass") == 2
    # part 4: a trained target and a trained smaller draft, greedy output the target's own
    trained = re.findall(
        r"^\s+trained\s+(greedy|T=0.7|T=1)\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)\s+"
        r"([\d.]+)\s+(\S+)",
        out,
        re.M,
    )
    assert [m for m, *_ in trained] == ["greedy", "T=0.7", "T=1"]
    assert trained[0][3] == "yes"
    assert (tmp_path / "target" / "checkpoints").is_dir() and (tmp_path / "draft").is_dir()
