"""Generalized advantage estimation as one reverse `lax.scan` (Schulman et al. 2016; seed 002
ch12, "Generalized Advantage Estimation (GAE)"):

    delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
    A_t     = m_t * (delta_t + gamma * lambda * (1 - done_t) * A_{t+1})

`terminated` stops bootstrapping (a true end has no value beyond it); `done` (terminated or
truncated) stops the recursion, since the next row belongs to a new episode. A truncated step still
bootstraps from V of the state it really reached, which the caller passes in `next_values`. `mask`
(1 for real positions, 0 for padding after a completion) zeroes padded advantages so they neither
count nor flow back; RLHF uses it for variable-length responses. lambda = 0 gives TD(0) errors,
lambda = 1 the Monte-Carlo return minus V.

Arrays are time-major, [T, ...]: any trailing batch shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards, values, next_values, terminated, done, gamma: float, lam: float, mask=None):
    """-> (advantages, returns), both shaped like `rewards`; returns = advantages + values."""
    f32 = jnp.float32
    not_term = 1.0 - terminated.astype(f32)
    not_done = 1.0 - done.astype(f32)
    m = jnp.ones_like(rewards, f32) if mask is None else mask.astype(f32)
    delta = rewards + gamma * not_term * next_values - values

    def back(a_next, xs):
        delta_t, not_done_t, m_t = xs
        a_t = m_t * (delta_t + gamma * lam * not_done_t * a_next)
        return a_t, a_t

    _, adv = jax.lax.scan(back, jnp.zeros_like(rewards[0], f32), (delta, not_done, m), reverse=True)
    return adv, adv + values * m


def discounted_returns(rewards, done, gamma: float):
    """G_t = r_t + gamma * (1 - done_t) * G_{t+1}, cut at episode ends and at the window's end."""
    zeros = jnp.zeros_like(rewards)
    adv, _ = gae(rewards, zeros, zeros, done, done, gamma, 1.0)
    # with V = 0 and no bootstrap, delta_t = r_t and A_t is the return itself
    return adv
