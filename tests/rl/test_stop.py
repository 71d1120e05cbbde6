"""Stopping an RL run keeps what finished: the chunks of updates before the stop are the
uninterrupted run's, bitwise; the command writes them and exits 130 (before: Ctrl-C waited for
the whole compiled run, then threw its results away)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from jaxscale.rl import run
from jaxscale.rl.config import RLConfig
from jaxscale.tolerances import RL_DP_ATOL

# 4 chunks of 2 updates, one evaluation per chunk
CFG = RLConfig(
    num_envs=4,
    num_steps=16,
    total_steps=4 * 2 * 64,
    eval_every=2,
    eval_episodes=4,
    epochs=1,
    minibatches=1,
    hidden=8,
)


class _StopAt:
    """Set from the n-th time it is asked (asked once per chunk, before the chunk)."""

    def __init__(self, n: int):
        self.n, self.asked = n, 0

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked > self.n


@pytest.fixture(scope="module")
def whole():
    return run.train(CFG, [0, 1])


@pytest.mark.parametrize("chunks", [2])
def test_the_chunks_before_a_stop_are_the_uninterrupted_runs(whole, chunks):
    part = run.train(CFG, [0, 1], stop=_StopAt(chunks))
    assert part.cfg.n_updates == chunks * CFG.eval_every
    assert part.evals.shape == (2, chunks)
    np.testing.assert_allclose(part.evals, whole.evals[:, :chunks], rtol=0, atol=RL_DP_ATOL)
    assert set(part.metrics) == set(whole.metrics)
    # the stoppable program is compiled with a conditional around each chunk, so its rounding
    # may differ; a wrong or shifted chunk would differ far beyond the data-parallel tolerance
    for k, v in part.metrics.items():
        want = whole.metrics[k][:, : part.cfg.n_updates]
        np.testing.assert_allclose(v, want, rtol=0, atol=RL_DP_ATOL, err_msg=k)


def test_a_stop_before_the_first_chunk_keeps_nothing():
    stop = threading.Event()
    stop.set()
    with pytest.raises(run.Stopped, match="before the first 2 updates"):
        run.train(CFG, [0], stop=stop)


@pytest.mark.slow  # the command in a subprocess, interrupted
@pytest.mark.first_line
@pytest.mark.parametrize("signals", [("SIGINT",), ("SIGTERM",), ("SIGINT", "SIGINT")])
def test_a_signal_writes_the_finished_updates_and_exits_130(tmp_path, signals):
    """Ctrl-C or SIGTERM once: the finished updates are written, exit 130. Ctrl-C twice: exit
    130 at once (or, if the first stop had already finished, as once), never a traceback."""
    from jaxscale.rl.cli import ABORT_NOTE, STOP_NOTE

    out = tmp_path / "rl"
    cmd = [sys.executable, "-m", "jaxscale", "rl", "ppo", "--total-steps", "2000000"]
    cmd += ["--num-envs", "8", "--eval-episodes", "0", "--out", str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        # the bar's first line (a tenth of the updates done): compiled and running
        while not any("ppo cartpole [" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)[-2000:]
            time.sleep(0.05)
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(0.05)  # two signals sent at once may arrive as one
        assert proc.wait(timeout=120) == 130, "".join(lines)[-2000:]
    finally:
        proc.kill()
    time.sleep(0.2)  # the reader's last lines
    text = "".join(lines)
    assert STOP_NOTE in text and "Traceback" not in text, text[-2000:]
    done = re.search(r"stopped after (\d+) of (\d+) updates", text)
    if len(signals) == 2 and ABORT_NOTE in text:
        assert not done, text[-2000:]  # aborted before writing
        return
    assert done and 0 < int(done[1]) < int(done[2]), text[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("update", 0) for r in records) == int(done[1])
    assert (out / "learning_curve.png").stat().st_size > 0
