"""experiments/15_step_roofline.py measures `jaxscale train`'s step as a user runs it (layers
scanned) and unrolled: both count the same FLOPs, each trip of the layer loop included, and the
saved HLO of the scanned step holds its loop."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "15_step_roofline.py"
pytestmark = [pytest.mark.slow, pytest.mark.first_line]  # each compiles the step in a subprocess


def _run(*args: str) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, str(SCRIPT), "--steps", "2", *args]
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=300, check=True
    ).stdout


def _figures(out: str) -> tuple[float, float]:
    """(compiled/model FLOPs, tokens/s) as printed."""
    ratio = float(re.search(r"compiled/model = ([\d.]+)", out)[1])
    tokens = float(re.search(r"([\d,]+) tokens/s", out)[1].replace(",", ""))
    return ratio, tokens


def test_scanned_and_unrolled_steps_count_the_same_flops(tmp_path):
    hlo = tmp_path / "step.hlo"
    scanned = _run("--layers", "4", "--hlo-out", str(hlo))
    unrolled = _run("--layers", "4", "--unroll-layers")
    assert "layers scanned" in scanned and "layers unrolled" in unrolled
    (s_ratio, s_tokens), (u_ratio, u_tokens) = _figures(scanned), _figures(unrolled)
    # a loop body counted once would leave out three of the four layers' matmuls
    assert s_ratio == pytest.approx(u_ratio, abs=0.015), (scanned, unrolled)
    assert s_tokens > 0 and u_tokens > 0
    assert re.search(r"\bwhile\(", hlo.read_text())
    # the scan's stacks, which the unrolled step has not: written, then read back
    traffic = re.search(r"stack writes ([\d.]+) GB, stack reads ([\d.]+) GB", scanned)
    assert float(traffic[1]) > 0 and float(traffic[2]) > 0, scanned
    assert "stack traffic" not in unrolled
    # and on XLA:CPU every slot access is a copy apart from the matmuls (docs/performance.md)
    assert re.search(r"forward 0 of [1-9]\d* reads, 0 of [1-9]\d* writes; backward 0 of", scanned)
