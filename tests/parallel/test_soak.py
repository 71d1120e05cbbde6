"""Soak (slow): every pipeline schedule composed with tensor and expert parallelism (one
pp=2,ep=2,tp=2 mesh: both in each program) trains 50 steps on the default 8 simulated devices as
a user runs it (its own process, the compiler's defaults) and exits 0 -- no abort, no hang. A
user's run of the interleaved schedule with TP once aborted on XLA:CPU's collective rendezvous
timeout (docs/pipeline.md, "Collective order on XLA:CPU")."""

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.first_line]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
MESH = ["--mesh", "pp=2,ep=2,tp=2", "--experts", "8"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fifty_steps_of_every_schedule_with_tp_and_ep(schedule):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_DISABLE_MOST_OPTIMIZATIONS", "XLA_FLAGS")
    }
    argv = [sys.executable, "-m", "jaxscale", "train", "--data", "markov", "--layers", "4"]
    argv += ["--global-batch", "8", "--seq-len", "16", "--no-progress", "--sample-tokens", "0"]
    argv += ["--schedule", schedule, "--steps", "50", *MESH]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert "step    50" in r.stdout and "final train loss" in r.stdout, r.stdout[-2000:]
