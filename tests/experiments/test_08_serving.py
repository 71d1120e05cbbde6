"""experiments/08_inference_server.py and 08_inference_roofline.py run end to end: the seed's
server on its virtual clock beside the real engine on the same prompts (every request gets its
20 tokens, within the engine's bounded compiles), and prefill / decode timings for every prompt
length and batch size asked for."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
pytestmark = [pytest.mark.slow, pytest.mark.first_line]  # each compiles the model in a subprocess


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, str(EXPERIMENTS / script), *args]
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, check=True
    ).stdout


def test_experiment_08_inference_server():
    out = _run("08_inference_server.py", "-n", "5", "-b", "2")
    assert "1. the seed's server, virtual clock" in out
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    engine_rows = [r for r in rows if r[2] == "20"]  # request, prompt bytes, tokens, TTFT, done
    assert sorted(int(r[0]) for r in engine_rows) == list(range(5))
    assert all(float(ttft) <= float(done) for *_, ttft, done in engine_rows)
    shapes = int(re.search(r"(\d+) compiled shapes", out).group(1))
    assert 1 <= shapes <= int(re.search(r"compiling (\d+) shapes", out).group(1))


def test_experiment_08_inference_roofline():
    out = _run("08_inference_roofline.py", "--prompts", "8,16", "--batches", "1,4", "--reps", "2")
    prefill = re.findall(r"^\s+(8|16)\s+([\d.]+)\s", out, re.M)
    decode = re.findall(r"^\s+(1|4)\s+([\d.]+)\s+([\d,]+)\s", out, re.M)
    assert [p[0] for p in prefill] == ["8", "16"] and [d[0] for d in decode] == ["1", "4"]
    assert all(float(ms) > 0 for _, ms, *_ in prefill + decode)
    # the serving engine at the same batches: step ms, host ms (a part of the step), tokens/s
    # and that as a share of the bare decode step's
    table = out[out.index("engine batch") :]
    engine = re.findall(r"^\s+(1|4)\s+([\d.]+)\s+([\d.]+)\s+([\d,]+)\s+([\d.]+)%", table, re.M)
    assert [e[0] for e in engine] == ["1", "4"], table
    for b, step, host, per_s, share in engine:
        assert 0 < float(host) <= float(step)
        assert float(per_s.replace(",", "")) == pytest.approx(int(b) / float(step) * 1e3, rel=0.01)
        assert 0 < float(share)
