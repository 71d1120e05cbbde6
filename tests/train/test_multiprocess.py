"""Training through the multi-host path: 2 processes x 4 devices (jax.distributed over loopback,
each process building only its own batch rows) gives the same run as 1 process with 8 devices."""

import json
import os
import re
import subprocess
import sys

import pytest

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.train.loop import RunSetup, train

pytestmark = pytest.mark.slow  # two processes that each compile the step; still run in CI

ARGS = [
    "--mesh",
    "dp=2,fsdp=2,tp=2",
    "--steps",
    "6",
    "--data",
    "markov",
    "--eval-every",
    "3",
    "--no-progress",
]


def test_two_processes_train_exactly_like_one(tmp_path):
    metrics = tmp_path / "m.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "jaxscale",
        "launch",
        "-n",
        "2",
        "--timeout",
        "240",
        "--all-ranks",
        "--",
        "jaxscale",
        "train",
        *ARGS,
        "--metrics",
        str(metrics),
        "--log-every",
        "1",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    evals = {}
    for proc, step, loss in re.findall(r"\[p(\d)\] step +(\d+) +eval loss ([\d.]+)", out.stdout):
        evals.setdefault(int(proc), []).append((int(step), float(loss)))
    assert evals[0] == evals[1] and [s for s, _ in evals[0]] == [3, 6]  # the processes agree
    # ... and one of them writes the metrics: every step once, not once per process
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(6))
    tcfg = TrainConfig(steps=6, eval_every=3)
    single = train(
        ModelConfig(),
        tcfg,
        RunSetup(mesh="dp=2,fsdp=2,tp=2", dataset="markov", progress=False, sample_tokens=0),
    )
    # ... and equal the single-process run (to the 4 printed decimals)
    assert evals[0] == [(e["step"], round(e["eval_loss"], 4)) for e in single.evals]
