"""GAE's reverse scan against a float64 loop, the seed's golden table and worked example, and its
limits: lambda 0 is TD(0), lambda 1 is the Monte-Carlo return minus V."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.calc import gae as calc_gae
from jaxscale.rl.gae import discounted_returns, gae
from jaxscale.tolerances import RL_GAE_ATOL, SEED_TABLE_ATOL

# seed 002's gae_visualizer.py run (ch12): advantages per lambda, t = 0..9
GOLDEN = {
    0.0: [-0.0070, 0.0930, 0.0940, -0.0050, 0.3960, 0.0960, 0.1970, -0.0020, -0.0010, 0.9000],
    0.5: [0.0926, 0.2012, 0.2185, 0.2515, 0.5182, 0.2469, 0.3049, 0.2180, 0.4445, 0.9000],
    0.9: [0.8662, 0.9801, 0.9956, 1.0119, 1.1413, 0.8365, 0.8310, 0.7116, 0.8009, 0.9000],
    0.95: [1.1925, 1.2754, 1.2572, 1.2368, 1.3204, 0.9828, 0.9430, 0.7931, 0.8455, 0.9000],
    1.0: [1.6489, 1.6726, 1.5956, 1.5167, 1.5371, 1.1526, 1.0673, 0.8791, 0.8900, 0.9000],
}


def loop_reference(r, v, nv, term, done, gamma, lam, mask):
    """A plain float64 loop over time, per column."""
    T = r.shape[0]
    adv = np.zeros_like(r, np.float64)
    nxt = np.zeros(r.shape[1:])
    for t in reversed(range(T)):
        delta = r[t] + gamma * (1 - term[t]) * nv[t] - v[t]
        nxt = mask[t] * (delta + gamma * lam * (1 - done[t]) * nxt)
        adv[t] = nxt
    return adv


def _seed_arrays():
    r = jnp.asarray(calc_gae.SEED_REWARDS)
    v = jnp.asarray(calc_gae.SEED_VALUES)
    nv = jnp.concatenate([v[1:], jnp.zeros(1)])
    term = jnp.zeros(10).at[-1].set(1.0)
    return r, v, nv, term


@pytest.mark.parametrize("lam", sorted(GOLDEN))
def test_seed_golden_table(lam):
    r, v, nv, term = _seed_arrays()
    adv, ret = gae(r, v, nv, term, term, 0.99, lam)
    np.testing.assert_allclose(np.asarray(adv), GOLDEN[lam], atol=SEED_TABLE_ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(ret), np.asarray(adv + v), atol=1e-7)
    # the pure-Python calculator behind `calc gae` gives the same table
    deltas = calc_gae.td_errors(calc_gae.SEED_REWARDS, calc_gae.SEED_VALUES, 0.99)
    np.testing.assert_allclose(
        calc_gae.advantages(deltas, 0.99, lam), GOLDEN[lam], atol=SEED_TABLE_ATOL, rtol=0
    )


def test_worked_example():
    r, v = jnp.asarray([0.1, 0.2, 1.0]), jnp.asarray([0.5, 0.4, 0.2])
    nv, term = jnp.asarray([0.4, 0.2, 0.0]), jnp.asarray([0.0, 0.0, 1.0])
    adv, _ = gae(r, v, nv, term, term, 0.99, 0.95)
    np.testing.assert_allclose(np.asarray(adv), [0.7018, 0.7504, 0.8000], atol=SEED_TABLE_ATOL)


def test_lambda_limits():
    r, v, nv, term = _seed_arrays()
    td, _ = gae(r, v, nv, term, term, 0.99, 0.0)
    np.testing.assert_allclose(np.asarray(td), np.asarray(r + 0.99 * nv - v), atol=RL_GAE_ATOL)
    mc, _ = gae(r, v, nv, term, term, 0.99, 1.0)
    g = discounted_returns(r, term, 0.99)
    np.testing.assert_allclose(np.asarray(mc), np.asarray(g - v), atol=RL_GAE_ATOL)
    np.testing.assert_allclose(
        np.asarray(mc),
        calc_gae.mc_advantages(calc_gae.SEED_REWARDS, calc_gae.SEED_VALUES, 0.99),
        atol=RL_GAE_ATOL,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_inputs_with_dones_truncations_and_masks(seed):
    rng = np.random.default_rng(seed)
    T, B = 37, 6
    r = rng.normal(size=(T, B)).astype(np.float32)
    v = rng.normal(size=(T, B)).astype(np.float32)
    nv = rng.normal(size=(T, B)).astype(np.float32)
    term = rng.random((T, B)) < 0.08
    trunc = (rng.random((T, B)) < 0.05) & ~term
    done = term | trunc
    lengths = rng.integers(T // 2, T + 1, B)  # padded completions: mask 1 up to each length
    mask = (np.arange(T)[:, None] < lengths[None, :]).astype(np.float32)
    gamma, lam = 0.97, 0.9
    adv, ret = gae(*map(jnp.asarray, (r, v, nv, term, done)), gamma, lam, jnp.asarray(mask))
    want = loop_reference(r, v, nv, term.astype(float), done.astype(float), gamma, lam, mask)
    np.testing.assert_allclose(np.asarray(adv), want, atol=RL_GAE_ATOL, rtol=0)
    assert np.all(np.asarray(adv)[mask == 0] == 0) and np.all(np.asarray(ret)[mask == 0] == 0)


def test_truncation_bootstraps_termination_does_not():
    r = jnp.ones(2)
    v = jnp.zeros(2)
    nv = jnp.asarray([0.0, 10.0])
    done = jnp.asarray([0.0, 1.0])
    trunc_adv, _ = gae(r, v, nv, jnp.zeros(2), done, 0.9, 1.0)
    term_adv, _ = gae(r, v, nv, done, done, 0.9, 1.0)
    assert float(trunc_adv[1]) == pytest.approx(1.0 + 0.9 * 10.0)
    assert float(term_adv[1]) == pytest.approx(1.0)
