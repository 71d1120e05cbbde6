"""RLHF reward shaping with a KL penalty: the seed's `reward_calculator.py` (seed 002 ch. 13),
pure Python, no jax.

One sign convention throughout (the seed mixes two, docs/seed-notes.md): each sampled token t has
a KL estimate kl_t; its penalty is beta·kl_t and its reward is -beta·kl_t, plus the reward-model
(RM) score at the last token (or RM/N on every token when the score is spread). For the response:

    penalty = beta·sum_t kl_t        net = rm_score - penalty = sum_t reward_t

Estimators of KL(actor || ref) from one token sampled from the actor, with r = ref_lp - actor_lp:
- k1 = -r = actor_lp - ref_lp (the seed's): unbiased, but a single token's value, and on a short
  response even the sum, can be negative, which turns the "penalty" into a bonus;
- k3 = exp(r) - r - 1 (Schulman's estimator): unbiased too and >= 0 for every token, = 0 iff the
  two log-probs are equal, ~ r^2/2 (so ~ k1^2/2) for small r.

The seed's demo inputs (log-probs, the beta sweep, four scenarios, the page's 0.85 - beta·0.45
example) are kept here as constants; tests/test_calc_reward.py checks the seed's golden numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ESTIMATORS = ("k1", "k3")

# the script's 8-token response (main) and its defaults
SEED_ACTOR_LPS = (-1.2, -0.8, -1.5, -0.9, -1.1, -1.0, -0.7, -1.3)
SEED_REF_LPS = (-1.0, -1.0, -1.2, -1.0, -1.0, -1.1, -1.0, -1.0)
SEED_KL_COEF, SEED_RM_SCORE = 0.02, 0.5
# the "KL coefficient effect" demo: a 5-token response at RM 0.5 (sum of k1 = -0.1)
SWEEP_ACTOR_LPS = (-1.0, -1.2, -0.8, -1.5, -0.9)
SWEEP_REF_LPS = (-1.1, -1.0, -1.0, -1.2, -1.0)
SWEEP_KL_COEFS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.5)
# the "KL divergence scenarios" demo (the seed runs them at beta 0.02, RM 0.5)
SCENARIOS = (
    ("Low divergence", (-1.0, -1.1, -0.9), (-1.0, -1.0, -1.0)),
    ("High divergence", (-0.5, -2.0, -0.3), (-1.5, -0.8, -1.2)),
    ("More confident than reference", (-0.2, -0.3, -0.2), (-1.0, -1.0, -1.0)),
    ("Less confident than reference", (-2.0, -2.5, -2.0), (-1.0, -1.0, -1.0)),
)
# the page's prose example: R = 0.85 - beta·0.45 (a total KL, not computed by the script)
PROSE_RM_SCORE, PROSE_TOTAL_KL = 0.85, 0.45
PROSE_KL_COEFS = (0.0, 0.1, 0.5, 1.0)
TYPICAL_KL_COEFS = (0.01, 0.05)  # the seed's "Typical values: 0.01 - 0.05"
CANCELLED = 1e-12  # |sum| / sum|terms| below this is float noise of a sum that cancels


def kl_k1(actor_lp: float, ref_lp: float) -> float:
    """The seed's per-token estimate: the log-ratio of the sampled token (any sign)."""
    return actor_lp - ref_lp


def kl_k3(actor_lp: float, ref_lp: float) -> float:
    """exp(r) - r - 1 with r = ref_lp - actor_lp: >= 0, 0 iff equal. expm1 keeps the digits
    that exp(r) - 1 would cancel away when r is small."""
    r = ref_lp - actor_lp
    return math.expm1(r) - r


def kl_per_token(
    actor_lps: Sequence[float], ref_lps: Sequence[float], estimator: str = "k1"
) -> list[float]:
    if estimator not in ESTIMATORS:
        raise ValueError(f"--estimator {estimator!r}: choose one of {', '.join(ESTIMATORS)}")
    if len(actor_lps) != len(ref_lps):  # the seed's zip() silently drops the tail
        raise ValueError(
            f"{len(actor_lps)} actor log-probs but {len(ref_lps)} reference log-probs: "
            "one per token of the same response"
        )
    if not actor_lps:  # the seed's mean KL divides by zero
        raise ValueError("the response has no tokens")
    bad = [x for x in (*actor_lps, *ref_lps) if not (math.isfinite(x) and x <= 0)]
    if bad:
        raise ValueError(f"log-prob {bad[0]} is not a finite number <= 0")
    kl = kl_k1 if estimator == "k1" else kl_k3
    return [kl(a, r) for a, r in zip(actor_lps, ref_lps, strict=True)]


@dataclass(frozen=True)
class Rewards:
    """One response's shaped rewards; lists have one entry per token."""

    kl_coef: float  # beta
    rm_score: float
    kl: list[float]  # per-token KL estimate (nats)
    rm: list[float]  # RM score credited to each token
    rewards: list[float]  # rm_t - beta·kl_t

    @property
    def penalties(self) -> list[float]:
        return [self.kl_coef * k for k in self.kl]

    @property
    def total_kl(self) -> float:
        """sum_t kl_t; a sum that cancels to rounding noise (the seed's "Low divergence", k1
        [0, -0.1, +0.1] -> -1.1e-16) is 0, so a zero penalty is not reported as a bonus."""
        total = math.fsum(self.kl)
        return 0.0 if abs(total) <= CANCELLED * math.fsum(map(abs, self.kl)) else total

    @property
    def mean_kl(self) -> float:
        return self.total_kl / len(self.kl)

    @property
    def penalty(self) -> float:
        """beta·sum KL; negative (a bonus) when the k1 sum is."""
        return self.kl_coef * self.total_kl

    @property
    def net(self) -> float:
        """rm_score - penalty, which is the sum of the per-token rewards."""
        return sum(self.rewards)


def check_kl_coef(kl_coef: float) -> None:
    if not (math.isfinite(kl_coef) and kl_coef >= 0):
        raise ValueError(
            f"--kl-coef {kl_coef}: beta must be a finite number >= 0 (a negative beta would "
            "pay the policy for leaving the reference model)"
        )


def compute_rewards(
    actor_lps: Sequence[float],
    ref_lps: Sequence[float],
    rm_score: float,
    kl_coef: float,
    reward_at_end_only: bool = True,
    estimator: str = "k1",
) -> Rewards:
    """Per-token rewards -beta·kl_t, plus rm_score at the last token (`reward_at_end_only`, the
    seed's default: the RM scores the whole response and GAE carries it back) or rm_score/N on
    every token. The sum is rm_score - beta·sum kl either way."""
    check_kl_coef(kl_coef)
    if not math.isfinite(rm_score):
        raise ValueError(f"--rm-score {rm_score} is not a finite number")
    kl = kl_per_token(actor_lps, ref_lps, estimator)
    n = len(kl)
    if reward_at_end_only:
        rm = [0.0] * (n - 1) + [rm_score]
    else:
        rm = [rm_score / n] * n
    rewards = [r - kl_coef * k for r, k in zip(rm, kl, strict=True)]
    if not all(math.isfinite(x) for x in rewards) or not math.isfinite(sum(rewards)):
        raise ValueError(f"--kl-coef {kl_coef} and --rm-score {rm_score} overflow the rewards")
    return Rewards(kl_coef, rm_score, kl, rm, rewards)


def _seed_band(net: float, rm_score: float) -> str:
    """The seed's thresholds on the net reward (written for rm_score > 0)."""
    if net > rm_score * 0.8:
        return "Weak penalty"
    if net > 0:
        return "Moderate penalty"
    if net > -0.5:
        return "Strong penalty"
    return "Overwhelming penalty"


def effect(rm_score: float, penalty: float, *, seed_faithful: bool = False) -> str:
    """How strongly the penalty bites. The seed labels by net reward alone, so a bonus (net above
    the RM score) reads "Weak penalty"; corrected, a bonus and a zero penalty are named, and the
    seed's bands are applied to |rm_score| (the same bands when rm_score > 0)."""
    if seed_faithful:
        return _seed_band(rm_score - penalty, rm_score)
    if penalty < 0:
        return "Bonus (KL estimate < 0)"
    if penalty == 0:
        return "No penalty"
    return _seed_band(abs(rm_score) - penalty, abs(rm_score))


def kl_coef_sweep(
    rm_score: float,
    estimator: str = "k1",
    *,
    seed_faithful: bool = False,
    kl_coefs: Sequence[float] = SWEEP_KL_COEFS,
) -> list[dict]:
    """The seed's "KL coefficient effect" table on its 5-token response."""
    rows = []
    for beta in kl_coefs:
        out = compute_rewards(SWEEP_ACTOR_LPS, SWEEP_REF_LPS, rm_score, beta, estimator=estimator)
        rows.append(
            {
                "kl_coef": beta,
                "total_kl": out.total_kl,
                "penalty": out.penalty,
                "net_reward": out.net,
                "effect": effect(rm_score, out.penalty, seed_faithful=seed_faithful),
            }
        )
    return rows


def scenarios(rm_score: float, kl_coef: float, estimator: str = "k1") -> list[dict]:
    """The seed's four 3-token scenarios."""
    rows = []
    for name, actor, ref in SCENARIOS:
        out = compute_rewards(actor, ref, rm_score, kl_coef, estimator=estimator)
        rows.append(
            {
                "name": name,
                "actor_logprobs": list(actor),
                "ref_logprobs": list(ref),
                "kl": out.kl,
                "total_kl": out.total_kl,
                "penalty": out.penalty,
                "net_reward": out.net,
            }
        )
    return rows


def prose_example() -> list[dict]:
    """The page's R = 0.85 - beta·0.45 for beta 0, 0.1, 0.5, 1.0."""
    return [
        {"kl_coef": b, "net_reward": PROSE_RM_SCORE - b * PROSE_TOTAL_KL} for b in PROSE_KL_COEFS
    ]
