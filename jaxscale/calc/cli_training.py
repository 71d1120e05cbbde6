"""`jaxscale calc memory|flops|chinchilla|moe|time|comm|scaling`: the training-side calculators.

Each command lives in its own module (cli_training_*.py) with an `add_parser(calc_sub)`; this
module only wires them into the `jaxscale calc` group. Nothing here imports jax.
"""

from jaxscale.calc import (
    cli_training_comm,
    cli_training_compute,
    cli_training_memory,
    cli_training_scaling,
    cli_training_time,
)


def add_commands(calc_sub) -> None:
    cli_training_memory.add_parser(calc_sub)
    cli_training_compute.add_parsers(calc_sub)  # flops, chinchilla, moe
    cli_training_time.add_parser(calc_sub)
    cli_training_comm.add_parser(calc_sub)
    cli_training_scaling.add_parser(calc_sub)
