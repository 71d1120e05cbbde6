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


@pytest.mark.slow
@pytest.mark.first_line
def test_experiment_09_real_cache_matches_the_seed_trie(tmp_path):
    """The seed's six requests through the engine's radix cache (page size 1): 31 of 57 prompt
    tokens served from the cache and 26 KV pages held, the seed trie's [RUN] numbers; the
    generated tokens are the same without the cache."""
    out = _run("--out", str(tmp_path))
    assert "57 prompt tokens, 31 served from the cache (hit rate 54.4%)" in out
    assert "the tree holds 26 KV pages" in out
    assert "with the cache == without: True" in out
