"""`jaxscale calc reward` and jaxscale/calc/reward.py: the seed's golden numbers (seed 002 ch. 13,
reward_calculator.py, as run), the one sign convention (net = RM - beta·sum KL), the k3 estimator
against its definition, and bad input refused with one error line (exit 2)."""

import json
import math
import subprocess
import sys

import pytest

from jaxscale.calc import reward
from jaxscale.cli import main

EXACT = 1e-12  # sums of a few decimals: float noise only
PRINTED = 5e-5  # the seed prints 4 decimals

# the seed's run at its defaults (beta 0.02, RM 0.5)
GOLDEN_KL = [-0.2, +0.2, -0.3, +0.1, -0.1, +0.1, +0.3, -0.3]
GOLDEN_REWARDS = [+0.0040, -0.0040, +0.0060, -0.0020, +0.0020, -0.0020, -0.0060, +0.5060]
GOLDEN_SWEEP_NET = [0.5000, 0.5010, 0.5020, 0.5050, 0.5100, 0.5500]
GOLDEN_SWEEP_PENALTY = [0.0, -0.001, -0.002, -0.005, -0.01, -0.05]
GOLDEN_SCENARIOS = {  # name: (sum KL, penalty, net)
    "Low divergence": (0.0, 0.0, 0.5000),
    "High divergence": (0.7, 0.0140, 0.4860),
    "More confident than reference": (2.3, 0.0460, 0.4540),
    "Less confident than reference": (-3.5, -0.0700, 0.5700),
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["calc", "reward", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv: str) -> dict:
    rc, out, _ = run(capsys, *argv, "--json")
    assert rc == 0
    return json.loads(out)


# --- the library ------------------------------------------------------------------------------


def test_seed_defaults_golden():
    out = reward.compute_rewards(reward.SEED_ACTOR_LPS, reward.SEED_REF_LPS, 0.5, 0.02)
    assert out.kl == pytest.approx(GOLDEN_KL, abs=EXACT)
    assert out.rewards == pytest.approx(GOLDEN_REWARDS, abs=EXACT)
    assert out.total_kl == pytest.approx(-0.2, abs=EXACT)
    assert out.penalty == pytest.approx(-0.004, abs=EXACT)  # beta·sum KL: negative, a bonus
    assert out.net == pytest.approx(0.504, abs=EXACT)
    assert out.net == pytest.approx(out.rm_score - out.penalty, abs=EXACT)  # the convention


def test_rm_spread_over_tokens_keeps_the_total():
    end = reward.compute_rewards(reward.SEED_ACTOR_LPS, reward.SEED_REF_LPS, 0.8, 0.1)
    spread = reward.compute_rewards(reward.SEED_ACTOR_LPS, reward.SEED_REF_LPS, 0.8, 0.1, False)
    assert spread.rm == [0.1] * 8 and end.rm == [0.0] * 7 + [0.8]
    assert spread.rewards[0] == pytest.approx(0.1 - 0.1 * -0.2, abs=EXACT)
    assert spread.net == pytest.approx(end.net, abs=EXACT) == pytest.approx(0.82, abs=EXACT)


def test_kl_coef_sweep_golden():
    rows = reward.kl_coef_sweep(0.5)
    assert [r["kl_coef"] for r in rows] == [0.0, 0.01, 0.02, 0.05, 0.1, 0.5]
    assert [r["net_reward"] for r in rows] == pytest.approx(GOLDEN_SWEEP_NET, abs=EXACT)
    assert [r["penalty"] for r in rows] == pytest.approx(GOLDEN_SWEEP_PENALTY, abs=EXACT)
    # the seed labels every row "Weak penalty" although each beta > 0 pays a bonus
    seed = reward.kl_coef_sweep(0.5, seed_faithful=True)
    assert {r["effect"] for r in seed} == {"Weak penalty"}
    assert [r["effect"] for r in rows] == ["No penalty"] + ["Bonus (KL estimate < 0)"] * 5


def test_effect_bands_match_the_seed_for_a_real_penalty():
    # the seed's thresholds on net = rm - penalty: > 0.8 rm, > 0, > -0.5
    for penalty, band in [
        (0.05, "Weak"),
        (0.3, "Moderate"),
        (0.8, "Strong"),
        (1.2, "Overwhelming"),
    ]:
        assert reward.effect(0.5, penalty) == reward.effect(0.5, penalty, seed_faithful=True)
        assert reward.effect(0.5, penalty) == f"{band} penalty"
    # for rm <= 0 the bands are taken on |rm| (the seed calls any penalty on rm -1 "Overwhelming")
    assert reward.effect(-1.0, 0.01) == "Weak penalty"
    assert reward.effect(-1.0, 0.01, seed_faithful=True) == "Overwhelming penalty"


def test_scenarios_golden():
    rows = {r["name"]: r for r in reward.scenarios(0.5, 0.02)}
    assert rows.keys() == GOLDEN_SCENARIOS.keys()
    for name, (total, penalty, net) in GOLDEN_SCENARIOS.items():
        got = rows[name]
        assert (got["total_kl"], got["penalty"], got["net_reward"]) == pytest.approx(
            (total, penalty, net), abs=EXACT
        ), name
    assert rows["High divergence"]["kl"] == pytest.approx([1.0, -1.2, 0.9], abs=EXACT)
    # k1 [0, -0.1, +0.1] cancels to float noise: exactly zero, no penalty and no "bonus"
    assert rows["Low divergence"]["total_kl"] == 0.0 == rows["Low divergence"]["penalty"]


def test_prose_example():
    nets = [r["net_reward"] for r in reward.prose_example()]
    assert nets == pytest.approx([0.85, 0.805, 0.625, 0.40], abs=EXACT)


# --- k3 ---------------------------------------------------------------------------------------

LOGPROB_PAIRS = [(-1.2, -1.0), (-0.8, -1.0), (-2.0, -0.5), (-0.01, -3.0), (-1.0, -1.0)]


@pytest.mark.parametrize("actor_lp, ref_lp", LOGPROB_PAIRS)
def test_k3_is_its_formula_and_non_negative(actor_lp, ref_lp):
    r = ref_lp - actor_lp
    expected = math.exp(r) - r - 1  # the definition, written independently of expm1
    assert reward.kl_k3(actor_lp, ref_lp) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert reward.kl_k3(actor_lp, ref_lp) >= 0
    assert (reward.kl_k3(actor_lp, ref_lp) == 0) == (actor_lp == ref_lp)


def test_k3_is_k1_squared_over_two_for_small_differences():
    for d in (1e-2, -1e-2, 1e-3, -3e-4):
        k1, k3 = reward.kl_k1(-1.0 + d, -1.0), reward.kl_k3(-1.0 + d, -1.0)
        assert k3 == pytest.approx(k1 * k1 / 2, rel=0.02)


def test_k3_and_k1_agree_in_expectation():
    # Both are unbiased for KL(p || q) when the token is sampled from p: summing p(x)·estimate
    # over a whole 3-token vocabulary gives the exact KL for either one.
    p, q = [0.7, 0.2, 0.1], [0.5, 0.3, 0.2]
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    lp, lq = [math.log(x) for x in p], [math.log(x) for x in q]
    for est in ("k1", "k3"):
        kl = reward.kl_per_token(lp, lq, est)
        assert sum(pi * k for pi, k in zip(p, kl, strict=True)) == pytest.approx(exact, rel=1e-12)


def test_k3_penalty_never_a_bonus():
    out = reward.compute_rewards(reward.SEED_ACTOR_LPS, reward.SEED_REF_LPS, 0.5, 0.02, True, "k3")
    assert all(k > 0 for k in out.kl) and out.penalty > 0 and out.net < 0.5
    rows = reward.scenarios(0.5, 0.02, "k3")
    assert all(r["penalty"] >= 0 for r in rows)
    assert rows[0]["total_kl"] > 0  # the seed's "Low divergence" k1 sum cancels to 0


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kl_coef": -0.1}, "beta must be a finite number >= 0"),
        ({"kl_coef": math.nan}, "beta must be a finite number >= 0"),
        ({"rm_score": math.inf}, "--rm-score inf is not a finite number"),
        ({"ref_lps": (-1.0, -1.0)}, "3 actor log-probs but 2 reference log-probs"),
        ({"actor_lps": (), "ref_lps": ()}, "no tokens"),
        ({"actor_lps": (0.5, -1.0, -1.0)}, "log-prob 0.5 is not a finite number <= 0"),
        ({"estimator": "k2"}, "choose one of k1, k3"),
        ({"kl_coef": 1e308, "actor_lps": (-3.0, -3.0, -3.0)}, "overflow"),
    ],
)
def test_library_refuses_bad_input(kwargs, message):
    args = {
        "actor_lps": (-1.0, -1.1, -0.9),
        "ref_lps": (-1.0, -1.0, -1.0),
        "rm_score": 0.5,
        "kl_coef": 0.02,
    } | kwargs
    with pytest.raises(ValueError, match=message):
        reward.compute_rewards(**args)


# --- the command line -------------------------------------------------------------------------


def test_cli_default_table(capsys):
    rc, out, _ = run(capsys)
    assert rc == 0 and "mode: corrected" in out
    assert "net = RM - beta·sum KL" in out
    assert "Total         -       -  -0.2000          -0.0040  +0.5000  +0.5040" in out
    assert "a bonus of 0.0040" in out
    table = out.split("mode:", 1)[1].split("\n", 1)[1]  # the text below the mode line
    assert "+0.5010  Bonus (KL estimate < 0)" in table and "Weak penalty" not in table
    assert "Less confident than reference  [-1.00, -1.50, -1.00]  -3.5000  -0.0700" in out
    assert "into a bonus: Less confident than reference\n" in out
    assert "beta 0.1 -> 0.805" in out


def test_cli_seed_faithful_prints_the_seeds_signs(capsys):
    rc, out, _ = run(capsys, "--seed-faithful")
    assert rc == 0 and "mode: seed-faithful" in out
    # the token table's "KL Penalty" is the reward's KL term, -beta·KL: +0.0040 in the total row
    assert "Total         -       -  -0.2000     +0.0040  +0.5000  +0.5040" in out
    assert "Total KL Penalty   -0.0040" in out and "KL penalty         +0.0040" in out
    assert out.count("+0.5500  Weak penalty") == 1 and out.count("Weak penalty") == 7  # + mode


def test_cli_json_flags(capsys):
    report = run_json(capsys, "-k", "0.1", "-r", "0.8")
    assert (report["kl_coef"], report["rm_score"], report["mode"]) == (0.1, 0.8, "corrected")
    assert report["summary"]["net_reward"] == pytest.approx(0.8 + 0.1 * 0.2, abs=EXACT)
    assert report["summary"]["penalty"] == pytest.approx(-0.02, abs=EXACT)
    assert [t["reward"] for t in report["tokens"]][-1] == pytest.approx(0.83, abs=EXACT)
    # corrected: the sweep and the scenarios use the flags (the seed fixes RM 0.5, beta 0.02)
    assert report["kl_coef_sweep"][0]["net_reward"] == pytest.approx(0.8, abs=EXACT)
    high = report["scenarios"][1]
    assert high["penalty"] == pytest.approx(0.1 * 0.7, abs=EXACT)
    seed = run_json(capsys, "-k", "0.1", "-r", "0.8", "--seed-faithful")
    assert [r["net_reward"] for r in seed["kl_coef_sweep"]] == pytest.approx(
        GOLDEN_SWEEP_NET, abs=PRINTED
    )
    assert [r["net_reward"] for r in seed["scenarios"]] == pytest.approx(
        [v[2] for v in GOLDEN_SCENARIOS.values()], abs=PRINTED
    )


def test_cli_k3_and_spread(capsys):
    report = run_json(capsys, "--estimator", "k3", "--spread-rm")
    assert report["estimator"] == "k3" and report["reward_at_end_only"] is False
    assert all(t["kl"] >= 0 and t["rm"] == pytest.approx(0.5 / 8) for t in report["tokens"])
    pairs = zip(reward.SEED_ACTOR_LPS, reward.SEED_REF_LPS, strict=True)
    expected = sum(math.exp(r - a) - (r - a) - 1 for a, r in pairs)
    assert report["summary"]["total_kl"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-k", "-0.5"], "--kl-coef -0.5: beta must be a finite number >= 0"),
        (["--seed-faithful", "--estimator", "k3"], "drop --estimator"),
        (["--seed-faithful", "--spread-rm"], "drop --spread-rm"),
        (["-k", "1e308", "-r", "1e308"], "overflow"),
    ],
)
def test_cli_refuses_with_one_line(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["-k", "nan"], ["-r", "inf"], ["--estimator", "k2"]])
def test_cli_argparse_refuses(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["calc", "reward", *argv])
    assert exc.value.code == 2 and "error" in capsys.readouterr().err


def test_cli_subprocess():
    cmd = [sys.executable, "-m", "jaxscale", "calc", "reward", "-k", "0.1", "-r", "0.8", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout)["summary"]["net_reward"] == pytest.approx(0.82, abs=EXACT)
