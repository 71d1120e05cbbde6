"""CartPole in pure JAX: `reset(key)`, `step(key, state, action)`, jittable and vmappable.

Two physics. `CARTPOLE` is gymnasium's CartPole-v1 (Euler integration, the classic Barto, Sutton &
Anderson 1983 equations; reward 1 on every step including the terminal one; terminated when |x| >
2.4 or |theta| > 12 degrees; truncated, not terminated, at 500 steps, so a learner can bootstrap
there). tests/rl/test_env.py checks it against gymnasium transition by transition.

`SEED_CARTPOLE` is seed 002's `SimulatedCartPole` (ch12 ppo_cartpole.py), kept for
`--seed-faithful`: not CartPole physics (theta_dot is pushed by 0.05·F·sign(theta) whatever the cart
does, noise N(0, 0.01) on both velocities), reward 0 on the final step, done after 201 steps,
truncation treated as termination. Its pole cannot be balanced for long, so returns stay near 10-20
(seed defect 10's run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class Physics:
    name: str
    seed_faithful: bool
    max_steps: int  # truncation (real) or the seed's `steps > 200` termination
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    half_length: float = 0.5  # gymnasium's `length` is half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02
    theta_limit: float = 12 * 2 * math.pi / 360  # 0.2095 rad
    x_limit: float = 2.4

    solved_return: float = 475.0  # CartPole-v1's reward threshold (195 for the 200-step seed)
    obs_dim: int = 4
    n_actions: int = 2


CARTPOLE = Physics("cartpole", seed_faithful=False, max_steps=500)
SEED_CARTPOLE = Physics(
    "seed-cartpole", seed_faithful=True, max_steps=200, theta_limit=0.21, solved_return=195.0
)
ENVS = {p.name: p for p in (CARTPOLE, SEED_CARTPOLE)}


class EnvState(NamedTuple):
    x_4: jax.Array  # (x, x_dot, theta, theta_dot), float32
    t: jax.Array  # steps taken in this episode
    ep_return: jax.Array  # reward so far in this episode


class Step(NamedTuple):
    obs: jax.Array  # the next observation; after a done, the first of the new episode
    state: EnvState
    reward: jax.Array
    terminated: jax.Array  # a true end: no value beyond it
    truncated: jax.Array  # cut by the time limit: the next state still has a value
    final_obs: jax.Array  # the observation the step really reached (before any auto-reset)
    ep_return: jax.Array  # the finished episode's return where done, else 0


def reset(key: jax.Array, env: Physics = CARTPOLE) -> tuple[jax.Array, EnvState]:
    x_4 = jax.random.uniform(key, (4,), jnp.float32, -0.05, 0.05)
    return x_4, _fresh(x_4)


def dynamics(x_4: jax.Array, action: jax.Array, env: Physics = CARTPOLE) -> jax.Array:
    """One Euler step of the real CartPole (gymnasium's `kinematics_integrator='euler'`)."""
    x, x_dot, theta, theta_dot = x_4[0], x_4[1], x_4[2], x_4[3]
    force = jnp.where(action == 1, env.force_mag, -env.force_mag)
    total_mass = env.masscart + env.masspole
    polemass_length = env.masspole * env.half_length
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
    theta_acc = (env.gravity * sin - cos * temp) / (
        env.half_length * (4.0 / 3.0 - env.masspole * cos**2 / total_mass)
    )
    x_acc = temp - polemass_length * theta_acc * cos / total_mass
    return jnp.stack(
        [
            x + env.tau * x_dot,
            x_dot + env.tau * x_acc,
            theta + env.tau * theta_dot,
            theta_dot + env.tau * theta_acc,
        ]
    )


def _seed_dynamics(x_4, action, noise_2, env: Physics) -> jax.Array:
    """The seed's update order: velocity first, then position from the new velocity."""
    force = jnp.where(action == 1, env.force_mag, -env.force_mag)
    x_dot = x_4[1] + 0.02 * force + noise_2[0]
    x = x_4[0] + 0.02 * x_dot
    theta_dot = x_4[3] + 0.05 * force * jnp.where(x_4[2] > 0, 1.0, -1.0) + noise_2[1]
    theta = x_4[2] + 0.02 * theta_dot
    return jnp.stack([x, x_dot, theta, theta_dot])


def transition(state: EnvState, action, fresh_4, noise_2, env: Physics = CARTPOLE) -> Step:
    """One step from pre-drawn randomness: `fresh_4` is the state an auto-reset starts from,
    `noise_2` the seed physics' velocity noise (unused by the real CartPole)."""
    if env.seed_faithful:
        x_4 = _seed_dynamics(state.x_4, action, noise_2, env)
    else:
        x_4 = dynamics(state.x_4, action, env)
    t = state.t + 1
    out = (jnp.abs(x_4[0]) > env.x_limit) | (jnp.abs(x_4[2]) > env.theta_limit)
    if env.seed_faithful:
        terminated, truncated = out | (t > env.max_steps), jnp.bool_(False)
        reward = jnp.where(terminated, 0.0, 1.0)
    else:
        terminated, truncated = out, (t >= env.max_steps) & ~out
        reward = jnp.float32(1.0)
    done = terminated | truncated
    ep_return = state.ep_return + reward
    nxt = EnvState(x_4, t, ep_return)
    nxt = jax.tree.map(lambda a, b: jnp.where(done, a, b), _fresh(fresh_4), nxt)
    return Step(nxt.x_4, nxt, reward, terminated, truncated, x_4, jnp.where(done, ep_return, 0.0))


def _fresh(x_4):
    return EnvState(x_4, jnp.zeros(x_4.shape[:-1], jnp.int32), jnp.zeros(x_4.shape[:-1]))


def _draws(key, shape: tuple[int, ...]):
    k_reset, k_noise = jax.random.split(key)
    fresh = jax.random.uniform(k_reset, (*shape, 4), jnp.float32, -0.05, 0.05)
    noise = 0.01 * jax.random.normal(k_noise, (*shape, 2), jnp.float32)
    return fresh, noise


def step(key: jax.Array, state: EnvState, action: jax.Array, env: Physics = CARTPOLE) -> Step:
    """Step one environment, resetting it (from `key`) when the episode ends."""
    return transition(state, action, *_draws(key, ()), env)


def step_batch(key, state: EnvState, action, env: Physics = CARTPOLE) -> Step:
    """Step E environments ([E, ...] states and actions) with one key: the reset states and noise
    of all of them drawn in one call each (cheaper than E keys, one per environment)."""
    fresh, noise = _draws(key, action.shape)
    return jax.vmap(lambda s, a, f, n: transition(s, a, f, n, env))(state, action, fresh, noise)


def reset_batch(key, n: int, env: Physics = CARTPOLE) -> tuple[jax.Array, EnvState]:
    x = jax.random.uniform(key, (n, 4), jnp.float32, -0.05, 0.05)
    return x, _fresh(x)


def check_env(name: str) -> Physics:
    if name not in ENVS:
        raise ValueError(f"--env {name!r}: choose from {', '.join(ENVS)}")
    return ENVS[name]
