"""The training workflow a user relies on: one run directory, checkpoints that never trip over
themselves, resume that says what it did, honest metrics, Ctrl-C during the compile, and the
same devices from every entry point. Ctrl-C and SIGTERM while training (saved, resumed) are the
signal fuzz's cases (tests/test_fuzz_signals.py), with launch's."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxscale.cli import main as cli_main

TINY = [
    "--data",
    "markov",
    "--layers",
    "1",
    "--global-batch",
    "8",
    "--seq-len",
    "16",
    "--no-progress",
    "--sample-tokens",
    "0",
]


def _train(capsys, *argv):
    rc = cli_main(["train", *TINY, *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a run, a resume and a plot; test_checkpoint's bitwise resume is fast
def test_a_run_directory_from_start_to_resumes(tmp_path, capsys):
    run = tmp_path / "runs" / "a"  # parents are created
    # --ckpt-every divides --steps: the final save is the step just saved, and that is fine
    rc, out, err = _train(
        capsys,
        "--run-dir",
        str(run),
        "--steps",
        "6",
        "--ckpt-every",
        "3",
        "--eval-every",
        "3",
        "--log-every",
        "1",
    )
    assert rc == 0, err
    assert {p.name for p in run.iterdir()} >= {
        "config.json",
        "metrics.jsonl",
        "checkpoints",
        "loss.png",
    }
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["3", "6"]
    saved = json.loads((run / "config.json").read_text())
    assert saved["train"]["steps"] == 6 and saved["model"]["n_layers"] == 1
    assert f"config: {json.dumps(saved)}" in out  # the resolved configuration, printed
    assert "step     6  eval loss" in out and "(optimum 1.1325)" in out  # markov's entropy rate

    records = _records(run)
    start, *rest = records
    assert start["event"] == "start" and start["devices"] == 8 and not start["resumed"]
    kinds = [("eval", r["step"]) if "eval_loss" in r else ("train", r["step"]) for r in rest]
    # every step once, each eval after the train record of the step before it, final eval kept
    assert kinds == [
        ("train", 0),
        ("train", 1),
        ("train", 2),
        ("eval", 3),
        ("train", 3),
        ("train", 4),
        ("train", 5),
        ("eval", 6),
    ]
    assert all(r["run_id"] == start["run_id"] and r["time_s"] >= 0 for r in records)
    assert "tokens_per_s" in rest[1] and "mfu" not in rest[1]  # no MFU on CPU: no known peak
    assert rest[-1]["optimal_loss"] == pytest.approx(1.1325, abs=1e-4)

    # a fresh run into a directory holding checkpoints is refused before anything compiles
    rc, _, err = _train(capsys, "--ckpt-dir", str(run / "checkpoints"), "--steps", "6")
    assert rc == 2 and "already holds checkpoints (up to step 6)" in err and "--resume" in err

    # resuming a finished run: nothing to train, its eval again, a new run id in the file
    rc, out, err = _train(capsys, "--run-dir", str(run), "--resume")
    assert rc == 0, err
    assert "resuming from step 6: the run is already complete" in out and "eval loss" in out
    again = _records(run)[len(records) :]
    assert again[0]["event"] == "start" and again[0]["resumed"]
    assert again[0]["run_id"] != start["run_id"] and [r["step"] for r in again] == [6, 6]

    # a stray step directory (no completion mark) is skipped, then replaced by the real step;
    # a compute-only change (remat, compute dtype) resumes the same parameters
    (run / "checkpoints" / "9").mkdir()
    rc, out, err = _train(
        capsys,
        "--run-dir",
        str(run),
        "--resume",
        "--steps",
        "9",
        "--remat",
        "--compute-dtype",
        "bfloat16",
    )
    assert rc == 0, err
    assert "ignoring incomplete checkpoint" in out and "resuming from step 6" in out
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir())[-1] == 9

    rc = cli_main(["plot", str(run), "--out", str(tmp_path / "p" / "curves.png")])
    assert rc == 0 and (tmp_path / "p" / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_resume_asks_for_a_directory_and_says_when_it_starts_fresh(tmp_path, capsys):
    rc, _, err = _train(capsys, "--steps", "2", "--resume")
    assert rc == 2 and "--resume needs a checkpoint directory" in err
    rc, out, _ = _train(
        capsys, "--steps", "2", "--resume", "--dry-run", "--ckpt-dir", str(tmp_path / "empty")
    )
    assert rc == 0 and "--resume: no checkpoint in" in out and "starting at step 0" in out
    assert not (tmp_path / "empty").exists()  # a dry run writes nothing


def test_inputs_that_would_fail_after_training_fail_before(tmp_path, capsys):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("x" * 200)  # its 5% eval split holds 10 bytes: no 17-byte window
    rc, _, err = _train(capsys, "--data", str(tiny), "--steps", "2")
    assert rc == 2 and "held-out (eval) split has 10 bytes" in err and "--seq-len" in err
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as exc:  # argparse refuses it: the flag's type checks it
        cli_main(["train", "--ckpt-dir", str(blocked / "ckpt"), "--steps", "2"])
    assert exc.value.code == 2
    assert "not a directory" in capsys.readouterr().err
    assert not list(tmp_path.glob("**/ckpt"))


def test_the_console_script_sees_the_same_8_devices_as_python_m(tmp_path):
    script = Path(sys.executable).parent / "jaxscale"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    env["JAX_PLATFORMS"] = "cpu"
    for cmd in ([str(script)], [sys.executable, "-m", "jaxscale"]):
        out = subprocess.run(
            [*cmd, "doctor", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout)["device_count"] == 8


def _reader(proc) -> list[str]:
    """Lines of the process's merged output as they arrive (a thread keeps reading)."""
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _wait_for(lines: list[str], text: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(text in line for line in lines):
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_is_acknowledged_at_once_and_a_second_one_exits_130_cleanly(tmp_path, capsys):
    """The first Ctrl-C, sent while the step compiles, is acknowledged before the compile ends;
    the second exits 130 at once, without a traceback or a segfault (before: an exception raised
    into the compile, then exit 139), and leaves config.json as it was."""
    from jaxscale.train.loop import ABORT_NOTE, STOP_NOTE

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "jaxscale", "train", *TINY, "--steps", "300"]
    cmd += ["--run-dir", str(run)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = _reader(proc)
    try:
        assert _wait_for(lines, "config: ", 120), "".join(lines)[-2000:]  # checked
        deadline = time.monotonic() + 10
        while not (run / "config.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        config = (run / "config.json").read_text()
        time.sleep(0.3)  # into the first compile
        proc.send_signal(signal.SIGINT)
        assert _wait_for(lines, STOP_NOTE, 10), "".join(lines)[-2000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 130, "".join(lines)[-2000:]
    finally:
        proc.kill()
    out = "".join(lines)
    assert ABORT_NOTE in out and "Traceback" not in out, out[-2000:]
    assert (run / "config.json").read_text() == config
    # nothing finished, nothing saved: --resume starts the run over (config.json was kept)
    rc, _, err = _train(capsys, "--steps", "2", "--run-dir", str(run), "--resume")
    assert rc == 0, err[-2000:]


def test_a_refused_resume_writes_nothing(tmp_path, capsys):
    """Resuming with another model is refused before anything is written: before, config.json
    was overwritten with the refused settings and every later --resume failed."""
    run = tmp_path / "run"
    assert _train(capsys, "--steps", "2", "--run-dir", str(run))[0] == 0
    config = (run / "config.json").read_text()
    metrics = (run / "metrics.jsonl").read_text()
    rc, _, err = _train(
        capsys, "--steps", "4", "--run-dir", str(run), "--resume", "--d-model", "128"
    )
    assert rc == 2 and "different model" in err and '"d_model": [64, 128]' in err, err
    assert (run / "config.json").read_text() == config
    assert (run / "metrics.jsonl").read_text() == metrics
    rc, out, _ = _train(capsys, "--steps", "3", "--run-dir", str(run), "--resume")
    assert rc == 0 and "resuming from step 2" in out


def test_a_schedule_alone_runs_with_working_defaults(capsys):
    """`--schedule interleaved` alone on pp=2 (before: refused for --virtual-stages, then for
    --microbatches), with a tensor axis the mesh names (before: refused until --strategy
    manual:dp+tp was spelled out)."""
    mesh = ["--mesh", "pp=2,dp=2,tp=2", "--layers", "4", "--dry-run"]
    rc, out, err = _train(capsys, *mesh, "--schedule", "interleaved")
    assert rc == 0, err
    assert "run: manual:dp+tp+interleaved(M=2 v=2) on pp=2,dp=2,tp=2" in out
    assert "the parts the mesh implies" in out
    rc, out, err = _train(capsys, *mesh, "--schedule", "1f1b", "--keep-checkpoints", "5")
    assert rc == 0 and "manual:dp+tp+1f1b(M=2)" in out, err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--ckpt-dir", "/proc/x"], "cannot create /proc/x"),  # os.access says yes (root)
        (["--metrics", "/proc/x/m.jsonl"], "cannot create /proc/x/m.jsonl"),
        (["--run-dir", "/proc/x"], "cannot create /proc/x"),
    ],
)
def test_unwritable_outputs_are_refused_before_anything_runs(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:  # the flag's type tries a probe file
        cli_main(["train", *TINY, *flags, "--steps", "2", "--dry-run"])
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("blocked", ["checkpoints", "metrics.jsonl", "loss.png"])
def test_the_paths_a_run_directory_implies_are_checked_in_a_dry_run(tmp_path, capsys, blocked):
    """RUN_DIR/checkpoints a file (or metrics.jsonl, loss.png a directory): before, --dry-run
    said OK and the run failed after training."""
    run = tmp_path / "run"
    run.mkdir()
    if blocked == "checkpoints":
        (run / blocked).write_text("")
    else:
        (run / blocked).mkdir()
    rc, out, err = _train(capsys, "--out", str(run), "--steps", "2", "--dry-run")
    assert rc == 2 and f"--out {run}: " in err and blocked in err, (out, err)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model": {"d_model": "big"}}, 'model.d_model: expected an integer, got "big"'),
        ({"train": {"lr": "x"}}, 'train.lr: expected a finite number, got "x"'),
        ({"train": {"steps": True}}, "train.steps: expected an integer, got true"),
        ({"run": {"mesh": 5}}, "run.mesh: expected a string, got 5"),
        ({"run": {"strategy": None}}, "run.strategy: expected a string, got null"),
        ({"run": {"data": 42}}, "run.data: expected a string, got 42"),
        ({"model": "tiny"}, 'model: expected an object of fields, got "tiny"'),
        ({"model": {}, "extra": 1}, "unknown section(s) ['extra']"),
        ({"model": {"width": 3}}, "model: unknown field 'width'"),
        ({"model": {"mlp": "relu2"}}, "model.mlp: 'relu2' is not one of"),
        ({"train": {"steps": -1}}, "steps must be"),
        # the run section's ranges and choices, as its flags take them (before: 0 microbatches
        # meant the default, and an unknown schedule failed later)
        ({"run": {"microbatches": 0}}, "run.microbatches: expected an integer >= 1, got 0"),
        ({"run": {"virtual_stages": -1}}, "run.virtual_stages: expected an integer >= 1"),
        ({"run": {"sample_tokens": -5}}, "run.sample_tokens: expected an integer >= 0"),
        ({"run": {"schedule": "zigzag"}}, "run.schedule: 'zigzag' is not one of gpipe"),
        ({"model": {"remat": "every:0"}}, "remat must be one of none, block, dots, offload"),
    ],
)
def test_a_config_file_is_checked_field_by_field(tmp_path, capsys, config, message):
    """Each wrong value is one line naming the key (before: tracebacks, silent acceptance of
    `"steps": true`, or "unknown model field(s) ['i', 'n', 't', 'y']")."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    rc, _, err = _train(capsys, "--config", str(path), "--dry-run")
    assert rc == 2 and f"--config {path}: " in err and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("written, policy", [(True, "block"), (False, "none")])
def test_a_config_from_when_remat_was_a_switch_still_loads(tmp_path, capsys, written, policy):
    """Run directories saved before the remat policies hold `"remat": true` or false."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": {"remat": written}}))
    rc, out, err = _train(capsys, "--config", str(path), "--dry-run")
    assert rc == 0 and f'"remat": "{policy}"' in out, err


def test_a_sample_longer_than_the_context_says_where_it_stops(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    argv = ["--data", str(corpus), "--layers", "1", "--seq-len", "16", "--dry-run"]
    rc, out, err = _train(capsys, *argv, "--sample-tokens", "100000")
    assert rc == 0, err
    assert "--sample-tokens 100000: the sample stops at 124 tokens" in out  # 128 - len("def ")


def test_no_progress_hides_the_bar_not_the_losses(capsys):
    rc, out, err = _train(capsys, "--steps", "3", "--log-every", "1")  # TINY has --no-progress
    assert rc == 0, err
    assert [line.split()[:3] for line in out.splitlines() if "  loss " in line] == [
        ["step", "0", "loss"],
        ["step", "1", "loss"],
        ["step", "2", "loss"],
    ]
