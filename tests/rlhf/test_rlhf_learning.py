"""`jaxscale rlhf` learns (slow): from a fresh runs directory (SFT, then the reward model, then
RLHF), PPO and GRPO each raise the true score on held-out prompts, and without the KL penalty
(beta 0) the reward-model score climbs while the KL to the reference runs away -- the seed's
reward-hacking exercise (seed 002 ch13, Try It 2).

Each claim is a mean over three seeds of the run (docs/testing.md, "Learning tests"): one run's
outcome moves with float rounding (one SFT model prepared on another device count turned GRPO's
+0.09 into +0.04), a mean of three holds. The runs share one SFT model and reward model, prepared
once under a file lock on the default eight devices, in a directory every worker of the session
sees; each run and its summary are made once per session, whichever test asks first."""

import fcntl
import json
import os
import statistics
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
SEEDS = (0, 1, 2)


def _env(devices: int | None = None):
    """A user's process: the compiler's defaults, not the suite's fast-compile settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_DISABLE_MOST_OPTIMIZATIONS", "XLA_FLAGS")
    }
    return {**env, "JAX_NUM_CPU_DEVICES": str(devices)} if devices else env


def _run(args, timeout, devices=None):
    r = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=_env(devices),
        timeout=timeout,
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


def _summary(runs: Path, name: str, seed: int) -> dict:
    """`jaxscale rlhf --seed SEED` as a user runs it, in its own process, once per session. On
    one simulated device: half the CPU time of eight, whose runs equal one device's at the f32
    trajectory tolerance (`tests/rlhf/test_rlhf.py`); the mean over seeds is what is asserted."""
    path = runs / f"{name}_{seed}.json"
    with _Locked(runs / f"{name}_{seed}.lock"):
        if not path.exists():
            argv = ["-m", "jaxscale", "rlhf", "--runs", str(runs), "--json", "--no-progress"]
            out = _run([*argv, *RUNS[name], "--seed", str(seed)], timeout=1200, devices=1)
            path.write_text(out.strip().splitlines()[-1])
    return json.loads(path.read_text())


def _mean(summaries: list[dict], key) -> float:
    return statistics.mean(key(s) for s in summaries)


def _gain(s: dict) -> float:
    return s["held_out_true_score"]["final"] - s["held_out_true_score"]["initial"]


def _rm_rise(s: dict) -> float:
    return s["last_iterations"]["rm_score"] - s["first_iterations"]["rm_score"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_every_run_holds_the_kl_near_its_target(runs, name, seed):
    """Of each run alone: the reward model learned the preference, and the adaptive beta held
    the KL to the reference near its 3-nat target (16 GRPO and 8 PPO runs: 2.5 to 4.0)."""
    s = _summary(runs, name, seed)
    assert s["reward_model"]["held_out_accuracy"] > 0.75
    assert s["last_iterations"]["kl"] < 2 * 3.0


# Thresholds from a study of 16 GRPO and 8 PPO runs (seeds 0-7 and 0-3, over SFT and reward
# models prepared on 8 devices and on 1, whose float rounding differs; docs/rlhf.md, "Seeds"):
# the worst mean of any three of them is named beside each threshold. One run alone went as low
# as +0.037 (GRPO) in held-out true score and +0.07 (GRPO) in RM score.
@pytest.mark.parametrize(
    "name, gain, rm_rise",
    [
        ("ppo", 0.04, 0.5),  # worst 3-run means: +0.098 held out, RM score +1.68
        ("grpo", 0.04, 0.3),  # worst 3-run means: +0.073 held out, RM score +0.54
    ],
)
def test_ppo_and_grpo_raise_the_true_score_on_held_out_prompts(runs, name, gain, rm_rise):
    s = [_summary(runs, name, seed) for seed in SEEDS]
    held = [x["held_out_true_score"] for x in s]  # 128 held-out prompts, fixed keys
    assert _mean(s, _gain) >= gain, (name, held)
    assert _mean(s, _rm_rise) > rm_rise, (name, [_rm_rise(x) for x in s])


def test_without_the_kl_penalty_the_policy_hacks_the_reward_model(runs):
    free = [_summary(runs, "ppo_beta0", seed)["last_iterations"] for seed in SEEDS]
    held_kl = [_summary(runs, "ppo", seed)["last_iterations"] for seed in SEEDS]
    rise = _mean([_summary(runs, "ppo_beta0", seed) for seed in SEEDS], _rm_rise)

    def mean(rows, key):
        return statistics.mean(r[key] for r in rows)

    # without the penalty the policy chases the reward model: over every three of eight runs the
    # RM score rose by 3.6 or more and ended 1.6 or more above PPO's, at 5.3 times its KL or more
    assert rise > 2.0
    assert mean(free, "rm_score") > mean(held_kl, "rm_score") + 0.5
    assert mean(free, "kl") > 3 * mean(held_kl, "kl")  # the penalty is what holds the KL down
