"""`jaxscale hello`: the seed ch1 program (seed 002 ch1 hello_distributed.py), an
all_gather of [10r, 10r+1] and a psum of the ranks, on one process or across `jaxscale launch`'s.
"""

import json

from jaxscale.launch import maybe_initialize_distributed


def main(args) -> int:
    maybe_initialize_distributed()
    import jax

    from jaxscale.lessons.ranks import hello, line_mesh

    n = jax.device_count()
    w = args.world_size or n
    if w < 1 or w > n or (jax.process_count() > 1 and w != n):
        args.parser.error(
            f"--world-size {w}: this run has {n} devices in {jax.process_count()} process(es)"
            + ("; across processes the world is every device" if jax.process_count() > 1 else "")
        )
    mesh = line_mesh(w)
    result = hello(mesh)
    me = jax.process_index()
    lead = me == 0
    for r, d in enumerate(mesh.devices.flat):
        if d.process_index == me and not args.json:
            role = "even" if r % 2 == 0 else "odd"
            print(f"[Rank {r}/{w}] Hello! process {me}, device {d} - I handle {role} data!")
    if lead and args.json:
        print(
            json.dumps(
                {
                    "world_size": w,
                    "processes": jax.process_count(),
                    "backend": jax.default_backend(),
                    "gathered": result.gathered.tolist(),
                    "rank_sum": result.rank_sum,
                    "expected_sum": result.expected_sum,
                    "correct": result.correct,
                }
            )
        )
    elif lead:
        procs, backend = jax.process_count(), jax.default_backend()
        print(f"\nworld size {w} on {procs} process(es), backend {backend}")
        print("all_gather results (collected on all ranks):")
        for i, row in enumerate(result.gathered):
            print(f"  From rank {i}: {row.tolist()}")
        print(f"all_reduce (SUM) of ranks: {result.rank_sum}")
        print(f"  Expected: 0 + 1 + ... + {w - 1} = {result.expected_sum}")
        print(f"  Correct: {result.correct}")
    return 0 if result.correct else 1


def add_parser(sub) -> None:
    h = sub.add_parser(
        "hello",
        help="seed ch1: all_gather of [10r, 10r+1] and psum of ranks",
        description="The seed's first distributed program: every rank "
        "all-gathers [10r, 10r+1] and sums its rank over all ranks.",
        epilog="examples: jaxscale hello -w 4; jaxscale launch -n 2 -- jaxscale hello",
    )
    h.add_argument("-w", "--world-size", type=int, default=None, help="ranks (default: all)")
    h.add_argument(
        "-b",
        "--backend",
        default="gloo",
        choices=["gloo", "nccl"],
        help="the seed's torch backend, accepted for parity: under JAX the platform decides",
    )
    h.add_argument("--json", action="store_true", help="print one JSON object (process 0)")
    h.set_defaults(func=main, parser=h)
