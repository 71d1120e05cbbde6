"""Does a baseline reduce the policy gradient's variance? (seed 002 ch12 Try-It 2, "Add a Baseline")

The single-episode REINFORCE estimate g = sum_t grad log pi(a_t|s_t) (G_t - b(s_t)) is unbiased for
any b that does not depend on a_t; with b = V(s) its variance should drop. We train
REINFORCE-with-baseline briefly (so the policy is no longer uniform and V has learned something),
sample full episodes with that policy, form g per episode with b = 0 and with b = V, and compare
the total variance (trace of the covariance over episodes) of the actor's gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.rl import env as envs
from jaxscale.rl import loop, policy
from jaxscale.rl.config import RLConfig


def episodes(apply, params, key, env: envs.Physics, n: int):
    """n full episodes: obs [T, n, O], action [T, n], reward [T, n], alive [T, n]."""
    k_reset, k_run = jax.random.split(key)
    obs, state = envs.reset_batch(k_reset, n, env)

    def tick(carry, _):
        obs, state, alive, key = carry
        key, k_act, k_step = jax.random.split(key, 3)
        action = jax.random.categorical(k_act, apply(params, obs)[0])
        st = envs.step_batch(k_step, state, action, env)
        row = (obs, action, jnp.where(alive, st.reward, 0.0), alive)
        return (st.obs, st.state, alive & ~(st.terminated | st.truncated), key), row

    init = (obs, state, jnp.ones(n, bool), k_run)
    _, rows = jax.lax.scan(tick, init, None, env.max_steps + 1)
    return rows


def measure(n_episodes: int = 256, updates: int = 100, seed: int = 0, gamma: float = 0.99) -> dict:
    cfg = RLConfig(
        algo="reinforce-baseline",
        total_steps=updates * 16 * 64,
        eval_every=updates,
        eval_episodes=0,
        gamma=gamma,
    )
    env = envs.check_env(cfg.env)
    key = jax.random.key(seed)
    params = jax.tree.map(lambda x: x[0], loop.run(cfg, key[None])[0])
    _, apply, _ = policy.functional(env.obs_dim, env.n_actions, cfg.hidden)

    @jax.jit
    def estimates(params, key):
        obs, action, reward, alive = episodes(apply, params, key, env, n_episodes)

        def returns(r_t):  # discounted reward-to-go per episode
            def back(g, r):
                g = r + gamma * g
                return g, g

            return jax.lax.scan(back, jnp.zeros_like(r_t[0]), r_t, reverse=True)[1]

        g_t = returns(reward)
        v_t = apply(params, obs)[1]

        def one(obs_e, act_e, g_e, v_e, alive_e, use_baseline):
            def surrogate(actor):
                p = dict(params) | {"actor": actor}
                logp = policy.log_prob(apply(p, obs_e)[0], act_e)
                weight = jnp.where(use_baseline, g_e - v_e, g_e)
                return jnp.sum(alive_e * logp * jax.lax.stop_gradient(weight))

            grads = jax.grad(surrogate)(params["actor"])
            return jnp.concatenate([x.ravel() for x in jax.tree.leaves(grads)])

        by_episode = jax.vmap(one, in_axes=(1, 1, 1, 1, 1, None))
        g0 = by_episode(obs, action, g_t, v_t, alive, False)
        gb = by_episode(obs, action, g_t, v_t, alive, True)
        return g0, gb, alive.sum(0)

    g0, gb, lengths = (
        np.asarray(x, np.float64) for x in estimates(params, jax.random.key(seed + 1))
    )
    var0, varb = float(g0.var(0).sum()), float(gb.var(0).sum())
    m0, mb = g0.mean(0), gb.mean(0)
    return {
        "episodes": n_episodes,
        "updates": updates,
        "mean_episode_length": float(lengths.mean()),
        "variance_no_baseline": var0,
        "variance_baseline": varb,
        "ratio": varb / var0,
        "mean_shift": float(np.linalg.norm(mb - m0) / np.linalg.norm(m0)),
    }
