"""`jaxscale calc <name>`: the calculator subcommands (argparse only; imports no jax).

Training-side calculators register in `cli_training.py`, serving/RL-side ones in
`cli_serving.py`; each module exposes `add_commands(subparsers)`.
"""

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calc", help="analytic calculators from the seeds (instant, no jax)")
    calc_sub = p.add_subparsers(dest="calc_name", required=True, metavar="NAME")
    from jaxscale.calc import cli_serving, cli_training

    cli_training.add_commands(calc_sub)
    cli_serving.add_commands(calc_sub)
