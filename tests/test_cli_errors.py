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
