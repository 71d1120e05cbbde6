"""`jaxscale rlhf` learns (slow): from a fresh runs directory (SFT, then the reward model, then
RLHF), PPO and GRPO each raise the true score on held-out prompts, and without the KL penalty
(beta 0) the reward-model score climbs while the KL to the reference runs away -- the seed's
reward-hacking exercise (seed 002 ch13, Try It 2).

The three runs are three tests so that the suite's workers can run them side by side; they share
one SFT model and reward model (prepared once, under a file lock, in a directory every worker of
the session sees) and each run's summary (the beta-0 test compares with PPO's)."""

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.first_line]

RUNS = {
    "ppo": ["--algo", "ppo"],
    "grpo": ["--algo", "grpo"],
    "ppo_beta0": ["--algo", "ppo", "--beta", "0", "--kl-target", "0"],
}


def _env():
    """A user's process: the compiler's defaults, not the suite's fast-compile settings."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_DISABLE_MOST_OPTIMIZATIONS", "XLA_FLAGS")
    }


def _run(args, timeout):
    r = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=_env(), timeout=timeout
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


class _Locked:
    """An exclusive lock on a file: the first worker to need a shared result makes it, the
    others wait for it and read it."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "w")  # noqa: SIM115 (closed in __exit__)
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """The session's runs directory, the SFT model and reward model in it: shared by the xdist
    workers (their base temp dirs' common parent), or the session's own without xdist."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "rlhf_runs"
    root.mkdir(exist_ok=True)
    with _Locked(root / "prepare.lock"):
        if not (root / "prepared").exists():
            # what `jaxscale rlhf` does first (cached SFT, then the reward model), alone
            _run(
                [
                    "-c",
                    "import sys; from jaxscale.rlhf import setup, task;"
                    "setup.prepare(sys.argv[1], task.TaskConfig())",
                    str(root),
                ],
                timeout=900,
            )
            (root / "prepared").touch()
    return root


def _summary(runs: Path, name: str) -> dict:
    """`jaxscale rlhf` as a user runs it, in its own process, once per session and name."""
    path = runs / f"{name}.json"
    with _Locked(runs / f"{name}.lock"):
        if not path.exists():
            out = _run(
                [
                    "-m",
                    "jaxscale",
                    "rlhf",
                    "--runs",
                    str(runs),
                    "--json",
                    "--no-progress",
                    *RUNS[name],
                ],
                timeout=1200,
            )
            path.write_text(out.strip().splitlines()[-1])
    return json.loads(path.read_text())


# Thresholds from four seeds of each run on this project's CPU host (docs/rlhf.md, "Four seeds"):
# each holds with at least twice its margin on the worst of them. What varies too much between
# seeds to be asserted of one run is left out: the change in the 5-iteration running true score
# (GRPO: +0.022 to +0.080) and beta 0's parse rate (below PPO's in two seeds, above in two).
@pytest.mark.parametrize(
    "name, rm_rise",
    [("ppo", 0.5), ("grpo", 0.3)],  # seeds 0-3: RM score +1.62 to +2.27 (PPO), +0.67 to +1.13
)
def test_ppo_and_grpo_raise_the_true_score_on_held_out_prompts(runs, name, rm_rise):
    s = _summary(runs, name)
    assert s["reward_model"]["held_out_accuracy"] > 0.75  # it learned the preference
    held = s["held_out_true_score"]  # 128 held-out prompts, fixed keys
    # seeds 0-3: PPO +0.088 to +0.221, GRPO +0.086 to +0.166
    assert held["final"] >= held["initial"] + 0.04, (name, held)
    first, last = s["first_iterations"], s["last_iterations"]
    assert last["rm_score"] > first["rm_score"] + rm_rise, (name, first, last)
    assert last["kl"] < 2 * 3.0  # held near the 3-nat target (seeds 0-3: 2.5 to 3.5)


def test_without_the_kl_penalty_the_policy_hacks_the_reward_model(runs):
    free = _summary(runs, "ppo_beta0")
    held_kl = _summary(runs, "ppo")["last_iterations"]
    last = free["last_iterations"]
    # without the penalty the policy chases the reward model: seeds 0-3 end at RM score 4.2 to
    # 4.8 (PPO: 2.1 to 3.0) and KL 15 to 21 nats (PPO: 2.5 to 3.4)
    assert last["rm_score"] > free["first_iterations"]["rm_score"] + 2.0
    assert last["rm_score"] > held_kl["rm_score"] + 0.5
    assert last["kl"] > 3 * held_kl["kl"]  # the penalty is what holds the KL down
