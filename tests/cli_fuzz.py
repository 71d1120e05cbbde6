"""The CLI fuzz harness, shared by the fuzz suites (tests/test_fuzz_*.py).

It walks the real argparse tree (`jaxscale.cli.build_parser`), so a command added later is fuzzed
without anyone listing it, feeds every value-taking flag hostile values by the kind of value it
takes, runs the command in-process in an empty working directory, and holds every outcome to one
contract: exit 0 (the value was fine) or exit 2 with exactly one error line that names the flag;
never a traceback, never exit 1, and nothing written when the input was refused.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
from dataclasses import dataclass
from pathlib import Path

from jaxscale.cli import build_parser, main

NUMBERS = (
    "0",
    "-1",
    "-0.5",
    "1.5",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "99999999999999999999",
    "",
    "abc",
)
TEXT = ("", "nope", "-1", "\u00e9\u00e9")
# {missing}: a directory that does not exist; {dir}: an existing directory (a file was wanted);
# {file}: an existing regular file (a directory was wanted); /proc/x: a place nobody can write
PATHS = ("", "{missing}/out.png", "{dir}", "{file}/out.png", "/proc/x/out")
PATH_WORDS = ("plot", "out", "metrics", "ckpt_dir", "run_dir", "config", "data", "path", "file")


def commands(parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()):
    """(command words, its parser) for every leaf command of the tree."""
    parser = parser or build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, sub in subs[0].choices.items():
        yield from commands(sub, (*prefix, name))


def value_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The optional flags that take a value (not --help, switches, or hidden aliases, which are
    another spelling of a flag that is fuzzed itself)."""
    return [
        a
        for a in parser._actions
        if a.option_strings
        and a.nargs != 0
        and a.help != argparse.SUPPRESS
        and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    ]


def kind(action: argparse.Action) -> str:
    if action.choices is not None:
        return "choice"
    if any(word in action.dest for word in PATH_WORDS):
        return "path"
    if action.type in (int, float) or getattr(action.type, "__name__", "") in NUMERIC_TYPES:
        return "number"
    return "text"


NUMERIC_TYPES = (
    "positive_int",
    "positive_float",
    "non_negative_float",
    "fraction",
    "probability",
    "parse_count",
    "non_negative_int",
    "finite_float",
    "_int",
)


def hostile(action: argparse.Action) -> tuple[str, ...]:
    return {"number": NUMBERS, "path": PATHS, "choice": TEXT, "text": TEXT}[kind(action)]


@dataclass(frozen=True)
class Outcome:
    argv: tuple[str, ...]
    rc: int
    out: str
    err: str
    new_files: tuple[str, ...]


def run(argv, workdir: Path, files: dict[str, str] | None = None) -> Outcome:
    """`jaxscale <argv>` in-process with `workdir` as the working directory ({missing}, {dir} and
    {file} in argv are filled with paths under a scratch folder beside it; `files` adds named
    files there, e.g. {"{metrics}": "<json lines>"})."""
    scratch = workdir.parent / f"{workdir.name}-scratch"
    scratch.mkdir(exist_ok=True)
    (scratch / "a_dir").mkdir(exist_ok=True)
    (scratch / "a_file").write_text("x")
    fill = {
        "{missing}": str(scratch / "missing" / "deeper"),
        "{dir}": str(scratch / "a_dir"),
        "{file}": str(scratch / "a_file"),
    }
    for key, text in (files or {}).items():
        path = scratch / key.strip("{}")
        path.write_text(text)
        fill[key] = str(path)
    argv = tuple(_fill(a, fill) for a in argv)
    workdir.mkdir(exist_ok=True)
    before = set(_tree(workdir)) | set(_tree(scratch))
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv), parser=_parser())
            except SystemExit as e:  # argparse's own errors
                rc = e.code if isinstance(e.code, int) else 1
            except Exception as e:  # noqa: BLE001 -- an escaped exception is the finding
                rc, err = 1, io.StringIO(f"Traceback (escaped): {type(e).__name__}: {e}")
    finally:
        os.chdir(cwd)
    new = sorted((set(_tree(workdir)) | set(_tree(scratch))) - before)
    return Outcome(argv, rc, out.getvalue(), err.getvalue(), tuple(new))


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """One parser for every case (argparse keeps no state between parses)."""
    return build_parser()


def _fill(arg: str, fill: dict) -> str:
    for key, value in fill.items():
        arg = arg.replace(key, value)
    return arg


def _tree(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*")]


def check(o: Outcome, flags: tuple[str, ...], *, must_fail: bool = False) -> None:
    """The contract (module docstring). `flags`: the option strings of the flag under test."""
    where = f"jaxscale {' '.join(o.argv)}"
    assert "Traceback" not in o.out + o.err, f"{where}: traceback\n{o.err[-2000:]}"
    assert o.rc in (0, 2), f"{where}: exit {o.rc}\n{o.err[-2000:]}"
    if must_fail:
        assert o.rc == 2, f"{where}: accepted a value it must refuse\n{o.out[-500:]}"
    if o.rc == 2:
        errors = [line for line in o.err.splitlines() if "error" in line.lower()]
        assert len(errors) == 1, f"{where}: expected one error line, got\n{o.err}"
        assert any(f in errors[0] for f in flags), f"{where}: error names no flag {flags}: {errors}"
        assert not o.new_files, f"{where}: refused, yet wrote {o.new_files}"


# The signal class: a long-running command stopped from the keyboard or by a scheduler.
# The first Ctrl-C (or SIGTERM) stops at the next safe point and keeps what finished; a second
# Ctrl-C aborts at once. Either way: the command's exit code, no traceback, no crash, and what it
# left can be resumed (each command's own check, in tests/test_fuzz_signals.py).
SIGNALS = (("SIGINT",), ("SIGINT", "SIGINT"), ("SIGTERM",))
CRASHES = ("Traceback", "Segmentation fault", "Fatal Python error", "core dumped")
# Ctrl-C as at a terminal: a suite started from a script's background job inherits SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler in the child. The command is
# exec'd with SIGINT at its default (a preexec_fn would fork the multithreaded test process).
DEFAULT_SIGINT_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@dataclass(frozen=True)
class Stopped:
    argv: tuple[str, ...]
    signals: tuple[str, ...]
    rc: int
    text: str  # stdout and stderr, merged as a terminal shows them


def interrupt(argv, workdir: Path, ready, signals, *, gap_s=0.2, timeout_s=300.0) -> Stopped:
    """`jaxscale <argv>` as a process in `workdir`, sent `signals` (names, `gap_s` apart: two
    sent at once may arrive as one) once `ready(text so far)` holds; its exit code and output."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", DEFAULT_SIGINT_EXEC, "-m", "jaxscale", *argv]
    proc = subprocess.Popen(
        cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    chunks: list[str] = []  # what is there, as it comes: a progress bar's line may not end
    fd = proc.stdout.fileno()
    reader = threading.Thread(
        target=lambda: chunks.extend(
            b.decode(errors="replace") for b in iter(lambda: os.read(fd, 4096), b"")
        ),
        daemon=True,
    )
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not ready("".join(chunks)):
            assert proc.poll() is None, f"ended before it was ready:\n{''.join(chunks)[-2000:]}"
            assert time.monotonic() < deadline, f"not ready in time:\n{''.join(chunks)[-2000:]}"
            time.sleep(0.05)
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(gap_s)
        rc = proc.wait(timeout=timeout_s)
    finally:
        proc.kill()
    reader.join(timeout=5)
    return Stopped(tuple(argv), tuple(signals), rc, "".join(chunks))


def check_stopped(s: Stopped, rc: int) -> None:
    """The contract of a stop: exit code `rc`, no traceback or crash in the output."""
    where = f"jaxscale {' '.join(s.argv)} <- {'+'.join(s.signals)}"
    assert s.rc == rc, f"{where}: exit {s.rc}, not {rc}\n{s.text[-2000:]}"
    crash = next((c for c in CRASHES if c in s.text), None)
    assert crash is None, f"{where}: {crash}\n{s.text[-3000:]}"
