"""--help of every `calc`, `simulate` and `advise` command, beyond tests/test_cli_surface.py (help
for every flag, an example, no citations outside the repository): each default stated once as
printed, choices listed, and the example parses and uses the canonical flag names."""

import argparse
import shlex

import pytest
from cli_fuzz import commands

from jaxscale.cli import build_parser

COMMANDS = [(w, p) for w, p in commands() if w[0] in ("calc", "simulate", "advise")]


@pytest.mark.parametrize("words, parser", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_help(words, parser):
    text = parser.format_help()
    for action in parser._actions:
        if action.option_strings and action.help not in (None, argparse.SUPPRESS):
            entry = parser._get_formatter()._expand_help(action)  # with the appended default
            assert entry.count("default") <= 1, f"{action.option_strings[0]}: {entry}"
            assert all(str(choice) in text for choice in action.choices or ())
    assert "(default: None)" not in text
    argv = shlex.split(text.split("example:\n", 1)[1].strip())
    assert argv[: 1 + len(words)] == ["jaxscale", *words]
    assert build_parser().parse_args(argv[1:]).func  # the example parses
    hidden = {s for a in parser._actions if a.help == argparse.SUPPRESS for s in a.option_strings}
    assert not hidden & set(argv), f"the example uses an old spelling: {hidden & set(argv)}"
