"""The one error path of every command (`cliutil.guarded`): bad input -> one line on stderr,
`jaxscale <command>: error: <message>`, and exit code 2; other errors are not swallowed."""

import argparse

import pytest

from jaxscale.cliutil import guarded


class InputError(RuntimeError):  # a user-input error that is not a ValueError (a CheckpointError)
    pass


def _raising(error):
    def handler(args):
        raise error

    return handler


@pytest.mark.parametrize("error", [ValueError("bad --x"), InputError("bad --x")])
def test_bad_input_is_one_line_and_exit_2(error, capsys):
    args = argparse.Namespace(command="train")
    assert guarded(_raising(error), InputError)(args) == 2
    assert capsys.readouterr().err == "jaxscale train: error: bad --x\n"


def test_other_errors_and_the_return_code_pass_through(capsys):
    args = argparse.Namespace(command="calc", calc_name="kv")
    with pytest.raises(InputError):  # not named: not bad input
        guarded(_raising(InputError("boom")))(args)
    assert guarded(lambda a: 3, InputError)(args) == 3
    assert guarded(_raising(ValueError("no")))(args) == 2
    assert capsys.readouterr().err == "jaxscale calc kv: error: no\n"


@pytest.mark.parametrize(
    "command",
    [
        "train --steps 1",
        "rl ppo",
        "rlhf",
        "bench collectives",
        "bench pipeline",
        "bench serve",
        "plot runs/none/metrics.jsonl",
    ],
)
@pytest.mark.parametrize("kind", ["/proc", "under a file"])
def test_an_output_that_cannot_be_written_is_refused_before_anything_runs(
    command, kind, tmp_path, capsys
):
    """`--out` where nothing can be created (under /proc, or under a regular file): one line
    naming --out, exit 2, before anything compiles (the issue's report: found only after the
    run, for `train --ckpt-dir /proc/x` and `rl ppo --out /proc/x`)."""
    import shlex

    from jaxscale.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    out = "/proc/x/y" if kind == "/proc" else str(blocker / "y")
    try:
        code = main([*shlex.split(command), "--out", out])
    except SystemExit as e:  # argparse refuses the flag's value itself
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "--out" in err and "Traceback" not in err, err[-1500:]
