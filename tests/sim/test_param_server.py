"""Parameter server with stale gradients (seed 004 §9) on least squares.

The stated case: the default problem (512 x 16, seed 0, lambda_max(H) = 1, lambda_min = 0.505),
full-batch gradients, equal compute times, lr = 0.9. Sync converges; async with W = 2 workers
(staleness 1, stable below lr 1.0) converges more slowly; async with W = 4 (staleness 3, stable
below lr 0.445) diverges.
"""

from dataclasses import replace

import numpy as np
import pytest

from jaxscale.sim import param_server as ps

CONVERGED = 1e-12  # gap / initial gap counted as converged
TOL = 1e-12

CFG = ps.ParamServerConfig()


@pytest.fixture(scope="module")
def problem():
    return ps.make_problem(CFG)


def test_problem_is_normalised(problem):
    eig = problem.hessian_eigenvalues()
    assert eig.max() == pytest.approx(1.0, abs=TOL)
    assert 0.4 < eig.min() < 0.6
    assert problem.f_star == pytest.approx(0.0, abs=TOL)  # noise-free: b = A x_true
    assert np.linalg.norm(problem.grad(problem.x_ls)) < 1e-12


def test_sync_converges(problem):
    run = ps.run_sync(CFG, problem)
    assert not run.diverged and len(run.times) == CFG.updates
    assert run.final_gap <= CONVERGED * run.gaps[0]
    assert run.gradients == CFG.updates * CFG.workers


def test_stale_async_converges_slower_and_diverges_for_large_staleness(problem):
    sync = ps.run_sync(CFG, problem)
    two = ps.run_async(replace(CFG, workers=2), problem)  # staleness 1, lr 0.9 < 1.0
    four = ps.run_async(CFG, problem)  # staleness 3, lr 0.9 > 0.445
    assert not two.diverged
    assert two.final_gap <= 1e-6 * two.gaps[0]  # converges ...
    tol = 1e-6 * sync.gaps[0]
    assert two.updates_to(tol) > 2 * sync.updates_to(
        tol
    )  # ... but needs more than twice the updates
    assert four.diverged
    assert four.final_gap > 1e6 * four.gaps[0]


def test_round_robin_staleness_is_workers_minus_one(problem):
    for w in (1, 2, 4, 7):
        run = ps.run_async(replace(CFG, workers=w, lr=0.1), problem)
        # the first round's workers all pulled x_0; after that each push is w-1 updates old
        assert run.staleness == tuple(min(i, w - 1) for i in range(CFG.updates))
        assert run.times[w] == pytest.approx(2.0)  # w pushes per unit of time


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_async_equals_delayed_gradient_descent(problem, workers):
    # Full-batch gradients and equal compute times make the event simulation exactly delayed GD.
    cfg = replace(CFG, workers=workers, lr=0.3, updates=120)
    a = ps.run_async(cfg, problem)
    d = ps.run_delayed(problem, cfg.lr, workers - 1, cfg.updates)
    np.testing.assert_allclose(a.gaps, d.gaps, rtol=1e-9, atol=1e-300)


def test_sync_full_batch_equals_plain_gradient_descent(problem):
    s = ps.run_sync(replace(CFG, lr=0.5), problem)
    d = ps.run_delayed(problem, 0.5, 0, CFG.updates)
    np.testing.assert_allclose(s.gaps, d.gaps, rtol=1e-9, atol=1e-300)


def _companion_radius(a: float, tau: int) -> float:
    """Spectral radius of e(t+1) = e(t) - a e(t-tau), from its companion matrix."""
    n = tau + 1
    m = np.zeros((n, n))
    m[0, 0] = 1.0
    m[0, -1] -= a
    m[1:, :-1] += np.eye(n - 1)
    return float(np.max(np.abs(np.linalg.eigvals(m))))


@pytest.mark.parametrize("tau", range(7))
def test_critical_lr_is_the_stability_edge(tau):
    crit = ps.critical_lr(tau)
    assert _companion_radius(0.99 * crit, tau) < 1.0 < _companion_radius(1.01 * crit, tau)
    for a in (0.1, 0.5, 0.9, 1.3):
        assert ps.delayed_rate(a, tau, [1.0]) == pytest.approx(_companion_radius(a, tau), abs=1e-9)


def test_critical_lr_values():
    assert [round(ps.critical_lr(t), 3) for t in (0, 1, 3)] == [2.0, 1.0, 0.445]


def test_measured_rate_matches_prediction(problem):
    eig = problem.hessian_eigenvalues()
    for tau, lr in [(0, 0.9), (1, 0.9), (3, 0.3)]:
        run = ps.run_delayed(problem, lr, tau, 300)
        gaps = np.array(run.gaps)
        # past the transient, and above float round-off
        gaps = gaps[(gaps < 1e-4 * gaps[0]) & (gaps > 1e-24 * gaps[0])]
        assert len(gaps) > 20
        slope = np.polyfit(np.arange(len(gaps)), np.log(gaps), 1)[0]
        # the gap is quadratic in the error, so it shrinks by rate^2 per update
        assert slope == pytest.approx(2 * np.log(ps.delayed_rate(lr, tau, eig)), rel=0.03)


def test_stochastic_async_with_jitter(problem):
    cfg = replace(CFG, lr=0.3, batch_size=64, jitter=0.5)
    a = ps.run_async(cfg, problem)
    s = ps.run_sync(cfg, problem)
    assert not a.diverged and a.final_gap <= 1e-8 * a.gaps[0]
    assert abs(np.mean(a.staleness) - (cfg.workers - 1)) < 0.15
    assert max(a.staleness) > cfg.workers - 1  # jitter makes some pushes staler
    # a sync round waits for the slowest of W workers: E[max of W U(1-j, 1+j)] = 1 + j(W-1)/(W+1)
    expected_round = 1 + cfg.jitter * (cfg.workers - 1) / (cfg.workers + 1)
    assert s.times[-1] / cfg.updates == pytest.approx(expected_round, rel=0.05)
    assert a.times[-1] < s.times[-1] / 2  # no waiting: W pushes per unit of time


def test_same_seed_same_run(problem):
    cfg = replace(CFG, lr=0.3, batch_size=32, jitter=0.3)
    assert ps.run_async(cfg, problem).gaps == ps.run_async(cfg, problem).gaps
    other = ps.run_async(replace(cfg, seed=1), ps.make_problem(replace(cfg, seed=1)))
    assert other.gaps != ps.run_async(cfg, problem).gaps


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(workers=0),
        dict(lr=0.0),
        dict(samples=8, dim=16),
        dict(batch_size=-1),
        dict(batch_size=600),
        dict(noise=-1.0),
        dict(jitter=1.0),
        dict(updates=0),
    ],
)
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        ps.make_problem(replace(CFG, **kwargs))


def test_bad_staleness_raises(problem):
    with pytest.raises(ValueError):
        ps.run_delayed(problem, 0.5, -1, 10)
    with pytest.raises(ValueError):
        ps.critical_lr(-2)
