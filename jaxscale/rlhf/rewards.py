"""KL-shaped rewards, advantages and the adaptive KL coefficient (seed 002 ch13 "The Reward
Calculation").

Sign convention (the seed prints it both ways, docs/seed-notes.md): the KL penalty is
beta x KL >= 0 on average and is SUBTRACTED, R_t = -beta * kl_t (+ the reward model's score at
the response's last token).

    k1  log pi(a) - log ref(a)                  the seed's per-token estimate; unbiased for
                                                KL(pi || ref) under samples from pi, but any one
                                                token can be negative
    k3  exp(-d) - 1 + d, d = log pi - log ref   (Schulman's k3) unbiased too, never negative

All arrays are [B, N] over response tokens with `mask_BN` marking real tokens (1 up to and
including the newline, 0 after).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

KL_ESTIMATORS = ("k1", "k3")
REWARD_MODES = ("response", "token")
WHITEN = ("batch", "response", "none")


def kl_per_token(logp_BN, ref_logp_BN, estimator: str = "k1"):
    d_BN = logp_BN - ref_logp_BN
    if estimator == "k1":
        return d_BN
    if estimator == "k3":
        return jnp.expm1(-d_BN) + d_BN
    raise ValueError(f"KL estimator must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}")


def last_index(mask_BN):
    """Index of each row's last real token [B] (0 for an empty row, which the mask zeroes)."""
    return jnp.maximum(mask_BN.sum(-1).astype(jnp.int32) - 1, 0)


def shaped_rewards(score_B, kl_BN, mask_BN, beta, mode: str = "response"):
    """R [B, N] = -beta * kl, plus the score at the last real token ("response": the seed's
    end-only reward, rlhf_loop_pseudo.py) or spread evenly over the real tokens ("token")."""
    m = mask_BN.astype(jnp.float32)
    r_BN = -beta * kl_BN * m
    if mode == "response":
        at_end_BN = jax.nn.one_hot(last_index(mask_BN), m.shape[1]) * m
        return r_BN + score_B[:, None] * at_end_BN
    if mode == "token":
        return r_BN + score_B[:, None] * m / jnp.maximum(m.sum(-1, keepdims=True), 1.0)
    raise ValueError(f"reward mode must be one of {', '.join(REWARD_MODES)}, got {mode!r}")


def masked_mean(x, mask, axis=None):
    m = mask.astype(jnp.float32)
    return (x * m).sum(axis) / jnp.maximum(m.sum(axis), 1.0)


def whiten(adv_BN, mask_BN, how: str = "batch", eps: float = 1e-8):
    """Advantages scaled to mean 0 and (population) std 1 over the batch's real tokens, or each
    response's own (the seed's choice, rlhf_loop_pseudo.py), or left alone."""
    if how not in WHITEN:
        raise ValueError(f"whitening must be one of {', '.join(WHITEN)}, got {how!r}")
    if how == "none":
        return adv_BN
    axis = None if how == "batch" else -1
    mean = masked_mean(adv_BN, mask_BN, axis)
    mean = mean if axis is None else mean[:, None]
    var = masked_mean(jnp.square(adv_BN - mean), mask_BN, axis)
    var = var if axis is None else var[:, None]
    return (adv_BN - mean) * jax.lax.rsqrt(var + eps) * mask_BN


def group_advantages(score_B, group: int, eps: float = 1e-6):
    """GRPO (Shao et al. 2024): each response's score minus its prompt group's mean, over the
    group's std; rows are grouped as [prompt 0 x group, prompt 1 x group, ...]."""
    s_GK = score_B.reshape(-1, group)
    a_GK = (s_GK - s_GK.mean(-1, keepdims=True)) / (s_GK.std(-1, keepdims=True) + eps)
    return a_GK.reshape(-1)


def adaptive_beta(beta, kl, target: float, horizon: float, n: int):
    """Ziegler et al. (2019)'s proportional controller: beta x (1 + clip(KL/target - 1, +-0.2)
    x n / horizon), n = responses in the batch. A target of 0 keeps beta fixed."""
    if target <= 0:
        return beta
    err = min(max(kl / target - 1.0, -0.2), 0.2)  # host floats: beta is set between iterations
    return beta * (1.0 + err * n / horizon)
