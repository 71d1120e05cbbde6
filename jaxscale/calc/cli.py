"""`jaxscale calc <name>`: the calculator subcommands (argparse only; imports no jax).

Each command lives in its own module under calc/commands/ exposing `add_parser(subparsers)`;
COMMANDS lists them in the order `jaxscale calc --help` shows.
"""

import argparse

from jaxscale.calc.commands import (
    chinchilla,
    comm,
    flops,
    gae,
    inference,
    kv,
    memory,
    moe,
    prefix,
    reward,
    rl,
    scaling,
    serving,
    time,
)

COMMANDS = (
    memory,
    flops,
    chinchilla,
    moe,
    time,
    comm,
    scaling,
    inference,
    serving,
    kv,
    prefix,
    rl,
    gae,
    reward,
)  # help order


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calc", help="analytic calculators from the seeds (instant, no jax)")
    calc_sub = p.add_subparsers(dest="calc_name", required=True, metavar="NAME")
    for command in COMMANDS:
        command.add_parser(calc_sub)
