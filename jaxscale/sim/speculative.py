"""Speculative decoding: closed forms and seed 000's draft/verify Monte-Carlo.

Model (seed 000, the Training & Serving at Scale notebook, Exercise 2 "Speculative Decoding
Simulator", its reference `simulate_speculative_decoding`): each of K drafted tokens matches the
target independently with probability gamma (match_prob); the target verifies all K in one pass and
keeps the drafts up to the first mismatch, plus one token of its own (the correction at the
mismatch, or the next token when all K match). Hence tokens per target pass = accepted + 1 and

    E[tokens per pass] = 1 + gamma + ... + gamma^K = (1 - gamma^(K+1)) / (1 - gamma).

Seed 002 ch11 ("Speedup Analysis") states this formula but prints 3.36 for gamma=0.8, K=5; the
formula gives 3.68928, and 3.36 is (1 - gamma^K) / (1 - gamma) (defect 9), which is what a scheme
without the extra target token achieves (see `speculative_demo`).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MATCH_PROBS = (0.5, 0.6, 0.7, 0.8, 0.9)  # seed 000 Exercise 2, the match-probability sweep
DRAFT_LENGTHS = tuple(range(1, 9))  # seed 000 Exercise 2, the K sweep


def _check_gamma_k(gamma: float, k: int) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"acceptance probability must be in [0, 1], got {gamma}")
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"draft length must be a non-negative integer, got {k!r}")


def expected_tokens_per_pass(gamma: float, k: int) -> float:
    """(1 - gamma^(k+1)) / (1 - gamma): accepted drafts plus the target's own token."""
    _check_gamma_k(gamma, k)
    if gamma == 1.0:
        return float(k + 1)
    return (1.0 - gamma ** (k + 1)) / (1.0 - gamma)


def seed_expected_tokens_per_pass(gamma: float, k: int) -> float:
    """(1 - gamma^k) / (1 - gamma): the value the seed prints (3.36 for 0.8, 5), defect 9."""
    _check_gamma_k(gamma, k)
    if gamma == 1.0:
        return float(k)
    return (1.0 - gamma**k) / (1.0 - gamma)


def speedup_with_draft_cost(gamma: float, k: int, draft_cost: float) -> float:
    """E[tokens] / (1 + k*c): c = cost of one drafted token relative to one target pass.

    Seed 002 ch11, "Exercise 1: Calculate Speedup": gamma 0.75, k 4, c 0.05 -> 3.0508 / 1.2 = 2.54x.
    """
    if draft_cost < 0:
        raise ValueError(f"draft cost must be >= 0, got {draft_cost}")
    return expected_tokens_per_pass(gamma, k) / (1.0 + k * draft_cost)


def expected_speedup_timed(
    gamma: float, k: int, draft_time_ms: float, target_time_ms: float
) -> float:
    """Per-round expectation under the notebook's timing: E[tokens] * T / (k*d + T)."""
    if draft_time_ms < 0 or target_time_ms <= 0:
        raise ValueError("need draft_time_ms >= 0 and target_time_ms > 0")
    e = expected_tokens_per_pass(gamma, k)
    return e * target_time_ms / (k * draft_time_ms + target_time_ms)


def perfect_draft_speedup(
    k: int, draft_time_ms: float, target_time_ms: float, seed_faithful: bool = False
) -> float:
    """Speedup with match_prob = 1: every round yields k + 1 tokens.

    Seed 000 Exercise 2 (the match-probability cell's closing text) gives k*T/(k*d + T), dropping
    the +1 token its own simulator counts; `seed_faithful=True` returns that value.
    """
    tokens = k if seed_faithful else k + 1
    return tokens * target_time_ms / (k * draft_time_ms + target_time_ms)


@dataclass(frozen=True)
class SweepConfig:
    total_tokens: int = 100  # tokens to generate per trial (the K-sweep cell's constants)
    match_prob: float = 0.70  # same cell
    draft_time_ms: float = 10.0  # per drafted token (same cell)
    target_time_ms: float = 50.0  # per target pass, whatever K (same cell)
    num_trials: int = 200  # simulate_speculative_decoding's default
    seed: int = 42  # np.random.seed(42) before each sweep (both sweep cells)

    def validate(self) -> None:
        if self.total_tokens < 1 or self.num_trials < 1:
            raise ValueError("total_tokens and num_trials must be >= 1")
        _check_gamma_k(self.match_prob, 1)
        if self.draft_time_ms < 0 or self.target_time_ms <= 0:
            raise ValueError("need draft_time_ms >= 0 and target_time_ms > 0")


@dataclass(frozen=True)
class SweepPoint:
    k: int
    match_prob: float
    avg_rounds: float
    avg_accepted_per_round: float  # mean over trials of each trial's mean (as the notebook)
    avg_time_ms: float
    baseline_time_ms: float  # total_tokens target passes

    @property
    def avg_tokens_per_round(self) -> float:
        return self.avg_accepted_per_round + 1.0

    @property
    def speedup(self) -> float:
        return self.baseline_time_ms / self.avg_time_ms


def simulate_round(k: int, match_prob: float, rng: np.random.RandomState) -> int:
    """Accepted drafts in one round: accept until the first mismatch (as the seed's round does)."""
    accepted = 0
    for _ in range(k):
        if rng.random_sample() < match_prob:
            accepted += 1
        else:
            break
    return accepted


def simulate_decoding(
    k: int, cfg: SweepConfig, rng: np.random.RandomState, match_prob: float | None = None
) -> SweepPoint:
    """Trials of generating `total_tokens` (the last round may overshoot, as in the seed's loop)."""
    cfg.validate()
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"draft length must be a positive integer, got {k!r}")
    gamma = cfg.match_prob if match_prob is None else match_prob
    _check_gamma_k(gamma, k)
    rounds, accepted_means, times = [], [], []
    round_time = k * cfg.draft_time_ms + cfg.target_time_ms
    for _ in range(cfg.num_trials):
        generated, n_rounds, accepted = 0, 0, []
        while generated < cfg.total_tokens:
            a = simulate_round(k, gamma, rng)
            generated += a + 1
            n_rounds += 1
            accepted.append(a)
        rounds.append(n_rounds)
        accepted_means.append(np.mean(accepted))
        times.append(n_rounds * round_time)
    return SweepPoint(
        k,
        gamma,
        float(np.mean(rounds)),
        float(np.mean(accepted_means)),
        float(np.mean(times)),
        cfg.total_tokens * cfg.target_time_ms,
    )


def k_sweep(cfg: SweepConfig, ks: Sequence[int] = DRAFT_LENGTHS) -> list[SweepPoint]:
    """The notebook's K sweep (cell "Sweep draft length K"): one generator, seeded once."""
    rng = np.random.RandomState(cfg.seed)
    return [simulate_decoding(k, cfg, rng) for k in ks]


def match_prob_sweep(
    cfg: SweepConfig, match_probs: Sequence[float] = MATCH_PROBS, ks: Sequence[int] = DRAFT_LENGTHS
) -> dict[float, list[SweepPoint]]:
    """The notebook's match-probability sweep (Exercise 2's last cell): seeded once."""
    rng = np.random.RandomState(cfg.seed)
    return {mp: [simulate_decoding(k, cfg, rng, match_prob=mp) for k in ks] for mp in match_probs}


def sample_tokens_per_round(k: int, match_prob: float, n_rounds: int, seed: int) -> np.ndarray:
    """Tokens per target pass (accepted + 1) for n independent rounds, for statistics."""
    rng = np.random.RandomState(seed)
    return np.array([simulate_round(k, match_prob, rng) + 1 for _ in range(n_rounds)])


def best(points: Sequence[SweepPoint]) -> SweepPoint:
    """The point with the highest speedup (first one on ties, like np.argmax)."""
    return points[int(np.argmax([p.speedup for p in points]))]
