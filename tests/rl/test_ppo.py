"""The policy-gradient losses, the PPO clipping table, the config's checks, and the data-parallel
run against the single-device one."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.mesh import build_mesh
from jaxscale.rl import loop
from jaxscale.rl.config import RLConfig
from jaxscale.rl.ppo import CLIPPING_CASES, clipped_objective, policy_loss
from jaxscale.tolerances import RL_DP_ATOL

# seed 002 ch12 Try-It 3 (PPO clipping), eps 0.2: (A, r) -> (objective, clipped term chosen)
SEED_CLIPPING = {
    (1.0, 1.5): (1.2, True),
    (1.0, 0.5): (0.5, False),
    (-1.0, 0.5): (-0.8, True),
    (-1.0, 1.5): (-1.5, False),
    (1.0, 1.1): (1.1, False),
}


def test_clipping_table():
    assert set(CLIPPING_CASES) == set(SEED_CLIPPING)
    for (adv, ratio), (value, clipped) in SEED_CLIPPING.items():
        got, got_clipped = clipped_objective(ratio, adv, 0.2)
        assert got == pytest.approx(value) and got_clipped == clipped


def test_ppo_loss_gradient_vanishes_where_clipped():
    """d/d logits of the clipped objective is zero for a sample whose ratio is past the clip in
    its advantage's favour, and not zero inside the trust region."""
    cfg = RLConfig(ent_coef=0.0, vf_coef=0.0)
    logits = jnp.asarray([[0.0, 0.0]])
    mb = {"action": jnp.asarray([0]), "value": jnp.zeros(1), "ret": jnp.zeros(1)}

    def grad_at(old_logp, adv):
        mb_ = mb | {"logp": jnp.asarray([old_logp])}
        return jax.grad(lambda lg: policy_loss(cfg, lg, jnp.zeros(1), mb_, jnp.asarray([adv]))[0])(
            logits
        )

    assert float(jnp.abs(grad_at(np.log(0.5 / 1.5), 1.0)).sum()) == 0.0  # r = 1.5, A > 0
    assert float(jnp.abs(grad_at(np.log(0.5 / 1.1), 1.0)).sum()) > 0.0  # r = 1.1
    assert float(jnp.abs(grad_at(np.log(0.5 / 0.5), -1.0)).sum()) == 0.0  # r = 0.5, A < 0


@pytest.mark.parametrize(
    "change, flag",
    [
        ({"num_envs": 12}, "--num-envs"),
        ({"minibatches": 7}, "--minibatches"),
        ({"gamma": 1.5}, "--gamma"),
        ({"algo": "dqn"}, "--algo"),
        ({"env": "pong"}, "--env"),
        ({"lr": 0.0}, "--lr"),
        ({"eval_episodes": -1}, "--eval-episodes"),
    ],
)
def test_config_errors_name_the_flag(change, flag):
    with pytest.raises(ValueError, match=flag):
        RLConfig(**change).check(data_ways=8)


CFG = RLConfig(num_envs=16, num_steps=32, total_steps=16 * 32 * 3, eval_every=3, eval_episodes=16)


@pytest.fixture(scope="module")
def runs():
    keys = jax.vmap(jax.random.key)(np.arange(2, dtype=np.uint32))
    single = loop.run(CFG, keys, groups=8)  # one device, the 8 shards as a vmapped axis
    sharded = loop.run(CFG, keys, mesh=build_mesh("dp=8"))
    other = loop.run(CFG, keys, groups=4)
    return single, sharded, other


@pytest.mark.slow  # three runs compiled (17 s of the fast suite); CI runs it on both lines
def test_data_parallel_equals_single_device(runs):
    single, sharded, _ = runs
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=RL_DP_ATOL, rtol=0)
    # the runs learned something: the comparison is not between two untrained policies
    assert np.all(np.asarray(single[1]["episodes"]) > 0)
    assert float(jnp.abs(single[1]["policy_loss"]).max()) > 0


@pytest.mark.slow  # shares the three runs above
def test_the_check_sees_a_different_split(runs):
    """Four shards instead of eight draw other environments: the same check must fail."""
    single, _, other = runs
    diffs = [
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(single[0]), jax.tree.leaves(other[0]), strict=True)
    ]
    assert max(diffs) > 100 * RL_DP_ATOL


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "jaxscale", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_clipping_and_gae_json():
    out = json.loads(_cli("rl", "clipping", "--json").stdout)
    got = {(c["advantage"], c["ratio"]): (c["objective"], c["clipped"]) for c in out["cases"]}
    assert got.keys() == SEED_CLIPPING.keys()
    for k, (value, clipped) in SEED_CLIPPING.items():
        assert got[k][0] == pytest.approx(value) and got[k][1] == clipped
    g = json.loads(_cli("calc", "gae", "--json").stdout)
    assert [round(a, 4) for a in g["example"]["advantages"]] == [0.7018, 0.7504, 0.8]
    assert g["weights"][-1] == {"k": 10, "weight": pytest.approx(0.9405**10)}
    seed = json.loads(_cli("calc", "gae", "--json", "--seed-faithful").stdout)
    assert seed["weights"][-1]["weight"] == 0.53 and seed["mode"] == "seed-faithful"


def test_cli_refuses_bad_runs_before_compiling():
    r = _cli("rl", "ppo", "--num-envs", "12", "--mesh", "dp=8")
    assert r.returncode == 2 and "--num-envs 12" in r.stderr and "Traceback" not in r.stderr
    r = _cli("rl", "ppo", "--mesh", "dp=2,tp=4")
    assert r.returncode == 2 and "data axis only" in r.stderr


@pytest.mark.slow  # the command in a subprocess; the loop's equality is fast
@pytest.mark.first_line
def test_cli_trains_and_writes(tmp_path):
    r = _cli(
        "rl",
        "actor-critic",
        "--total-steps",
        "4096",
        "--eval-every",
        "2",
        "--seeds",
        "2",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["seeds"] == 2 and s["env_steps"] == 4096 and len(s["final_eval_return"]) == 2
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len([x for x in lines if "update" in x]) == 2 * 4
    assert len([x for x in lines if "eval_return" in x]) == 2 * 2
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000


def test_tensorboard_scalars_hold_the_metrics_records(tmp_path):
    """`rl ppo --tensorboard`: run.write_scalars writes what write_metrics writes, per seed, at
    the same environment steps (a made-up two-seed outcome: no training needed)."""
    pytest.importorskip("tensorboardX")
    from jaxscale.rl import run
    from tests.train.test_tensorboard import _events

    cfg = RLConfig(num_envs=4, num_steps=8, total_steps=4 * 8 * 4, eval_every=2)
    rng = np.random.default_rng(0)
    metrics = {"policy_loss": rng.normal(size=(2, 4)), "episodes": rng.integers(1, 9, (2, 4))}
    out = run.Outcome(cfg, (3, 4), metrics, rng.normal(size=(2, 2)), 0.0, 0.0, 1)
    run.write_scalars(out, tmp_path / "tb")
    run.write_metrics(out, tmp_path / "metrics.jsonl")
    scalars = _events(tmp_path / "tb")
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    expected = {}
    for r in lines:
        for k, v in r.items():
            if k not in ("seed", "update", "env_steps"):
                expected[(f"seed{r['seed']}/{k}", r["env_steps"])] = v
    assert len(expected) == 2 * (4 * 2 + 2)
    assert scalars.keys() == expected.keys()
    for key, value in expected.items():
        assert scalars[key] == pytest.approx(value, rel=1e-6), key


@pytest.mark.slow  # a traced run (the profiler's cost per op on CPU)
def test_rl_profile_traces_the_run_and_splits_it_per_update(tmp_path, capsys):
    """`rl ppo --profile DIR` on dp=8: the trace is read back over the run's 4 updates; the
    split adds up (compute + exposed collectives + idle = the update's time), the collectives
    are the data axis' all-reduces, and the console names the trace and how to open it."""
    import json

    from jaxscale.cli import main as cli_main

    argv = ["rl", "ppo", "--total-steps", "1024", "--num-envs", "8", "--num-steps", "32"]
    argv += ["--eval-every", "4", "--eval-episodes", "0", "--mesh", "dp=8"]
    argv += ["--profile", str(tmp_path / "p")]
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    got = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert got["steps"] == 4 and got["devices"] == 8
    assert got["step_s"] == pytest.approx(
        got["compute_s"] + got["exposed_s"] + got["idle_s"], rel=1e-6
    )
    assert set(got["collectives_s"]) == {"all-reduce"} and got["collective_s"] > 0
    assert "profile: per update" in err and "ui.perfetto.dev" in err
