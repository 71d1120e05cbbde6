"""Seed 002 ch. 7's mixture-of-experts demos on the real model: what the aux loss does to the
experts' load while training (experiments/08_experts.py, tests/parallel/test_moe_training.py).

`load_balance` trains the same MoE model twice on the same batches, with Switch's balance loss
and without it, under expert parallelism, and records every step's per-expert load (each
expert's share of the routed assignments, per MoE layer), its max/mean and the drop fraction.
"""

from __future__ import annotations

import numpy as np

from jaxscale.config import ModelConfig, TrainConfig

MOE = ModelConfig(n_experts=8, top_k=2, capacity_factor=1.25)
BAND = 2.0  # max/mean load the balance loss keeps the run under (the last LATE steps)
LATE = 50


def load_balance(
    steps: int = 150,
    weights=(0.01, 0.0),
    mesh: str = "ep=4,dp=2",
    strategy: str = "manual:dp+ep",
    cfg: ModelConfig = MOE,
    progress: bool = False,
) -> dict[float, dict]:
    """{aux weight: {"load" [steps, MoE layers, E], "max_over_mean" [steps], "drop" [steps],
    "ce" [steps]}} from one training run per weight (markov data, seed 0)."""
    from jaxscale.train.loop import RunSetup, train

    tcfg = TrainConfig(
        steps=steps, global_batch=16, seq_len=64, log_every=1, eval_every=0, warmup_steps=10
    )
    out = {}
    for w in weights:
        setup = RunSetup(
            mesh=mesh, strategy=strategy, dataset="markov", progress=progress, sample_tokens=0
        )
        h = train(cfg.replace(aux_loss_weight=w), tcfg, setup).history
        out[w] = {
            "load": np.array([r["expert_load"] for r in h]),
            "max_over_mean": np.array([r["load_max_over_mean"] for r in h]),
            "drop": np.array([r["drop_fraction"] for r in h]),
            "ce": np.array([r["ce"] for r in h]),
        }
    return out


def late(run: dict, key: str = "max_over_mean") -> np.ndarray:
    return run[key][-LATE:]


def plot(runs: dict[float, dict], path) -> None:
    """Per-expert load of the first MoE layer over steps, one panel per aux weight, and the
    max/mean of both runs."""
    from jaxscale.render import figure

    weights = sorted(runs, reverse=True)
    with figure(path, 1, len(weights) + 1, figsize=(15, 4.5)) as (_, axes):
        for ax, w in zip(axes, weights, strict=False):
            load = runs[w]["load"][:, 0, :]
            for e in range(load.shape[1]):
                ax.plot(load[:, e], lw=1, label=f"expert {e}")
            ax.axhline(1 / load.shape[1], color="k", ls="--", lw=1, label="1/E")
            ax.set(
                title=f"aux loss weight {w:g}: load per expert (layer 0)",
                xlabel="step",
                ylabel="share of assignments",
            )
        axes[0].legend(fontsize=7, ncol=2)
        ax = axes[-1]
        for w in weights:
            ax.plot(runs[w]["max_over_mean"], label=f"aux {w:g}")
        ax.axhline(BAND, color="k", ls=":", lw=1, label=f"band {BAND:g}")
        ax.set(title="max / mean expert load (worst layer)", xlabel="step", ylabel="max/mean")
        ax.legend()
