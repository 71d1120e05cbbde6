"""The losses of the policy-gradient family, one config for all of them, and the PPO clipping table.

    reinforce           -log pi(a|s) * G_t                       (Williams 1992)
    reinforce-baseline  -log pi(a|s) * (G_t - V(s)), V fit to G_t
    actor-critic        -log pi(a|s) * A_t, A_t from GAE(lambda), V fit to the GAE returns
    ppo                 -min(r A, clip(r, 1-eps, 1+eps) A), r = pi(a|s) / pi_old(a|s)  (seed 002
                        ch12 "PPO"), epochs x shuffled minibatches, value loss optionally clipped

G_t is the discounted return inside the rollout window (cut at episode ends; REINFORCE has no critic
to bootstrap with, so a window's last unfinished episode is cut short: use a long --num-steps).
Every loss is a mean over the local rows; `loop.py` averages gradients over the `data` axis.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxscale.rl import policy
from jaxscale.rl.config import ALGOS, RLConfig

__all__ = ["ALGOS", "RLConfig", "policy_loss", "clip_ratio", "clipped_objective"]


def policy_loss(cfg: RLConfig, logits, value, mb, adv):
    """-> (loss, metrics) on one minibatch; `mb` holds the rollout's action, logp, value, ret."""
    logp = policy.log_prob(logits, mb["action"])
    ent = policy.entropy(logits).mean()
    if cfg.algo == "ppo":
        log_ratio = logp - mb["logp"]
        ratio = jnp.exp(log_ratio)
        pg = -jnp.minimum(ratio * adv, clip_ratio(ratio, cfg.clip_eps) * adv).mean()
        clip_frac = (jnp.abs(ratio - 1.0) > cfg.clip_eps).mean()
        approx_kl = ((ratio - 1.0) - log_ratio).mean()  # Schulman's k3 estimator, >= 0
    else:
        pg = -(logp * adv).mean()
        clip_frac = approx_kl = jnp.float32(0.0)
    v_err = jnp.square(value - mb["ret"])
    if cfg.algo == "ppo" and cfg.clip_value:
        v_clip = mb["value"] + jnp.clip(value - mb["value"], -cfg.clip_eps, cfg.clip_eps)
        v_err = jnp.maximum(v_err, jnp.square(v_clip - mb["ret"]))
    v_loss = 0.5 * v_err.mean() if cfg.algo != "reinforce" else jnp.float32(0.0)
    loss = pg + cfg.vf_coef * v_loss - cfg.ent_coef * ent
    return loss, {
        "policy_loss": pg,
        "value_loss": v_loss,
        "entropy": ent,
        "clip_frac": clip_frac,
        "approx_kl": approx_kl,
    }


def clip_ratio(ratio, eps: float):
    return jnp.clip(ratio, 1.0 - eps, 1.0 + eps)


def clipped_objective(ratio: float, advantage: float, eps: float = 0.2) -> tuple[float, bool]:
    """min(r A, clip(r) A) for one sample, and whether the clipped term is the one chosen (so
    the gradient with respect to r is zero). Pure Python: the seed's ch12 Try-It 3 table."""
    clipped = min(max(ratio, 1.0 - eps), 1.0 + eps)
    a, b = ratio * advantage, clipped * advantage
    return min(a, b), b < a


CLIPPING_CASES = (
    (1.0, 1.5),
    (1.0, 0.5),
    (-1.0, 0.5),
    (-1.0, 1.5),
    (1.0, 1.1),
)  # (A, r), seed order
