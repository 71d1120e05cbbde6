"""Checkpoints: exact resume, restore under another mesh, clear errors, nothing half-written."""

import jax
import numpy as np
import pytest

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.parallel.compose import Strategy, build
from jaxscale.tolerances import ATOL, RTOL, TRAJ_ATOL
from jaxscale.train import checkpoint, data
from jaxscale.train.loop import RunSetup, train

CFG = ModelConfig(n_layers=1)
N = 3
TCFG = TrainConfig(steps=2 * N, global_batch=8, seq_len=16, warmup_steps=1, eval_every=0)


def _run(mesh, stop_after, ckpt_dir=None, resume=False, strategy="auto", cfg=CFG, **pipe):
    """A 2N-step run (its LR schedule spans 2N steps) that stops after `stop_after` steps."""
    setup = RunSetup(
        mesh=mesh,
        strategy=strategy,
        dataset="markov",
        ckpt_dir=ckpt_dir,
        resume=resume,
        progress=False,
        sample_tokens=0,
        stop_after=stop_after,
        **pipe,
    )
    return train(cfg, TCFG, setup)


def _host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


@pytest.fixture(scope="module")
def uninterrupted():
    return _host(_run("dp=8", 2 * N).state)


def test_resume_reproduces_the_uninterrupted_run_bitwise(tmp_path, uninterrupted):
    first = _run("dp=8", N, ckpt_dir=tmp_path)
    assert checkpoint.latest_step(tmp_path) == N
    assert first.resumed_from is None
    resumed = _run("dp=8", 2 * N, ckpt_dir=tmp_path, resume=True)
    assert resumed.resumed_from == N
    got = _host(resumed.state)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(uninterrupted), strict=True):
        np.testing.assert_array_equal(a, b)


def _restore(ckpt_dir, mesh_spec, cfg=CFG, strategy="auto"):
    built = build(Strategy.parse(strategy, mesh_spec), cfg, TCFG)
    meta = checkpoint.meta_record(cfg, TCFG, mesh_spec)
    with jax.set_mesh(built.mesh):
        state = checkpoint.restore(ckpt_dir, built.state_shardings, built.abstract_state, meta)
        return state[0], built


@pytest.mark.smoke
def test_checkpoint_from_one_mesh_restores_under_another(tmp_path):
    saved = _run("dp=8", N, ckpt_dir=tmp_path).state
    state, built = _restore(tmp_path, "fsdp=2,tp=4")
    # the restored arrays carry the new mesh's layout ...
    wq = state["params"]["blocks"]["wq_DHK"]
    assert wq.sharding.spec == jax.P(None, "fsdp", "tensor", None)
    # ... and hold exactly the saved values
    for a, b in zip(jax.tree.leaves(_host(state)), jax.tree.leaves(_host(saved)), strict=True):
        np.testing.assert_array_equal(a, b)
    batch = data.MarkovData().rows(0, 99, range(8), 16)
    loss_old = build(Strategy("dp=8"), CFG, TCFG).loss(_host(saved["params"]), batch)
    with jax.set_mesh(built.mesh):
        loss_new = built.loss(state["params"], built.put(batch))
    np.testing.assert_allclose(float(loss_new), float(loss_old), rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_manual_strategy_checkpoint_resumes_under_the_auto_path(tmp_path, uninterrupted):
    """Auto and manual states share one structure: ZeRO-3 + TP saves, auto DP x TP resumes, and
    the run ends where the uninterrupted auto DP run ends (to the trajectory tolerance: the
    strategies sum in different orders)."""
    _run("fsdp=4,tp=2", N, ckpt_dir=tmp_path, strategy="manual:zero3+tp")
    resumed = _run("dp=2,tp=4", 2 * N, ckpt_dir=tmp_path, resume=True)
    assert resumed.resumed_from == N
    for a, b in zip(
        jax.tree.leaves(_host(resumed.state)), jax.tree.leaves(uninterrupted), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=0, atol=TRAJ_ATOL)


@pytest.mark.slow
@pytest.mark.first_line
def test_a_context_parallel_checkpoint_resumes_without_cp_and_back(tmp_path, uninterrupted):
    """Context parallelism keeps the one stored layout (parameters replicated over `context`):
    a ring run on cp=4 x dp=2 saves, plain DP resumes; DP saves, Ulysses on cp=2 x dp=4 resumes;
    both end where the uninterrupted DP run ends (to the trajectory tolerance)."""
    _run("cp=4,dp=2", N, tmp_path / "a", strategy="manual:dp+cp_ring")
    resumed = [_run("dp=8", 2 * N, tmp_path / "a", resume=True)]
    _run("dp=8", N, tmp_path / "b")
    resumed.append(
        _run("cp=2,dp=4", 2 * N, tmp_path / "b", resume=True, strategy="manual:dp+cp_ulysses")
    )
    for run in resumed:
        assert run.resumed_from == N
        for a, b in zip(
            jax.tree.leaves(_host(run.state)), jax.tree.leaves(uninterrupted), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=0, atol=TRAJ_ATOL)


@pytest.mark.slow
def test_a_pipelined_checkpoint_resumes_under_dp_and_back(tmp_path):
    """One stored layout for every strategy: a 1F1B run on pp=2 x dp=4 saves, plain DP resumes;
    DP saves, 1F1B on pp=2 x dp=2 x tp=2 resumes; both end where the uninterrupted DP run ends."""
    cfg = CFG.replace(n_layers=2)
    whole = _host(_run("dp=8", 2 * N, cfg=cfg).state)
    pipe = dict(schedule="1f1b", microbatches=2)
    _run("pp=2,dp=4", N, tmp_path / "a", strategy="manual:dp", cfg=cfg, **pipe)
    resumed = [_run("dp=8", 2 * N, tmp_path / "a", resume=True, cfg=cfg)]
    _run("dp=8", N, tmp_path / "b", cfg=cfg)
    resumed.append(
        _run(
            "pp=2,dp=2,tp=2",
            2 * N,
            tmp_path / "b",
            resume=True,
            strategy="manual:dp+tp",
            cfg=cfg,
            **pipe,
        )
    )
    for run in resumed:
        assert run.resumed_from == N
        for a, b in zip(jax.tree.leaves(_host(run.state)), jax.tree.leaves(whole), strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=TRAJ_ATOL)


def _snapshot(directory):
    return sorted((p.relative_to(directory), p.stat().st_size) for p in directory.rglob("*"))


def test_mismatched_model_is_refused_and_nothing_changes(tmp_path):
    _run("dp=8", N, ckpt_dir=tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match="different model.*d_model"):
        _restore(tmp_path, "dp=8", cfg=CFG.replace(d_model=128))
    assert _snapshot(tmp_path) == before


def test_corrupt_checkpoint_gives_a_clear_error_and_nothing_changes(tmp_path):
    _run("dp=8", N, ckpt_dir=tmp_path)
    # garble every array data file of the saved state (orbax/tensorstore "d/" chunk files)
    victims = [
        p for p in (tmp_path / str(N) / "state").rglob("*") if p.is_file() and p.parent.name == "d"
    ]
    assert victims, "expected array data files in the checkpoint"
    for p in victims:
        p.write_bytes(b"\x00garbage" * 4)
    before = _snapshot(tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match="corrupt|unreadable") as exc:
        _restore(tmp_path, "dp=8")
    message = str(exc.value)
    # one line naming the step and what to do, not the storage layer's pages of JSON
    assert "\n" not in message and len(message) < 400 and f"step {N}" in message
    assert "delete it, or train from scratch" in message
    assert _snapshot(tmp_path) == before


def test_unfinished_save_is_not_taken_for_a_checkpoint(tmp_path):
    _run("dp=8", N, ckpt_dir=tmp_path)
    # what an interrupted save leaves: orbax's temporary directory, never renamed into place
    (tmp_path / f"{2 * N}.orbax-checkpoint-tmp-1234").mkdir()
    assert checkpoint.latest_step(tmp_path) == N


def test_missing_checkpoint_directory_is_a_clear_error(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint directory"):
        _restore(tmp_path / "nope", "dp=8")


@pytest.mark.slow  # a subprocess that imports jax and orbax
@pytest.mark.first_line
def test_a_corrupt_checkpoint_is_one_line_and_nothing_else_at_exit(tmp_path):
    """`jaxscale serve --ckpt-dir` on a corrupt checkpoint, as a user runs it: exit 2 and the
    one error line, with no "Event loop is closed" traceback from orbax's background reads at
    the interpreter's exit (the issue's report: the good line, then that traceback)."""
    import os
    import socket
    import subprocess
    import sys

    _run("dp=8", N, ckpt_dir=tmp_path)
    for p in (tmp_path / str(N) / "state").rglob("*"):
        if p.is_file() and p.parent.name == "d":
            p.write_bytes(b"\x00garbage" * 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxscale",
            "serve",
            "--ckpt-dir",
            str(tmp_path),
            "--port",
            str(port),
        ],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    assert r.returncode == 2 and len(errors) == 1 and "corrupt" in errors[0], r.stderr[-2000:]
    noise = ("Traceback", "Event loop is closed", "exception was never retrieved")
    assert not [n for n in noise if n in r.stderr], r.stderr[-2000:]
