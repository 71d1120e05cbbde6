"""Smoke test: experiments/00_systems_estimates.py runs seed 001 end to end and writes its plots."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "00_systems_estimates.py"


def test_experiment_00_systems_estimates(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for section in ("# 2. Chinchilla", "# 5. FLOPs", "# 7. Communication", "# 10. RL training"):
        assert section in out
    assert "LLaMA-2-70B   70.0B        1,400.0B" in out  # 20 tokens per parameter (seed 001 §2)
    assert "TP=8, PP=2, DP=32" in out  # recommend_parallelism, LLaMA-2-70B on 512 GPUs
    assert "Async, best split" in out and "mode: corrected" in out
    for name in ("chinchilla", "training_time", "rl_throughput"):
        assert (tmp_path / f"00_systems_{name}.png").read_bytes()[:4] == b"\x89PNG"
