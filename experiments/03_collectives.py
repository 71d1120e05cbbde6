"""Seed 002 ch3 "Collective Communication Operations" (ML Systems Infrastructure Tutorial).

    .venv/bin/python experiments/03_collectives.py [--operation all] [-w 4] [-d 100]

collective_cheatsheet.py: BEFORE/AFTER per rank for each operation, with the jax.lax built-in and
with the ppermute version (root 0; SPMD has no root-only receive, so gather/reduce off the root
show the built-in's full result and the ppermute version's zeros). distributed_mean.py's three
demos, the Try-It exercises (mean 2.5, argmax, ring all-reduce), a vocab-parallel softmax, and the
per-process volume table ("Performance Intuition") next to what the compiled ppermute versions send.
"""

import argparse
import sys
from collections import Counter

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

from jaxscale.lessons.collectives import CHEATSHEET_OPS  # noqa: E402


def cheatsheet(mesh, ops, w) -> None:
    from jaxscale.lessons import collectives as DC

    for op in ops:
        before = DC.cheatsheet_before(op, w)
        lax_after = DC.cheatsheet_after(mesh, op, "lax")
        mine = DC.cheatsheet_after(mesh, op, "ppermute")
        rooted = op in ("gather", "reduce")
        same = (lax_after[0] == mine[0]).all() if rooted else (lax_after == mine).all()
        root = " (root 0)" if op in ("broadcast", "scatter", "gather", "reduce") else ""
        print(f"\n{'=' * 50}\n {op.upper()}{root}")
        print(f"{'=' * 50}\nBEFORE:")
        for r in range(w):
            print(f"  Rank {r}: {before[r].tolist()}")
        print("AFTER (jax.lax built-in | ppermute version):")
        for r in range(w):
            print(f"  Rank {r}: {lax_after[r].tolist()} | {mine[r].tolist()}")
        print(f"  ppermute version agrees{' on the root' if rooted else ''}: {bool(same)}")


def volumes(mesh, w, d_elems=1024) -> None:
    import jax
    import jax.numpy as jnp

    from jaxscale.analysis import hlo
    from jaxscale.calc import comm
    from jaxscale.parallel import collectives as C

    d = d_elems * 4
    print(f"\nVOLUME PER PROCESS (seed 002 ch3), N={w}, D={d} bytes per process (f32)")
    print(f"{'op':<12}{'seed formula':>16}{'bytes':>10}   census of the ppermute version")
    cases = [  # (op, function, input length per device, formula text)
        ("broadcast", lambda a: C.broadcast(a, "x"), d_elems, "D (receive)"),
        ("scatter", lambda a: C.scatter(a, "x"), d_elems, "D/N (receive)"),
        ("all_gather", lambda a: C.ring_all_gather(a, "x"), d_elems, "D(N-1)"),
        ("all_reduce", lambda a: C.ring_all_reduce(a, "x"), d_elems, "2D(N-1)/N"),
    ]
    for op, fn, local, formula in cases:
        f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P("x")))
        found = Counter(
            (c.op, c.bytes_per_device)
            for c in hlo.collectives_of(f.lower(jnp.ones(w * local)).compile())
        )
        found = ", ".join(f"{k} x {op_} {b:,.0f} B" for (op_, b), k in sorted(found.items()))
        seed = comm.seed_volume_per_process(op, d, w)
        print(f"{op:<12}{formula:>16}{seed:>10,.0f}   {found}")
    print("ring all_reduce: every device sends each of the 2(N-1) permutes -> 2D(N-1)/N sent;")
    print("tree broadcast: log2 N permutes, each device receives D once; scatter: the root sends")
    print("N-1 chunks of D/N, each other device receives one.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operation", "-o", default="all", choices=[*CHEATSHEET_OPS, "all"])
    parser.add_argument("--world-size", "-w", type=int, default=4)
    parser.add_argument("--backend", "-b", default="gloo", choices=["gloo", "nccl"], help="ignored")
    parser.add_argument("--data-size", "-d", type=int, default=100, help="elements per rank")
    args = parser.parse_args()
    import jax
    import numpy as np

    from jaxscale.lessons import collectives as DC
    from jaxscale.lessons import ranks as demos

    w = args.world_size
    try:
        mesh = demos.line_mesh(w)
        if args.data_size < 2:
            raise ValueError(f"--data-size must be at least 2, got {args.data_size}")
    except ValueError as e:
        parser.error(str(e))
    print(f"COLLECTIVE OPERATIONS CHEATSHEET  world size {w}, operation {args.operation}")
    cheatsheet(mesh, CHEATSHEET_OPS if args.operation == "all" else [args.operation], w)

    print(f"\n{'=' * 60}\n DISTRIBUTED MEAN: Simple Approach (equal sizes)\n{'=' * 60}")
    m = DC.distributed_mean(mesh, args.data_size)
    for r in range(w):
        print(
            f"[Rank {r}] Local mean: {m.local_means[r]:.4f}, Distributed mean: {m.global_mean:.4f}"
        )
    print(f"{'=' * 60}\n DISTRIBUTED MEAN: Weighted Approach (unequal sizes)\n{'=' * 60}")
    m = DC.distributed_mean(mesh, args.data_size, weighted=True)
    for r in range(w):
        print(
            f"[Rank {r}] Size: {m.local_sizes[r]}, Local mean: {m.local_means[r]:.4f}, "
            f"Weighted global mean: {m.global_mean:.4f}"
        )
    print(f"  numpy over all valid data: {m.reference:.4f}")
    before, after = DC.gradient_sync(mesh)
    print(f"{'=' * 60}\n PRACTICAL EXAMPLE: Gradient Synchronization\n{'=' * 60}")
    for r in range(w):
        print(f"  [Rank {r}] gradient[0] before: {before[r, 0]:.4f}  after: {after[r, 0]:.4f}")

    print("\nTRY IT")
    print(f"  Ex1 mean of [1..{w}] = {DC.mean_of_values(mesh, np.arange(1, w + 1))}")
    values = np.random.default_rng(0).integers(0, 9, size=(w, 3)).astype(np.float32)
    best, owner = DC.distributed_argmax(mesh, values)
    print(f"  Ex2 argmax over {values.tolist()}: max {best} on rank {owner} (lowest rank on ties)")
    after_ring = DC.cheatsheet_after(mesh, "all_reduce", "ppermute")
    print(
        f"  Ex3 ring all-reduce of [r+1, 2(r+1)]: {after_ring[0].tolist()} "
        f"({2 * (w - 1)} ppermute steps of D/N)"
    )
    logits = np.random.default_rng(1).normal(size=(2, 4 * w)).astype(np.float32) * 5
    err = np.abs(DC.sharded_softmax(mesh, logits) - np.asarray(jax.nn.softmax(logits))).max()
    print(f"  distributed softmax (vocab split {w} ways) vs jax.nn.softmax: max diff {err:.1e}")
    volumes(mesh, w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
