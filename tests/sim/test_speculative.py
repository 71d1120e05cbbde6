"""Speculative decoding: closed forms, seed 000's sweeps, seed 002's demo port, statistics."""

import math

import pytest

from jaxscale.sim import speculative as sp
from jaxscale.sim import speculative_demo as demo

TOL = 1e-9  # closed forms
N_SIGMA = 4.0  # Monte-Carlo checks: |mean - expectation| <= 4 standard errors
DEMO_REL_TOL = 0.02  # long demo runs (>= 4 standard errors, see the test)

# Printed by seed 000's K-sweep cell (Exercise 2, "Sweep draft length K"), executed verbatim:
# K, Acc/Round, Tok/Round, Rounds, Time (ms), Speedup.
SEED_000_K_SWEEP = [
    (1, 0.71, 1.71, 58.8, 3529, 1.42),
    (2, 1.18, 2.18, 46.3, 3242, 1.54),
    (3, 1.57, 2.57, 39.6, 3168, 1.58),
    (4, 1.80, 2.80, 36.5, 3280, 1.52),
    (5, 1.96, 2.96, 34.7, 3468, 1.44),
    (6, 2.13, 3.13, 32.9, 3618, 1.38),
    (7, 2.17, 3.17, 32.7, 3920, 1.28),
    (8, 2.25, 3.25, 31.8, 4131, 1.21),
]
# Seed 000's match-probability cell (Exercise 2), executed verbatim: speedups for K = 1..8.
SEED_000_MP_SWEEP = {
    0.5: [1.2496, 1.2354, 1.1699, 1.0615, 0.9699, 0.8938, 0.8301, 0.7479],
    0.6: [1.3289, 1.3880, 1.3340, 1.2764, 1.1678, 1.0977, 0.9982, 0.9340],
    0.7: [1.4074, 1.5594, 1.5641, 1.5298, 1.4447, 1.3689, 1.2805, 1.2222],
    0.8: [1.4928, 1.7337, 1.8111, 1.8384, 1.8123, 1.7663, 1.6941, 1.6249],
    0.9: [1.5723, 1.9240, 2.1251, 2.2316, 2.2810, 2.3274, 2.2976, 2.2678],
}


def test_closed_form_goldens():
    assert sp.expected_tokens_per_pass(0.8, 5) == pytest.approx(3.68928, abs=TOL)  # defect 9
    assert sp.seed_expected_tokens_per_pass(0.8, 5) == pytest.approx(3.3616, abs=TOL)  # "3.36"
    assert sp.expected_tokens_per_pass(0.75, 4) == pytest.approx(3.05078125, abs=TOL)  # Ex1
    assert round(sp.speedup_with_draft_cost(0.75, 4, 0.05), 2) == 2.54  # Ex1: 3.0508 / 1.2


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.75, 0.99, 1.0])
@pytest.mark.parametrize("k", [0, 1, 4, 9])
def test_closed_form_is_the_geometric_sum(gamma, k):
    assert sp.expected_tokens_per_pass(gamma, k) == pytest.approx(
        sum(gamma**i for i in range(k + 1)), abs=TOL
    )
    assert sp.seed_expected_tokens_per_pass(gamma, k) == pytest.approx(
        sum(gamma**i for i in range(k)), abs=TOL
    )


@pytest.mark.parametrize("k, gamma", [(1, 0.7), (5, 0.7), (8, 0.9), (4, 0.5)])
def test_monte_carlo_mean_agrees_with_closed_form(k, gamma):
    samples = sp.sample_tokens_per_round(k, gamma, 20_000, seed=k)
    se = samples.std(ddof=1) / math.sqrt(len(samples))
    assert abs(samples.mean() - sp.expected_tokens_per_pass(gamma, k)) <= N_SIGMA * se
    # every round yields between 1 and k+1 tokens; all k accepted with probability gamma^k
    assert samples.min() >= 1 and samples.max() <= k + 1
    p_all = (samples == k + 1).mean()
    assert abs(p_all - gamma**k) <= N_SIGMA * math.sqrt(gamma**k * (1 - gamma**k) / len(samples))


def test_k_sweep_reproduces_seed_000():
    points = sp.k_sweep(sp.SweepConfig())
    for p, (k, acc, tok, rounds, time_ms, speedup) in zip(points, SEED_000_K_SWEEP, strict=True):
        assert p.k == k
        assert round(p.avg_accepted_per_round, 2) == acc
        assert round(p.avg_tokens_per_round, 2) == tok
        assert round(p.avg_rounds, 1) == rounds
        assert round(p.avg_time_ms) == time_ms
        assert round(p.speedup, 2) == speedup
    assert sp.best(points).k == 3  # "Optimal draft length: K=3 giving 1.58x speedup."


def test_match_prob_sweep_reproduces_seed_000():
    sweep = sp.match_prob_sweep(sp.SweepConfig())
    for mp, expected in SEED_000_MP_SWEEP.items():
        assert [round(p.speedup, 4) for p in sweep[mp]] == expected


def test_perfect_draft_counts_the_target_token():
    # match_prob 1: every round yields K+1 tokens, so rounds = ceil(N / (K+1)) exactly.
    cfg = sp.SweepConfig(match_prob=1.0, num_trials=3)
    for p in sp.k_sweep(cfg):
        rounds = math.ceil(100 / (p.k + 1))
        assert p.avg_rounds == rounds
        assert p.speedup == pytest.approx(100 * 50 / (rounds * (p.k * 10 + 50)), abs=TOL)
    assert sp.perfect_draft_speedup(4, 10, 50) == pytest.approx(5 * 50 / 90, abs=TOL)
    assert sp.perfect_draft_speedup(4, 10, 50, seed_faithful=True) == pytest.approx(
        4 * 50 / 90, abs=TOL
    )  # seed 000 Exercise 2's closing text


def test_speculative_demo_seed_42_golden():
    # seed 002 ch11 speculative_demo.py, seed 42: 50 / 13 / 13 / 45 / 5 / 3.85 / 90.00% / 3.50x
    res = demo.run_demo(demo.DemoConfig(), seed_faithful=True)
    assert (len(res.tokens), res.target_calls, res.draft_calls) == (50, 13, 13)
    assert (res.accepted, res.rejected, res.bonus) == (45, 5, 0)
    assert f"{res.tokens_per_target_call:.2f}" == "3.85"
    assert f"{res.acceptance_rate:.2%}" == "90.00%"
    assert f"{res.speedup:.2f}" == "3.50"
    # the seed's "Generated text preview" line
    assert res.tokens[:6] == ("her", "first", "might", "has", "she", "the")
    assert res.tokens[16] == "[corrected_1]"


@pytest.mark.parametrize(
    "cfg, expected",
    [
        # Running seed 002 ch11 speculative_demo.py with these flags prints:
        # tokens, target calls, accepted, rejected, tokens/call, acceptance %, speedup
        (demo.DemoConfig(acceptance_rate=0.8), (50, 13, 45, 5, "3.85", "90.00", "3.50")),
        (demo.DemoConfig(draft_length=4), (50, 16, 42, 8, "3.12", "84.00", "2.84")),
        (
            demo.DemoConfig(draft_length=3, target_length=30),
            (30, 12, 26, 4, "2.50", "86.67", "2.27"),
        ),
        (demo.DemoConfig(seed=7), (50, 14, 42, 8, "3.57", "84.00", "3.25")),
    ],
)
def test_speculative_demo_other_seed_runs(cfg, expected):
    res = demo.run_demo(cfg, seed_faithful=True)
    got = (
        len(res.tokens),
        res.target_calls,
        res.accepted,
        res.rejected,
        f"{res.tokens_per_target_call:.2f}",
        f"{100 * res.acceptance_rate:.2f}",
        f"{res.speedup:.2f}",
    )
    assert got == expected


def test_corrected_demo_accounting():
    res = demo.run_demo(demo.DemoConfig(), seed_faithful=False)
    assert len(res.tokens) == 50
    assert res.accepted + res.rejected + res.bonus == len(res.tokens)
    assert res.speculative_cost == pytest.approx(res.target_calls + 0.1 * res.drafted_tokens)
    assert res.drafted_tokens > res.draft_calls  # per-token cost is larger than per-call cost


@pytest.mark.parametrize("a", [0.3, 0.75])
def test_demo_long_run_statistics(a):
    # Per examined token the demo accepts with gamma = 0.45 + a * 0.5417 (module docstring).
    # Long runs: >= 23k rounds; tokens per round lie in [1, k+1], so their std is <= k/2 = 2.5
    # and the standard error of tokens/call is <= 2.5/sqrt(23e3) = 0.017, < 0.5% of the mean:
    # DEMO_REL_TOL = 2% is >= 4 standard errors, while the two formulas differ by gamma^k, which
    # is 3.7% (a = 0.3) and 12% (a = 0.75) of the mean.
    # Acceptance probability min(1, p_t/p_d) = min(1, r), averaged over r ~ U(0.9, 1.5) when the
    # target agrees and r ~ U(0.1, 0.8) otherwise, by the midpoint rule.
    n = 60_000
    agree = sum(min(1.0, 0.9 + 0.6 * (i + 0.5) / n) for i in range(n)) / n
    disagree = sum(0.1 + 0.7 * (i + 0.5) / n for i in range(n)) / n
    gamma = a * agree + (1 - a) * disagree
    assert demo.per_token_acceptance(a) == pytest.approx(gamma, abs=1e-6)
    k = 5
    for faithful, expected in [
        (True, sp.seed_expected_tokens_per_pass(gamma, k)),  # no bonus token
        (False, sp.expected_tokens_per_pass(gamma, k)),  # with the bonus token
    ]:
        cfg = demo.DemoConfig(draft_length=k, target_length=100_000, acceptance_rate=a, seed=11)
        res = demo.run_demo(cfg, seed_faithful=faithful)
        assert res.tokens_per_target_call == pytest.approx(expected, rel=DEMO_REL_TOL)
        examined = res.accepted + res.rejected
        se = math.sqrt(gamma * (1 - gamma) / examined)
        assert abs(res.acceptance_rate - gamma) <= N_SIGMA * se


@pytest.mark.parametrize(
    "call",
    [
        lambda: sp.expected_tokens_per_pass(1.2, 3),
        lambda: sp.expected_tokens_per_pass(0.5, -1),
        lambda: sp.speedup_with_draft_cost(0.5, 3, -0.1),
        lambda: sp.expected_speedup_timed(0.5, 3, 10.0, 0.0),
        lambda: sp.k_sweep(sp.SweepConfig(num_trials=0)),
        lambda: sp.k_sweep(sp.SweepConfig(), ks=[0]),
        lambda: demo.run_demo(demo.DemoConfig(draft_length=0)),
        lambda: demo.run_demo(demo.DemoConfig(acceptance_rate=-0.1)),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
