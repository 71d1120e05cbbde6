"""Smoke test: experiments/09_kv_cache.py runs end to end, printing the chapter 9 numbers."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "09_kv_cache.py"


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_experiment_09_corrected(tmp_path):
    out = _run("--out", str(tmp_path), "--calculators-only")
    assert "512.00 KiB" in out and "380.00 KiB" in out  # six-model table (seed 002 ch9 [R])
    assert "1,572,864 tokens, 384 requests" in out  # 480 GiB / 327,680 B at 4K
    assert "131072 context: 480 GB for KV, 1,572,864 tokens, 12 requests" in out  # seed: ~12
    assert "saved 54.4%" in out and "16.22 GB (82.5%)" in out  # prefix demo [R]
    assert "Mistral-7B      1.00 GiB per request ->  64" in out  # Ex1
    assert (tmp_path / "09_kv_capacity.png").read_bytes()[:4] == b"\x89PNG"


def test_experiment_09_seed_faithful(tmp_path):
    out = _run("--seed-faithful", "--out", str(tmp_path), "--calculators-only")
    assert "mode: seed-faithful" in out
    assert out.count("Model does not fit in GPU memory") == 4  # defect 8 (docs/seed-notes.md)


INT8_SHORT = ["--int8-steps", "3", "--int8-seq", "64"]  # the int8 section's code, on a short run


@pytest.mark.slow
@pytest.mark.first_line
def test_experiment_09_real_cache_and_int8_sections(tmp_path):
    """The seed's six requests through the engine's radix cache (page size 1): 31 of 57 prompt
    tokens served from the cache and 26 KV pages held, the seed trie's [RUN] numbers; the
    generated tokens are the same without the cache. Section 6 on a 3-step model at 64
    positions (docs/serving.md's figures come from the default 300 steps at 1,024): bytes per
    token beside calc kv with the scales' share, and the loss and largest logit difference,
    full cache against int8, at 16 and 64 positions."""
    import re

    out = _run("--out", str(tmp_path), "--runs", str(tmp_path), *INT8_SHORT)
    assert "57 prompt tokens, 31 served from the cache (hit rate 54.4%)" in out
    assert "the tree holds 26 KV pages" in out
    assert "with the cache == without: True" in out
    # Llama-3-8B's 32 layers x 8 kv heads x 128: bf16 2 x 32 x 8 x 128 x 2 = 131,072 B; int8
    # the values' 65,536 B (calc kv --dtype-bytes 1) + a float32 scale per layer, head, K or V
    assert "llama-3-8b: bf16 131,072 B, int8 67,584 B (calc kv --dtype-bytes 1: 65,536 B" in out
    assert "+ the scales' 2,048 B): 1.94x the tokens per page" in out
    rows = re.findall(r"^\s+(16|64)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["16", "64"], out[-1500:]
    for _, full, int8, diff in rows:
        assert 0 < float(diff) < 0.5 and abs(float(int8) - float(full)) < 0.05
