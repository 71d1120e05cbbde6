"""Smoke tests: experiments 01-04 run end to end with small arguments and print the seed's
numbers (what the seeds' scripts print, or their formulas give)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def run(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="8", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=ROOT,
        env=env,
    )
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_01_hello_distributed_eight_ranks():
    out = run("01_hello_distributed.py", "-w", "8").stdout
    assert "all_reduce (SUM) result: 28.0" in out  # seed 002 ch1, W=8
    assert "Expected: 0 + 1 + ... + 7 = 28" in out and "Correct: True" in out
    assert "From rank 7: [70.0, 71.0]" in out and "[Rank 7] I handle odd data!" in out
    assert "RANK                   not set" in out


def test_02_point_to_point_corrected_and_patterns():
    out = run("02_point_to_point.py", "-m", "2", "--batch-size", "4", "--hidden-size", "8").stdout
    assert "After 2 relay additions of 10: 62.0" in out and "Expected: 62.0" in out
    assert "rank 0 ends with 30.0; from 42: 72.0" in out  # ch2 Ex1
    assert "=> DEADLOCK" in out and "=> HANG" in out
    assert "rank 1 reads x before wait: 0.0" in out
    assert "hops per microbatch: 3" in out


def test_02_seed_faithful_prints_the_seeds_expected():
    out = run("02_point_to_point.py", "--seed-faithful", "-m", "1", "--hidden-size", "4").stdout
    assert "After 3 additions of 10: 62.0" in out and "Expected: 72.0" in out  # defect 1


@pytest.mark.slow  # whole experiment in a subprocess
@pytest.mark.first_line
def test_03_collectives_cheatsheet_and_exercises():
    out = run("03_collectives.py", "-w", "4", "-d", "10").stdout
    assert "Rank 3: [10.0, 20.0] | [10.0, 20.0]" in out  # all_reduce, seed 002 ch3
    assert "Rank 2: [30.0] | [30.0]" in out  # reduce_scatter: rank i gets 10(i+1)
    assert "Ex1 mean of [1..4] = 2.5" in out
    assert "ppermute version agrees: False" not in out
    assert "all_reduce         2D(N-1)/N     6,144   6 x collective-permute 1,024 B" in out


@pytest.mark.slow  # whole experiment in a subprocess
@pytest.mark.first_line
def test_04_collective_algorithms(tmp_path):
    plot = tmp_path / "04.png"
    out = run(
        "04_collective_algorithms.py", "--sizes", "1000,100000", "-i", "2", "--plot", str(plot)
    ).stdout
    assert "MISMATCH" not in out and "ring                     6       24,576" in out
    assert "2.22 ms" in out and "62.50 ms" in out  # seed 002 ch4 (seed column)
    for golden in ("1.71ms", "5.86ms", "0.43ms", "17.09ms", "1.92ms"):  # seed 004 §11
        assert golden in out
    if "simulated DGX-A100" in out:
        assert "NVLink connections (28 pairs)" in out
    assert "Bandwidth" in out and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "script, args",
    [("04_collective_algorithms.py", ["-w", "1"]), ("03_collectives.py", ["-w", "3", "-d", "1"])],
)
def test_bad_arguments_exit_2(script, args):
    out = run(script, *args, check=False)
    assert out.returncode == 2 and "error" in out.stderr
