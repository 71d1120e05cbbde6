"""experiments/10_scheduling.py runs end to end on the real model: a compiled program gives the
op-by-op result, the engine's bucketed programs stay within their bound and below the shapes an
unbucketed engine would compile, and the overlapped decode loop (device-resident tokens, host
work beside the device) and the engine reading its tokens a step late produce the sequential
ones' tokens. Its timings are reported, not
asserted (CPU timings are indicative)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "10_scheduling.py"


@pytest.mark.slow
@pytest.mark.first_line
def test_experiment_10_scheduling():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, str(SCRIPT), "--batch", "4", "--steps", "8"]
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, check=True
    ).stdout
    assert out.count("same: True") == 3  # op by op, unrolled jit, fori_loop jit
    compiled = int(re.search(r"programs compiled \(bucketed\): (\d+)", out).group(1))
    exact = int(re.search(r"unbucketed engine would compile: (\d+)", out).group(1))
    bound = int(re.search(r"mixing decode rows with chunks = (\d+)", out).group(1))
    assert compiled <= bound and compiled < exact
    assert out.count("the same tokens: True") == 2  # the decode loop, the engine
    assert re.search(r"^\s+device step alone\s+[\d.]+\s+1\.00x$", out, re.M)
    for row in ("engine, tokens read first", "engine, read a step late"):
        cells = rf"^\s+{row}\s+([\d.]+)\s+[\d.]+x\s+([\d.]+)$"  # ms, vs device, host ms
        step, host = re.search(cells, out, re.M).groups()
        assert 0 < float(host) <= float(step), row  # the host's part of the step's wall time
    for loop in ("sequential", "futuremap"):  # a measured and a simulated time per loop
        assert re.search(rf"^\s+{loop}\s+[\d.]+\s+[\d.]+$", out, re.M), loop
