"""`jaxscale simulate <name>`: the simulator subcommands (argparse only; imports no jax).

Each command lives in its own `cli_<name>.py` module exposing `add_parser(subparsers)`; COMMANDS
lists them in the order `jaxscale simulate --help` shows.
"""

import argparse

from jaxscale.sim import (
    cli_batching,
    cli_json,
    cli_overlap,
    cli_param_server,
    cli_pipeline,
    cli_server,
    cli_speculative,
)

COMMANDS = (
    cli_server,
    cli_batching,
    cli_speculative,
    cli_json,
    cli_pipeline,
    cli_overlap,
    cli_param_server,
)  # help order


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="pure-Python simulators from the seeds (no jax)")
    sim_sub = p.add_subparsers(dest="sim_name", required=True, metavar="NAME")
    for command in COMMANDS:
        command.add_parser(sim_sub)
