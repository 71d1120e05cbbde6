"""GAE by hand: the seed's `gae_visualizer.py` (seed 002 ch12), pure Python, no jax.

The seed's trajectory (10 steps, terminal value 0), TD errors, advantages for several lambda, the
(gamma·lambda)^k weights and the 3-step numerical example. The jitted GAE used for training is
`jaxscale.rl.gae`; tests check the two against each other and against the seed's golden table.

Seed defects (docs/seed-notes.md): the weighting text is hard-coded for gamma = 0.99, lambda = 0.95
whatever --gamma says, and its last figure is wrong ("t+10: 0.53"; (0.9405)^10 = 0.5415); the
numerical example crashes (a NameError in its f-string) before printing anything;
--trajectory-length above 10 silently gives 10 steps.
"""

from __future__ import annotations

SEED_REWARDS = (0.1, 0.1, 0.2, 0.1, 0.5, 0.1, 0.3, 0.1, 0.1, 1.0)
SEED_VALUES = (0.8, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.3, 0.2, 0.1)
SEED_LAMBDAS = (0.0, 0.5, 0.9, 0.95, 1.0)
EXAMPLE_REWARDS, EXAMPLE_VALUES = (0.1, 0.2, 1.0), (0.5, 0.4, 0.2)
# the seed's weighting text (analyze_bias_variance), printed whatever gamma is
SEED_WEIGHT_TEXT = ((0, 1.00), (1, 0.94), (2, 0.88), (3, 0.83), (10, 0.53))
WEIGHT_STEPS = (0, 1, 2, 3, 10)


def td_errors(rewards, values, gamma: float, last_value: float = 0.0) -> list[float]:
    """delta_t = r_t + gamma V_{t+1} - V_t, with V after the last step = `last_value`."""
    nxt = list(values[1:]) + [last_value]
    return [r + gamma * v1 - v for r, v, v1 in zip(rewards, values, nxt, strict=True)]


def advantages(deltas, gamma: float, lam: float) -> list[float]:
    out, running = [], 0.0
    for d in reversed(deltas):
        running = d + gamma * lam * running
        out.append(running)
    return out[::-1]


def mc_advantages(rewards, values, gamma: float) -> list[float]:
    """G_t - V_t (the seed's unused compute_monte_carlo_returns): equals lambda = 1."""
    out, g = [], 0.0
    for r, v in zip(reversed(rewards), reversed(values), strict=True):
        g = r + gamma * g
        out.append(g - v)
    return out[::-1]


def weights(gamma: float, lam: float, steps=WEIGHT_STEPS) -> list[tuple[int, float]]:
    return [(k, (gamma * lam) ** k) for k in steps]


def check(gamma: float, lam: float, length: int, lambdas) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"--gamma {gamma} must be in [0, 1]")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"--lam {lam} must be in [0, 1]")
    bad = [x for x in lambdas if not 0.0 <= x <= 1.0]
    if bad:
        raise ValueError(f"--lambdas {bad[0]} must be in [0, 1]")
    if not 1 <= length <= len(SEED_REWARDS):
        raise ValueError(
            f"--trajectory-length {length}: the seed's trajectory has "
            f"{len(SEED_REWARDS)} steps; choose 1 to {len(SEED_REWARDS)}"
        )
