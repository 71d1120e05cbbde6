"""The signal class of the CLI fuzz (tests/cli_fuzz.py): every long-running command -- train,
train under launch, rl, rlhf, serve -- stopped by Ctrl-C once, Ctrl-C twice and SIGTERM, as a
process, once it does the work a stop interrupts. Each case holds the command to its exit code,
no traceback and no crash, its files as they were (config.json) and a state that resumes: the
checkpoint a run stopped at, or the finished work it kept.

Ctrl-C once (or SIGTERM) stops at the next safe point and keeps what finished; twice aborts at
once, keeping what was finished before (a run's earlier checkpoints): both must resume. A
second Ctrl-C that arrives after the first stop's work is done ends the process quietly."""

import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest
from cli_fuzz import SIGNALS, check_stopped, interrupt
from rlhf_cache import TINY as RLHF_TINY
from rlhf_cache import seed_cache

from jaxscale.cli import main as cli_main
from jaxscale.train import checkpoint

pytestmark = pytest.mark.slow  # processes, each interrupted

TRAIN = ["--data", "markov", "--layers", "1", "--global-batch", "8", "--seq-len", "16"]
TRAIN += ["--no-progress", "--sample-tokens", "0"]
ENGINE = ["--max-num-seqs", "2", "--max-num-batched-tokens", "16", "--page-size", "16"]
ENGINE += ["--n-pages", "40"]


def _steps_logged(n: int):
    return lambda text: len(re.findall(r"^step +\d+ ", text, re.M)) >= n


def _train(work: Path, signals, launch: bool, capsys) -> None:
    """A run checkpointing every 4 steps, stopped after 10: exit 130, config.json unchanged,
    nothing left running, and `--resume` continues from the newest finished checkpoint (once:
    the step it stopped after, saved)."""
    run = work / "run"
    argv = ["train", *TRAIN, "--steps", "100000", "--ckpt-every", "4", "--log-every", "1"]
    argv += ["--run-dir", "run"]
    if launch:
        argv = ["launch", "-n", "2", "--", "jaxscale", *argv]
    config = {}

    def ready(text):
        if _steps_logged(10)(text):
            config["text"] = (run / "config.json").read_text()
            return True
        return False

    s = interrupt(argv, work, ready, signals)
    check_stopped(s, 130)
    assert (run / "config.json").read_text() == config["text"]
    size = (run / "metrics.jsonl").stat().st_size
    complete, _ = checkpoint.steps(run / "checkpoints")
    assert complete and complete[-1] >= 8, s.text[-2000:]  # the periodic ones at 4 and 8
    if signals == ("SIGINT",) or signals == ("SIGTERM",):
        assert f"checkpoint saved at {Path('run') / 'checkpoints'}/{complete[-1]}" in s.text
    assert (run / "metrics.jsonl").stat().st_size == size  # no process left training
    argv = ["train", *TRAIN, "--run-dir", str(run), "--resume", "--steps", str(complete[-1] + 1)]
    assert cli_main(argv) == 0
    assert f"resuming from step {complete[-1]}" in capsys.readouterr().out


def _rl(work: Path, signals, capsys) -> None:
    """PPO stopped inside its run: the finished chunks of updates written (their metrics and
    learning curve) and exit 130; an abort claims no results."""
    from jaxscale.rl.cli import ABORT_NOTE

    argv = ["rl", "ppo", "--total-steps", "2000000", "--num-envs", "8", "--eval-episodes", "0"]
    s = interrupt([*argv, "--out", "rl"], work, lambda t: "ppo cartpole [" in t, signals)
    check_stopped(s, 130)
    if ABORT_NOTE in s.text:
        assert len(signals) == 2 and "stopped after" not in s.text, s.text[-2000:]
        return
    done = re.search(r"stopped after (\d+) of (\d+) updates", s.text)
    assert done and 0 < int(done[1]) < int(done[2]), s.text[-2000:]
    records = [json.loads(x) for x in (work / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("update", 0) for r in records) == int(done[1])
    assert (work / "rl" / "learning_curve.png").stat().st_size > 0


def _rlhf(work: Path, signals, capsys) -> None:
    """RLHF (its SFT and reward models cached) stopped during its iterations: once, the policy
    saved after the iteration under way and `--resume` continuing from it; an abort (the second
    Ctrl-C while the first iteration compiles) saves nothing."""
    from jaxscale.rlhf.cli import ABORT_NOTE

    seed_cache(work / "runs")
    argv = ["rlhf", "--runs", "runs", "--out", "out", *RLHF_TINY]
    s = interrupt([*argv, "--iterations", "500"], work, lambda t: "iterations x" in t, signals)
    check_stopped(s, 130)
    if ABORT_NOTE in s.text:
        assert len(signals) == 2 and not (work / "out" / "policy" / "checkpoints").exists()
        return
    done = re.search(r"stopped after iteration (\d+) of 500, saved in", s.text)
    assert done, s.text[-2000:]
    k = int(done[1])
    argv = ["rlhf", "--runs", str(work / "runs"), "--out", str(work / "out"), *RLHF_TINY]
    assert cli_main([*argv, "--iterations", str(k + 1), "--resume", "--json"]) == 0
    assert f"resuming at iteration {k}" in capsys.readouterr().err


def _serve(work: Path, signals, capsys) -> None:
    """A server's stop is a normal end: exit 0 on Ctrl-C or SIGTERM, 130 on a second Ctrl-C
    (0 if the first had already ended it), and its port free again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"

    def ready(text):  # the banner, and uvicorn answering (before, a signal ends the start-up)
        if url not in text:
            return False
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/health").status == 200
        except OSError:
            return False

    s = interrupt(["serve", "--port", str(port), *ENGINE], work, ready, signals)
    check_stopped(s, 130 if len(signals) == 2 and s.rc == 130 else 0)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


COMMANDS = {
    "train": lambda w, sig, cap: _train(w, sig, False, cap),
    "launch train": lambda w, sig, cap: _train(w, sig, True, cap),
    "rl ppo": _rl,
    "rlhf": _rlhf,
    "serve": _serve,
}


# the run directory's signals run on both Python lines (they depend on Orbax's saves); the
# others on the first (docs/testing.md)
BOTH_LINES = ("train",)


# SIGTERM takes the first Ctrl-C's path in `stopping.stop_on_signal`, which train, rl and rlhf
# share: it runs on train, and on the commands that stop another way (launch forwards it to its
# processes, serve is uvicorn's); rl and rlhf get Ctrl-C once and twice
SIGTERM_TOO = ("train", "launch train", "serve")


@pytest.mark.parametrize(
    ("command", "signals"),
    [
        pytest.param(
            c,
            s,
            id=f"{c}-{'+'.join(s)}",
            marks=() if c in BOTH_LINES else pytest.mark.first_line,
        )
        for s in SIGNALS
        for c in COMMANDS
        if c in SIGTERM_TOO or s != ("SIGTERM",)
    ],
)
def test_a_stopped_command_exits_cleanly_and_leaves_a_state_that_resumes(
    command, signals, tmp_path, capsys
):
    COMMANDS[command](tmp_path / "work", signals, capsys)  # each command's own checks
    cores = [p.name for p in (tmp_path / "work").rglob("core*") if p.is_file()]
    assert not cores, f"a crash left {cores}"  # a dump the output may not have named
