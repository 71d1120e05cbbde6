"""A run's outcome: a diverged seed is found and its metrics stay strict JSON."""

import json

import numpy as np
from figure_checks import capture, check_figure, legend_texts

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


def test_the_learning_curve_names_its_band_and_keeps_the_legend_off_the_data(tmp_path, monkeypatch):
    saved = capture(monkeypatch)
    cfg = RLConfig(num_envs=4, num_steps=8, total_steps=8 * 4 * 20, eval_every=5)
    steps = np.arange(cfg.n_updates)
    returns = np.stack([20 + 25 * steps, 10 + 26 * steps, 30 + 24 * steps]).astype(float)
    evals = returns[:, cfg.eval_every - 1 :: cfg.eval_every]
    metrics = {"episode_return": returns, "policy_loss": np.zeros_like(returns)}
    runs = {
        "ppo": run.Outcome(cfg, (0, 1, 2), metrics, evals, 1.0, 1.0, 1),
        "reinforce": run.Outcome(cfg, (0, 1, 2), {**metrics}, evals / 2, 1.0, 1.0, 1),
    }
    path = run.plot_curves(runs, tmp_path / "curve.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    ((fig, _),) = saved
    (legend,) = check_figure(fig)
    texts = legend_texts(legend)
    for label in runs:
        assert f"{label}: training episodes, min-max over 3 seeds" in texts
    (ax,) = fig.axes
    assert {c.get_label() for c in ax.collections} >= {
        f"{label}: training episodes, min-max over 3 seeds" for label in runs
    }
