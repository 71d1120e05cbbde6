"""`jaxscale rlhf` learns (slow): from a fresh runs directory (SFT, then the reward model, then
RLHF), PPO and GRPO each raise the true score on held-out prompts, and without the KL penalty
(beta 0) the reward-model score climbs while the KL to the reference runs away and the lines
parse less often -- the seed's reward-hacking exercise (seed 002 ch13, Try It 2)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("rlhf_runs")


def _rlhf(runs, *flags):
    """`jaxscale rlhf` as a user runs it: its own process, the compiler's default passes."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_DISABLE_MOST_OPTIMIZATIONS"}
    r = subprocess.run([sys.executable, "-m", "jaxscale", "rlhf", "--runs", str(runs), "--json",
                        "--no-progress", *flags], capture_output=True, text=True, env=env,
                       timeout=1200)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_ppo_and_grpo_raise_the_true_score_and_beta_zero_hacks(runs):
    out = {}
    for name, flags in (
        ("ppo", ["--algo", "ppo"]),
        ("grpo", ["--algo", "grpo"]),
        ("ppo_beta0", ["--algo", "ppo", "--beta", "0", "--kl-target", "0"]),
    ):
        out[name] = _rlhf(runs, *flags)
    assert out["ppo"]["reward_model"]["held_out_accuracy"] > 0.75  # it learned the preference
    # seed 0 on this project's CPU host: held-out +0.10 (PPO) and +0.07 (GRPO); 128 prompts
    for name in ("ppo", "grpo"):
        s = out[name]
        held = s["held_out_true_score"]
        assert held["final"] >= held["initial"] + 0.04, (name, held)
        first, last = s["first_iterations"], s["last_iterations"]
        assert last["true_score"] >= first["true_score"] + 0.02, (name, first, last)
        assert last["rm_score"] > first["rm_score"] + 0.5
        assert last["kl"] < 2 * 3.0  # held near the 3-nat target
    free, held_kl = out["ppo_beta0"]["last_iterations"], out["ppo"]["last_iterations"]
    assert free["rm_score"] > out["ppo_beta0"]["first_iterations"]["rm_score"] + 1.0
    assert free["kl"] > 2 * held_kl["kl"]  # the penalty is what holds the KL down
    assert free["parses_rate"] < held_kl["parses_rate"]  # what the KL runs off to does not parse
