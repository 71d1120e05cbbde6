"""The actor-critic: two tanh MLPs (Flax NNX), a categorical policy head and a scalar value head.

Separate actor and critic bodies, orthogonal initialisation with gain sqrt(2) for hidden layers,
0.01 for the policy logits (a near-uniform first policy) and 1 for the value: the choices of the
PPO implementation-details study (Huang et al. 2022) that purejaxrl also makes. Inside the jitted
training loop the module is split once into (graphdef, params) and applied as a pure function.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx


def _dense(n_in: int, n_out: int, gain: float, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        n_in,
        n_out,
        kernel_init=jax.nn.initializers.orthogonal(gain),
        bias_init=jax.nn.initializers.zeros,
        rngs=rngs,
    )


class MLP(nnx.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int, out_gain: float, *, rngs: nnx.Rngs):
        g = math.sqrt(2.0)
        self.l1 = _dense(n_in, hidden, g, rngs)
        self.l2 = _dense(hidden, hidden, g, rngs)
        self.out = _dense(hidden, n_out, out_gain, rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.l2(jnp.tanh(self.l1(x)))))


class ActorCritic(nnx.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64, *, rngs: nnx.Rngs):
        self.actor = MLP(obs_dim, hidden, n_actions, 0.01, rngs=rngs)
        self.critic = MLP(obs_dim, hidden, 1, 1.0, rngs=rngs)

    def __call__(self, obs_BO):
        """-> (logits [B, A], value [B])"""
        return self.actor(obs_BO), self.critic(obs_BO)[..., 0]


def functional(obs_dim: int, n_actions: int, hidden: int):
    """-> (init(key) -> params, apply(params, obs) -> (logits, value), value(params, obs) -> value),
    pure functions of pytrees."""
    graphdef, _ = nnx.split(
        nnx.eval_shape(lambda: ActorCritic(obs_dim, n_actions, hidden, rngs=nnx.Rngs(0)))
    )

    def init(key):
        return nnx.split(ActorCritic(obs_dim, n_actions, hidden, rngs=nnx.Rngs(key)))[1]

    def apply(params, obs):
        return nnx.merge(graphdef, params)(obs)

    def value(params, obs):  # the critic alone
        return nnx.merge(graphdef, params).critic(obs)[..., 0]

    return init, apply, value


def log_prob(logits, action):
    return jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], axis=-1)[..., 0]


def entropy(logits):
    logp = jax.nn.log_softmax(logits)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
