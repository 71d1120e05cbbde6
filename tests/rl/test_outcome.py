"""A run's outcome: a diverged seed is found and its metrics stay strict JSON."""

import json

import numpy as np

from jaxscale.rl import run
from jaxscale.rl.config import RLConfig


def _outcome(loss_SU):
    cfg = RLConfig(num_envs=4, num_steps=8, total_steps=8 * 4 * 3, eval_every=1)
    assert cfg.n_updates == loss_SU.shape[1]
    evals = np.zeros((loss_SU.shape[0], 3))
    # no episode ended in the first update: its mean return is NaN by design, not a divergence
    episode_return = np.where(np.arange(3) == 0, np.nan, 20.0) * np.ones_like(loss_SU)
    metrics = {"policy_loss": loss_SU, "episode_return": episode_return}
    return run.Outcome(cfg, (7, 8), metrics, evals, 1.0, 1.0, 1)


def test_the_first_non_finite_update_of_each_seed_is_found(tmp_path):
    """`rl ppo --lr 1e30` exited 0 with a collapsed policy; the CLI now exits 3 naming these."""
    loss = np.array([[0.5, 0.4, 0.3], [0.5, np.inf, np.nan]])
    out = _outcome(loss)
    assert out.first_non_finite() == {8: 2}
    assert _outcome(loss[[0, 0]]).first_non_finite() == {}
    path = run.write_metrics(out, tmp_path / "metrics.jsonl")

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    records = [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]
    losses = [r["policy_loss"] for r in records if r["seed"] == 8 and "policy_loss" in r]
    assert losses == [0.5, None, None]
