"""Stopping an RL run keeps what finished: the chunks of updates before the stop are the
uninterrupted run's, bitwise; the command writes them and exits 130 (before: Ctrl-C waited for
the whole compiled run, then threw its results away). The command stopped by Ctrl-C and
SIGTERM: tests/test_fuzz_signals.py."""

import threading

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
