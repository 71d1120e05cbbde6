"""`jaxscale rlhf` learns (slow): from a fresh runs directory (SFT, then the reward model, then
RLHF), PPO and GRPO each raise the true score on held-out prompts, and without the KL penalty
(beta 0) the reward-model score climbs while the KL to the reference runs away and the lines
parse less often -- the seed's reward-hacking exercise (seed 002 ch13, Try It 2)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.first_line]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("rlhf_runs")


def _rlhf(runs, *flags):
    """`jaxscale rlhf` as a user runs it: its own process, the compiler's defaults."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_DISABLE_MOST_OPTIMIZATIONS", "XLA_FLAGS")
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxscale",
            "rlhf",
            "--runs",
            str(runs),
            "--json",
            "--no-progress",
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_ppo_and_grpo_raise_the_true_score_and_beta_zero_hacks(runs):
    """Thresholds from four seeds of each run on this project's CPU host (docs/rlhf.md, "Four
    seeds"): each holds with at least twice its margin on the worst of them. What varies too
    much between seeds to be asserted of one run is left out: the change in the 5-iteration
    running true score (GRPO: +0.022 to +0.080) and beta 0's parse rate (below PPO's in two
    seeds, above in two)."""
    out = {}
    for name, flags in (
        ("ppo", ["--algo", "ppo"]),
        ("grpo", ["--algo", "grpo"]),
        ("ppo_beta0", ["--algo", "ppo", "--beta", "0", "--kl-target", "0"]),
    ):
        out[name] = _rlhf(runs, *flags)
    assert out["ppo"]["reward_model"]["held_out_accuracy"] > 0.75  # it learned the preference
    for name, rm_rise in (("ppo", 0.5), ("grpo", 0.3)):
        s = out[name]
        held = s["held_out_true_score"]  # 128 held-out prompts, fixed keys
        # seeds 0-3: PPO +0.088 to +0.221, GRPO +0.086 to +0.166
        assert held["final"] >= held["initial"] + 0.04, (name, held)
        first, last = s["first_iterations"], s["last_iterations"]
        # seeds 0-3: PPO +1.62 to +2.27, GRPO +0.67 to +1.13
        assert last["rm_score"] > first["rm_score"] + rm_rise, (name, first, last)
        assert last["kl"] < 2 * 3.0  # held near the 3-nat target (seeds 0-3: 2.5 to 3.5)
    free, held_kl = out["ppo_beta0"]["last_iterations"], out["ppo"]["last_iterations"]
    # without the penalty the policy chases the reward model: seeds 0-3 end at RM score 4.2 to
    # 4.8 (PPO: 2.1 to 3.0) and KL 15 to 21 nats (PPO: 2.5 to 3.4)
    assert free["rm_score"] > out["ppo_beta0"]["first_iterations"]["rm_score"] + 2.0
    assert free["rm_score"] > held_kl["rm_score"] + 0.5
    assert free["kl"] > 3 * held_kl["kl"]  # the penalty is what holds the KL down
