"""Seed 002 ch1 "Your First Distributed Program" (ML Systems Infrastructure Tutorial).

    .venv/bin/python experiments/01_hello_distributed.py [--world-size 4] [--backend gloo]
    .venv/bin/python -m jaxscale launch -n 2 -- python experiments/01_hello_distributed.py -w 8

hello_distributed.py in SPMD form: every rank builds [10r, 10r+1], all_gathers it and psums its
rank (expected W(W-1)/2: 6 for W=4, 28 for W=8), then the Try-It exercises: 8 ranks, even/odd
roles, and the environment variables a launcher sets. Under `jaxscale launch` the same program
runs in several processes (jax.distributed over loopback, gloo CPU collectives).
"""

import argparse
import os
import sys

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

from jaxscale.launch import maybe_initialize_distributed  # noqa: E402

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", "-w", type=int, default=None, help="ranks (default 4)")
    parser.add_argument(
        "--backend",
        "-b",
        default="gloo",
        choices=["gloo", "nccl"],
        help="the seed's torch backend; under JAX the platform decides",
    )
    args = parser.parse_args()
    maybe_initialize_distributed()  # joins `jaxscale launch`'s processes; no-op otherwise
    import jax

    from jaxscale.lessons.ranks import hello, line_mesh

    n, procs = jax.device_count(), jax.process_count()
    w = args.world_size or (4 if procs == 1 else n)
    if w < 1 or w > n or (procs > 1 and w != n):
        parser.error(f"--world-size {w}: {n} devices in {procs} process(es) (multi-process: all)")
    lead = jax.process_index() == 0
    if lead:
        print("=" * 50 + "\n YOUR FIRST DISTRIBUTED PROGRAM\n" + "=" * 50)
        print(f"World size: {w}")
        platform = jax.default_backend()
        print(f"Backend: --backend {args.backend} is torch's; XLA platform here: {platform}")
        print("  (cross-process CPU collectives use gloo; on GPU XLA calls NCCL)")
        print(f"Processes: {procs} (devices per process: {jax.local_device_count()})")
        print("=" * 50 + "\n")
    mesh = line_mesh(w)
    result = hello(mesh)
    for r, d in enumerate(mesh.devices.flat):
        if d.process_index == jax.process_index():
            print(f"[Rank {r}/{w}] Hello! process={d.process_index}, device={d}")
            print(f"[Rank {r}] My tensor: {[10.0 * r, 10.0 * r + 1]}")
    if lead:
        print("\n" + "=" * 50 + "\nall_gather results (collected on all ranks):")
        for i, row in enumerate(result.gathered):
            print(f"  From rank {i}: {row.tolist()}")
        print("=" * 50 + "\n")
        print(f"all_reduce (SUM) result: {result.rank_sum}")
        print(f"  Expected: 0 + 1 + ... + {w - 1} = {result.expected_sum}")
        print(f"  Correct: {result.correct}\n")
        print("I am process 0 - the 'coordinator' (jax.process_index() == 0)")
        print("Common responsibilities of process 0:")
        print("  - Logging and printing results")
        print("  - Saving checkpoints (orbax writes sharded checkpoints from every process)")
        print("  - Orchestrating distributed operations")
        print("\nTry it: even/odd roles (Ex2)")
        for r in range(w):
            print(f"  [Rank {r}] I handle {'even' if r % 2 == 0 else 'odd'} data!")
        print("\nTry it: the launcher's environment (Ex3)")
        for name in ENV_VARS:
            print(f"  {name:<22} {os.environ.get(name, 'not set')}")
        for name in ("JAXSCALE_COORDINATOR", "JAXSCALE_NUM_PROCESSES", "JAXSCALE_PROCESS_ID"):
            print(f"  {name:<22} {os.environ.get(name, 'not set')}")
        print(f"  jax.process_index()    {jax.process_index()} of {procs}")
        print("\nAll processes completed successfully!" if result.correct else "\nWRONG RESULT")
    return 0 if result.correct else 1


if __name__ == "__main__":
    sys.exit(main())
