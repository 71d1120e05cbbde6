"""`python -m jaxscale`: the process edge where the simulated device count is decided.

Library modules never set the device count. Here, before jax initialises, an unset
JAX_NUM_CPU_DEVICES defaults to 8 so that the CPU backend shows 8 simulated devices; on a GPU
or TPU host the accelerator backend is used and this variable only affects the CPU backend.
"""

import os
import sys


def main() -> int:
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
    from jaxscale.launch import maybe_initialize_distributed

    maybe_initialize_distributed()  # joins `jaxscale launch`'s processes; no-op otherwise
    from jaxscale.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
