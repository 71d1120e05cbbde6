"""Smoke test: experiments/00_training_and_serving_at_scale.py runs end to end with small arguments.

Expected numbers: 70B on 8 GPUs is 840 GB = 140 + 140 + 560; ZeRO-1/2/3 give 350 / 227.5 / 105 GB
(seed 000 Exercise 1's code; seed 002 ch5 has 210 for ZeRO-2); 7B on 4 GPUs with ZeRO-1 is 14 + 14 +
56/4 = 42 GB; seed 003's static batch wastes 53.75% (computed from its 8 lengths) where its text
claims 22.5%.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "00_training_and_serving_at_scale.py"
PLOTS = ("00_ex1_zero_70b.png", "00_ex2_speculative.png", "00_ex3_batching.png")


def test_experiment_00_runs_and_prints_the_seed_tables(tmp_path):
    argv = [
        sys.executable,
        str(SCRIPT),
        "--trials",
        "5",
        "--requests",
        "12",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for n in (1, 2, 3, 4):
        assert f"=== Exercise {n}" in out
    # exercise 1: the 70B rows on 8 GPUs
    assert re.search(r"ZeRO-0\s+140\.0 GB\s+140\.0 GB\s+560\.0 GB\s+840\.0 GB\s+NO", out)
    assert re.search(r"ZeRO-1 .* 350\.0 GB\s+NO", out)
    assert re.search(r"ZeRO-2 .* 227\.5 GB\s+NO", out)
    assert re.search(r"ZeRO-3 .* 105\.0 GB\s+NO", out)
    assert "70B ZeRO-1 on 8: 350.0 GB" in out and "~210 GB" in out
    # exercise 2: one row per draft length K = 1..8, speedups positive
    speedups = re.findall(
        r"^\s*([1-8])\s+\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+([\d.]+)x$", out, re.M
    )
    assert [k for k, _ in speedups] == [str(k) for k in range(1, 9)]
    assert all(float(s) > 0 for _, s in speedups)
    # exercise 3: continuous batching never needs more steps than static
    ratio = float(re.search(r"Throughput: ([\d.]+)x", out).group(1))
    assert ratio >= 1.0
    assert "53.75% wasted" in out and "22.5%" in out
    # exercise 4: seed 000's five configurations
    assert re.search(r"\(c\) LLaMA 7B, 4 GPUs\s+ZeRO Stage 1 \+ DATA PARALLELISM\s+42\.0 GB", out)
    assert re.search(r"\(d\) LLaMA 70B, 8 GPUs\s+INSUFFICIENT RESOURCES\s+-\s+nothing fits", out)
    assert re.search(
        r"\(e\) 175B Model, 64 GPUs\s+ZeRO Stage 3 \+ DATA PARALLELISM\s+32\.8 GB", out
    )
    for name in PLOTS:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
