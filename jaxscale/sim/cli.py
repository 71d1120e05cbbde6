"""`jaxscale simulate <name>`: the simulator subcommands (argparse only; imports no jax).

Each command lives in its own `cli_<name>.py` module exposing `add_command(subparsers)`.
"""

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="pure-Python simulators from the seeds (no jax)")
    sim_sub = p.add_subparsers(dest="sim_name", required=True, metavar="NAME")
    from jaxscale.sim import (
        cli_batching,
        cli_overlap,
        cli_param_server,
        cli_pipeline,
        cli_speculative,
    )

    for module in (cli_batching, cli_speculative, cli_pipeline, cli_overlap, cli_param_server):
        module.add_command(sim_sub)


def guarded(handler):
    """Turn a ValueError from the library into a one-line error and exit code 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ValueError as err:
            print(f"jaxscale simulate {args.sim_name}: error: {err}", file=sys.stderr)
            return 2

    return run
