"""The README's commands work as typed: every `jaxscale ...` line of its ```bash blocks runs, in
order, in one fresh working directory (so a resume finds the run before it), with small step
counts. Commands that would spend minutes compiling many strategies (`bench`, `verify`) run with
`--dry-run`, which checks every argument, and so does the training inside `launch` (the
processes still start and join; tests/train/test_multiprocess.py trains through them).
"""

import re
import shlex
from pathlib import Path

import pytest

from jaxscale.cli import main as cli_main

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands() -> list[list[str]]:
    text = README.read_text()
    lines = [
        line
        for block in re.findall(r"```bash\n(.*?)```", text, re.S)
        for line in block.splitlines()
    ]
    commands = []
    for line in lines:
        line = line.split("  #")[0].strip()  # a trailing comment
        if line.startswith("jaxscale "):
            commands.append(shlex.split(line)[1:])
    return commands


def small(argv: list[str]) -> list[str]:
    """The command with small step counts, or checked but not compiled."""
    argv = list(argv)
    if "--steps" in argv:
        argv[argv.index("--steps") + 1] = "2"
    if argv[0] in ("bench", "verify", "rlhf") or (argv[0] == "launch" and "train" in argv):
        argv.append("--dry-run")
    if argv[0] == "train":
        argv += ["--no-progress", "--sample-tokens", "4"]
    return argv


def test_the_readme_has_commands_to_run():
    words = [c[0] for c in readme_commands()]
    assert {"train", "bench", "verify", "plot", "launch"} <= set(words), words


@pytest.mark.slow
@pytest.mark.first_line  # the line `make` runs (python3); each command's path is in the fast suite
def test_every_readme_command_runs_as_typed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in readme_commands():
        if "--target" in argv and _aot_unavailable():
            continue  # the TPU compile needs the tpu-aot extra (CI installs it)
        rc = cli_main(small(argv))
        out = capsys.readouterr()
        assert rc == 0, f"jaxscale {' '.join(argv)}: exit {rc}\n{out.err[-2000:]}"
    assert (tmp_path / "runs" / "a" / "loss.png").exists()  # `jaxscale plot runs/a` drew it


def _aot_unavailable() -> bool:
    from jaxscale.analysis import aot

    return aot.aot_unavailable_reason() is not None


@pytest.mark.parametrize(
    "argv",
    [["train", "--mesh", "dp=3", "--dry-run"], ["train", "--mesh", "pp=2,dp=4", "--dry-run"]],
)
def test_the_errors_the_readme_quotes_are_the_ones_printed(argv, capsys):
    assert cli_main(argv) == 2
    message = capsys.readouterr().err.strip().split("error: ", 1)[1]
    quoted = [" ".join(q.split()) for q in re.findall(r"`([^`]*)`", README.read_text())]
    assert any(len(q) >= 20 and q in message for q in quoted), message
