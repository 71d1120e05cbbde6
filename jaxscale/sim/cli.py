"""`jaxscale simulate <name>`: the simulator subcommands (argparse only; imports no jax).

Each command lives in its own `cli_<name>.py` module exposing `add_command(subparsers)`.
"""

import argparse
import importlib

COMMANDS = (
    "server",
    "batching",
    "speculative",
    "json",
    "pipeline",
    "overlap",
    "param_server",
)  # help order


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="pure-Python simulators from the seeds (no jax)")
    sim_sub = p.add_subparsers(dest="sim_name", required=True, metavar="NAME")
    for name in COMMANDS:
        importlib.import_module(f"jaxscale.sim.cli_{name}").add_command(sim_sub)
