"""`jaxscale rlhf` as a user runs it: the paths --runs and --out imply refused before anything
runs, the cache's place and state in the header, progress for the stages before RLHF, the
trained policy saved where `jaxscale serve` loads it, and a run resumed from a checkpoint with
the uninterrupted run's metrics. The CLI runs in-process on tiny random models put in the cache
(SFT and the reward model then load instead of training)."""

import contextlib
import io
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from rlhf_cache import CFG, TINY, seed_cache

from jaxscale.cli import main
from jaxscale.rlhf import run, setup
from jaxscale.rlhf.task import TaskConfig

_ITERATE = run.iterate


def _cli(*argv):
    """(exit code, stdout, stderr) of `jaxscale rlhf ARGV`, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["rlhf", *argv])
        except SystemExit as e:  # argparse refuses a flag's value itself
            code = e.code
    return code, out.getvalue(), err.getvalue()


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "where, message",
    [
        ("runs=FILE", "exists and is not a directory"),  # before: the dry run said OK
        ("runs=/proc/x", "cannot create /proc/x"),
        ("out=/proc/x", "cannot create /proc/x"),
        ("out=FILE", "exists and is not a directory"),
        ("runs/sft_1.npz=DIR", "sft_1.npz is a directory"),  # before: failed after compiling
        ("out/policy=FILE", "policy"),
        ("out/metrics.jsonl=DIR", "metrics.jsonl is a directory"),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False])
def test_paths_are_refused_before_anything_runs(tmp_path, where, message, dry_run):
    file = tmp_path / "file"
    file.write_text("")
    runs, out = tmp_path / "runs", tmp_path / "out"
    what, value = where.split("=")
    if value in ("FILE", "DIR") and "/" in what:  # a path the flag implies
        path = tmp_path / what
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if value == "DIR" else path.write_text("")
    elif value == "FILE":
        runs, out = (file, out) if what == "runs" else (runs, file)
    else:
        runs, out = (Path(value), out) if what == "runs" else (runs, Path(value))
    argv = [*TINY, "--runs", str(runs), "--out", str(out)] + (["--dry-run"] if dry_run else [])
    code, _, err = _cli(*argv)
    assert code == 2 and message in _one_error_line(err), err
    assert not (tmp_path / "out" / "metrics.jsonl").is_file()


def test_the_header_says_where_the_cache_is_and_what_it_holds(tmp_path, monkeypatch):
    """A relative --runs is resolved once against the working directory and printed whole:
    run from elsewhere, the header shows another place and 'will be trained'."""
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(*TINY, "--runs", "cache", "--dry-run")
    assert code == 0, err
    assert f"cache: {tmp_path / 'cache'}\n" in out
    assert out.count("will be trained") == 2
    seed_cache(tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out, _ = _cli(*TINY, "--runs", str(tmp_path / "cache"), "--dry-run")
    assert "SFT (1 steps of jaxscale train on the standard library): cached" in out
    assert "reward model (1 Bradley-Terry steps): cached" in out
    monkeypatch.chdir(elsewhere)
    code, out, _ = _cli(*TINY, "--runs", "cache", "--dry-run")
    assert f"cache: {elsewhere / 'cache'}\n" in out and out.count("will be trained") == 2


def test_the_stages_before_rlhf_show_progress(tmp_path, capsys, monkeypatch):
    """SFT runs `jaxscale train` with its bar (its report lines kept off stdout), the
    comparison pairs and the reward model's steps get bars of their own on stderr."""
    import subprocess

    from jaxscale.train import checkpoint

    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append((argv, kw)) or _Done())
    monkeypatch.setattr(checkpoint, "load_model", lambda d: (CFG, setup.random_models(CFG)[0]))
    rng = np.random.default_rng(0)

    def pairs(cfg, params, prompts, task, seed=0, progress=None):
        for _ in range(setup.pair_batches(len(prompts))):
            progress()
        seq = rng.integers(0, 256, (64, 40)).astype(np.int32)
        last = np.full(64, 39)
        return seq, last, seq[::-1].copy(), last

    monkeypatch.setattr(setup, "comparison_pairs", pairs)
    setup.prepare(tmp_path, TaskConfig(), 1, 3, progress=True)
    argv, kw = calls[0]
    assert "train" in argv and "--no-progress" not in argv and kw["stdout"] is not None
    err = capsys.readouterr().err
    assert "comparison pairs [" in err and "reward model [" in err and "3/3" in err
    setup.sft_model(tmp_path / "quiet", 1, progress=False)
    assert "--no-progress" in calls[1][0] and "[" not in capsys.readouterr().err


class _Done:
    returncode, stdout = 0, ""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("rlhf_cli") / "runs"
    seed_cache(path)
    return path


def _train(monkeypatch, runs, out, *flags):
    """The CLI's run and the loop's result (the trained tree), read by a spy on `iterate`."""
    got = {}

    def spy(*a, **k):
        got["res"] = _ITERATE(*a, **k)
        return got["res"]

    # the module's own `iterate`, not a spy an earlier call in the same test put there: a spy
    # around a spy returned the first run's result to the second run's CLI
    monkeypatch.setattr(run, "iterate", spy)
    code, stdout, err = _cli(*TINY, "--json", "--runs", str(runs), "--out", str(out), *flags)
    assert code == 0, err
    return json.loads(stdout.strip().splitlines()[-1]), got.get("res")


@pytest.fixture(scope="module")
def full(runs, tmp_path_factory):
    """The uninterrupted run: 3 iterations, a checkpoint after each."""
    out = tmp_path_factory.mktemp("full")
    with pytest.MonkeyPatch.context() as mp:
        flags = ["--iterations", "3", "--ckpt-every", "1", "--tensorboard", str(out / "tb")]
        summary, res = _train(mp, runs, out, *flags)
    return out, summary, res


def test_each_iterations_record_is_a_tensorboard_scalar_too(full):
    """--tensorboard: every number of every metrics.jsonl record at its iteration."""
    from tests.train.test_tensorboard import _events

    out, _, _ = full
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    scalars = _events(out / "tb")
    expected = {
        (f"rlhf/{k}", r["iteration"]): v
        for r in records
        for k, v in r.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    assert len(records) == 3 and {"rlhf/kl", "rlhf/true_score"} <= {t for t, _ in expected}
    for key, value in expected.items():
        assert scalars[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key  # float32


def test_the_policy_is_saved_where_serve_loads_it(full):
    from jaxscale.serve.generate import generate
    from jaxscale.train.checkpoint import load_model

    out, summary, res = full
    assert summary["policy"] == str(out / "policy")
    assert (out / "policy" / "config.json").is_file()
    cfg, params = load_model(str(out / "policy"))  # what `jaxscale serve --ckpt-dir` calls
    assert cfg == CFG
    want = jax.tree.leaves(res.tree["actor"])
    for got, x in zip(jax.tree.leaves(params), want, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(x))
    initial = jax.tree.leaves(setup.random_models(CFG, 0)[0])
    assert any(not np.array_equal(a, b) for a, b in zip(initial, want, strict=True))  # trained
    g = generate(params, [[ord(c) for c in "x = foo("]], cfg, max_new=8)
    assert g.valid[0].sum() >= 1 and len(g.row(0)) == g.valid[0].sum()


TIMING = ("t_generate_s", "t_score_s", "t_train_s", "t_transfer_s", "tokens_per_s")


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.mark.slow  # a traced iteration
def test_profile_traces_the_iterations_after_the_first(runs, tmp_path, monkeypatch):
    """--profile DIR --profile-steps 1 on 3 iterations: the trace holds iteration 2 (every
    program of it) and profile.json's split adds up; the run's records are written as without
    it."""
    out = tmp_path / "out"
    flags = ["--iterations", "3", "--profile", str(tmp_path / "p"), "--profile-steps", "1"]
    _train(monkeypatch, runs, out, *flags)
    got = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert got["steps"] == 1 and got["devices"] >= 1 and got["trace"].endswith(".xplane.pb")
    assert got["step_s"] == pytest.approx(
        got["compute_s"] + got["exposed_s"] + got["idle_s"], rel=1e-6
    )
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow  # four tiny runs on two meshes
@pytest.mark.first_line  # the resume test covers the checkpoints on both lines
def test_a_stale_run_resumes_exactly(runs, tmp_path, monkeypatch):
    """A --stale run (disaggregated: batch k + 1 generated by the weights that made batch k)
    stopped after 2 of 3 iterations and resumed: its checkpoint holds the actor one update
    behind, which makes batch 2, so the metrics and the policy are the uninterrupted run's. The
    synchronous run's differ (the stale batches really are one update behind)."""
    from jaxscale.train.checkpoint import load_model

    stale = ["--placement", "disaggregated", "--stale", "--mesh", "fsdp=4"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    _train(monkeypatch, runs, whole, *stale, "--iterations", "3")
    _train(monkeypatch, runs, part, *stale, "--iterations", "2", "--ckpt-every", "1")
    _, res = _train(monkeypatch, runs, part, *stale, "--iterations", "3", "--resume")
    assert len(res.history) == 3
    assert _metrics(part) == _metrics(whole)
    for x, y in zip(
        jax.tree.leaves(load_model(str(whole / "policy"))[1]),
        jax.tree.leaves(load_model(str(part / "policy"))[1]),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    sync = tmp_path / "sync"
    sync_flags = ["--placement", "disaggregated", "--mesh", "fsdp=4", "--iterations", "3"]
    _train(monkeypatch, runs, sync, *sync_flags)
    assert _metrics(sync)[2] != _metrics(whole)[2]


@pytest.mark.slow  # two tiny runs and a resume; the policy save and load are fast
def test_a_resumed_run_continues_exactly(full, runs, tmp_path, monkeypatch):
    """Stopped after 2 of 3 iterations and resumed: the same metrics (every iteration's prompts
    and keys follow from its index; actor, critic, Adam state and beta come back), the same
    policy. A checkpoint in --out is not overwritten without --resume, nor resumed with other
    flags."""
    from jaxscale.train.checkpoint import load_model

    out, summary, _ = full
    _train(monkeypatch, runs, tmp_path, "--iterations", "2", "--ckpt-every", "1")
    code, _, err = _cli(*TINY, "--runs", str(runs), "--out", str(tmp_path), "--iterations", "3")
    assert code == 2 and "pass --resume" in _one_error_line(err)
    flags = ["--runs", str(runs), "--out", str(tmp_path), "--iterations", "3", "--resume"]
    code, _, err = _cli(*TINY, *flags, "--lr", "0.1")
    assert code == 2 and "--lr 0.0003" in _one_error_line(err)
    resumed, res = _train(monkeypatch, runs, tmp_path, "--iterations", "3", "--resume")
    assert _metrics(tmp_path) == _metrics(out)
    _, a = load_model(str(out / "policy"))
    _, b = load_model(str(tmp_path / "policy"))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert len(res.history) == 3  # the resumed run's result (not the stopped run's 2)
    assert resumed["held_out_true_score"] == summary["held_out_true_score"]


@pytest.mark.slow  # SFT (two steps), the comparison pairs and part of the reward model
@pytest.mark.first_line
@pytest.mark.parametrize("signals", [("SIGINT",), ("SIGINT", "SIGINT")])
def test_ctrl_c_during_the_reward_model_stops_cleanly(tmp_path, signals):
    """Ctrl-C while the reward model trains (the issue's report: a segfault in 2 of 3 tries):
    once, the stage finishes and is cached, and the run stops with 130 before RLHF; twice, 130
    at once with nothing more written. Never a traceback or a crash."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    from jaxscale.rlhf.cli import ABORT_NOTE

    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "jaxscale", "rlhf", "--runs", str(runs), "--sft-steps", "2"]
    # 20 steps: about 7 s of training on 8 simulated devices, the signal lands in the first
    argv += ["--rm-steps", "20", "--iterations", "1"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    chunks: list[str] = []
    threading.Thread(
        target=lambda: chunks.extend(iter(lambda: proc.stdout.read(64), "")), daemon=True
    ).start()
    try:
        deadline = time.monotonic() + 300
        while "reward model [" not in "".join(chunks):  # its progress bar: training
            assert time.monotonic() < deadline and proc.poll() is None, "".join(chunks)[-2000:]
            time.sleep(0.05)
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(0.2)
        code = proc.wait(timeout=300)
    finally:
        proc.kill()
    time.sleep(0.2)
    text = "".join(chunks)
    assert code == 130 and "Traceback" not in text, text[-2000:]
    cached = sorted(p.name for p in runs.glob("rm*.npz"))
    if len(signals) == 2:
        assert ABORT_NOTE in text and not cached, text[-2000:]
    else:
        assert "stopped after the SFT model and reward model" in text and cached, text[-2000:]
