"""The command-line surface, read from the real argparse tree: every flag explained once, every
command with an example, and no help text that points outside the repository (the seeds are not
shipped: help cites a seed by name and chapter, or docs/seed-notes.md, never a file and line)."""

import argparse
import re

import pytest
from cli_fuzz import commands

from jaxscale.cli import build_parser, main

LEAVES = list(commands())
OUTSIDE = re.compile(r"shared/|seeds?/0\d\d_|\bL\d{2,}(-\d+)?\b")


def _flags(parser):
    return [
        a
        for a in parser._actions
        if a.option_strings
        and a.help != argparse.SUPPRESS
        and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    ]


@pytest.mark.parametrize("words, parser", LEAVES, ids=[" ".join(w) for w, _ in LEAVES])
def test_every_flag_has_help_once_and_the_command_an_example(words, parser):
    for action in _flags(parser):
        flag = action.option_strings[-1]
        assert action.help and action.help.strip(), f"{' '.join(words)} {flag}: no help"
        assert action.help.count("default") <= 1, f"{flag}: the default twice: {action.help!r}"
    text = f"{parser.description or ''}\n{parser.epilog or ''}"
    assert f"jaxscale {words[0]}" in text, f"jaxscale {' '.join(words)}: no example command"


@pytest.mark.parametrize("words, parser", LEAVES, ids=[" ".join(w) for w, _ in LEAVES])
def test_help_cites_nothing_outside_the_repository(words, parser, capsys):
    with pytest.raises(SystemExit):
        main([*words, "--help"])
    shown = capsys.readouterr().out
    assert not OUTSIDE.search(shown), f"jaxscale {' '.join(words)} --help: {OUTSIDE.search(shown)}"


def test_version_and_the_tree_is_walked():
    assert len(LEAVES) > 20 and ("train",) in [w for w, _ in LEAVES]
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0
