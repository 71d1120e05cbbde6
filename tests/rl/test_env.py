"""CartPole in JAX against gymnasium's CartPole-v1, transition by transition, and the seed's
SimulatedCartPole's rules."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.rl import env as envs
from jaxscale.tolerances import RL_ENV_ATOL

N = 4000


@pytest.fixture(scope="module")
def gym_env():
    e = gymnasium.make("CartPole-v1")
    e.reset(seed=0)
    yield e
    e.close()


def _random_states(n, rng):
    # inside and beyond the termination bounds, velocities of the size episodes reach
    scale = np.array([3.0, 3.0, 0.3, 3.5], np.float32)
    return (rng.uniform(-1, 1, (n, 4)) * scale).astype(np.float32)


def _near_bound(x, env=envs.CARTPOLE):
    # a flag decided by float32 rounding (within 1e-5 of a bound) is not a physics difference
    return (
        np.abs(np.abs(x[0]) - env.x_limit) < 1e-5 or np.abs(np.abs(x[2]) - env.theta_limit) < 1e-5
    )


def test_transitions_match_gymnasium(gym_env):
    rng = np.random.default_rng(0)
    states = _random_states(N, rng)
    actions = rng.integers(0, 2, N)
    step = jax.jit(
        jax.vmap(
            lambda x, a: envs.transition(
                envs.EnvState(x, jnp.int32(0), jnp.float32(0)), a, jnp.zeros(4), jnp.zeros(2)
            )
        )
    )
    ours = step(jnp.asarray(states), jnp.asarray(actions))
    checked = terminated = 0
    for i in range(N):
        gym_env.unwrapped.state = states[i].astype(np.float64)
        gym_env.unwrapped.steps_beyond_terminated = None
        obs, reward, term, trunc, _ = gym_env.step(int(actions[i]))
        np.testing.assert_allclose(np.asarray(ours.final_obs[i]), obs, atol=RL_ENV_ATOL, rtol=0)
        assert float(ours.reward[i]) == reward
        if not _near_bound(obs):
            assert bool(ours.terminated[i]) == term, (i, states[i], obs)
            checked += 1
            terminated += term
    assert checked > 0.99 * N and 0.2 * N < terminated < 0.8 * N  # both outcomes exercised


def test_truncation_at_500_steps_like_gymnasium(gym_env):
    gym_env.reset(seed=1)
    x = np.zeros(4, np.float32)
    gym_env.unwrapped.state = x.astype(np.float64)
    gym_env._elapsed_steps = 499  # the TimeLimit wrapper's counter (gymnasium.make wraps it)
    _, _, term, trunc, _ = gym_env.step(0)
    st = envs.step(
        jax.random.key(0),
        envs.EnvState(jnp.asarray(x), jnp.int32(499), jnp.float32(499)),
        jnp.int32(0),
    )
    assert (bool(st.terminated), bool(st.truncated)) == (term, trunc) == (False, True)
    assert float(st.ep_return) == 500.0 and int(st.state.t) == 0  # auto-reset after reporting


def test_auto_reset_and_episode_return():
    """An episode run with one action falls over; the step that ends it reports the return and
    hands back a fresh state, whose observation is a new start (|x| <= 0.05)."""
    obs, state = envs.reset(jax.random.key(3))
    step = jax.jit(envs.step)
    total = 0.0
    for t in range(200):
        st = step(jax.random.key(t), state, jnp.int32(1))
        total += float(st.reward)
        if bool(st.terminated):
            break
        state = st.state
    assert bool(st.terminated) and 5 < t < 100
    assert float(st.ep_return) == total == t + 1
    assert np.all(np.abs(np.asarray(st.obs)) <= 0.05) and int(st.state.t) == 0
    assert np.abs(np.asarray(st.final_obs)[2]) > envs.CARTPOLE.theta_limit


def test_seed_cartpole_rules():
    """Seed 002 ch12's SimulatedCartPole: reward 0 at the end, done once more than 200 steps passed
    (a termination, not a truncation)."""
    env = envs.SEED_CARTPOLE
    st = envs.step(
        jax.random.key(0),
        envs.EnvState(jnp.zeros(4), jnp.int32(200), jnp.float32(200)),
        jnp.int32(0),
        env,
    )
    assert bool(st.terminated) and not bool(st.truncated) and float(st.reward) == 0.0
    st = envs.step(
        jax.random.key(0),
        envs.EnvState(jnp.zeros(4), jnp.int32(5), jnp.float32(5)),
        jnp.int32(1),
        env,
    )
    assert not bool(st.terminated) and float(st.reward) == 1.0
    # the seed's physics: x_dot += 0.02 F + noise; theta_dot += 0.05 F sign(theta) + noise
    assert abs(float(st.final_obs[1]) - 0.2) < 0.05 and abs(float(st.final_obs[3]) + 0.5) < 0.05


def test_step_batch_is_vmappable_and_jittable():
    obs, state = envs.reset_batch(jax.random.key(0), 64)
    st = jax.jit(envs.step_batch)(jax.random.key(1), state, jnp.zeros(64, jnp.int32))
    assert st.obs.shape == (64, 4) and st.reward.shape == (64,)
