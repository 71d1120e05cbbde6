"""`jaxscale calc <name>`: the calculator subcommands (argparse only; imports no jax).

Each training-side module (cli_training_*.py) exposes `add_parser(calc_sub)`; the serving/RL-side
ones register through `cli_serving.add_commands(calc_sub)`.
"""

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calc", help="analytic calculators from the seeds (instant, no jax)")
    calc_sub = p.add_subparsers(dest="calc_name", required=True, metavar="NAME")
    from jaxscale.calc import (
        cli_gae,
        cli_reward,
        cli_serving,
        cli_training_comm,
        cli_training_compute,
        cli_training_memory,
        cli_training_scaling,
        cli_training_time,
    )

    # memory; flops, chinchilla, moe; time; comm; scaling
    for module in (
        cli_training_memory,
        cli_training_compute,
        cli_training_time,
        cli_training_comm,
        cli_training_scaling,
    ):
        module.add_parser(calc_sub)
    cli_serving.add_commands(calc_sub)
    cli_gae.add_parser(calc_sub)  # gae (seed 002 ch. 12)
    cli_reward.add_parser(calc_sub)  # reward (seed 002 ch. 13)
