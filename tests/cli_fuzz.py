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
