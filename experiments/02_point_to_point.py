"""Seed 002 ch2 "Point-to-Point Communication" (ML Systems Infrastructure Tutorial).

    .venv/bin/python experiments/02_point_to_point.py [-w 4] [--seed-faithful] [--show-deadlock]
        [--batch-size 32] [--hidden-size 64] [-m 4]

send_recv_basic.py's chain as ppermute hops (seed defect 1: from 42 with W=4 the sink holds 62;
the seed prints "Expected: 72.0", which --seed-faithful reproduces), the Try-It ring and even<->odd
swap, the deadlock/hang patterns in the point-to-point simulator (ppermute cannot express them),
async-dispatch latency (Ex3), and pipeline_simulation.py's forward pass over W stages.
"""

import argparse
import sys
import time

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

from jaxscale.sim import p2p  # noqa: E402

PATTERNS = (  # (title, programs, mode)
    ("both ranks send first, rendezvous sends (seed 002 ch2)", p2p.both_send_first, "rendezvous"),
    ("both ranks send first, eager (buffered) sends", p2p.both_send_first, "eager"),
    ("interleaved: the fix (seed 002 ch2)", p2p.interleaved, "rendezvous"),
    ("isend/irecv swap (Ex2)", p2p.nonblocking_swap, "rendezvous"),
    ("pitfall 1: mismatched src/dst (seed 002 ch2)", p2p.mismatched, "rendezvous"),
    ("pitfall 3: read before wait (seed 002 ch2)", p2p.forgot_wait, "rendezvous"),
)


def show_patterns() -> None:
    print("Deadlocks and hangs need a send/recv model; ppermute is one global exchange.\n")
    for title, make, mode in PATTERNS:
        result = p2p.simulate(*make(), mode=mode)
        print(f"--- {title}\n{p2p.format_trace(result)}")
        for rank, label, value in result.reads:
            print(f"   rank {rank} reads x {label}: {value}")
        print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", "-w", type=int, default=4, help="ranks / stages")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help="ignored")
    parser.add_argument("--show-deadlock", action="store_true", help="deadlock patterns, exit")
    parser.add_argument("--seed-faithful", action="store_true", help="print the seed's Expected")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-microbatches", "-m", type=int, default=4)
    args = parser.parse_args()
    if args.show_deadlock:
        show_patterns()
        return 0
    if min(args.batch_size, args.hidden_size, args.num_microbatches) < 1:
        parser.error("--batch-size, --hidden-size and --num-microbatches must be positive")
    import jax
    import numpy as np

    from jaxscale.lessons import ranks as demos

    w = args.world_size
    try:
        mesh = demos.line_mesh(w)
        chain = demos.relay_chain(mesh)
    except ValueError as e:
        parser.error(str(e))
    mode = "seed-faithful" if args.seed_faithful else "corrected"
    print(f"=== CHAIN: rank 0 -> 1 -> ... -> {w - 1}, relays add 10 ({mode} mode)")
    for r, v in enumerate(chain.held):
        role = "source" if r == 0 else "sink" if r == w - 1 else "relay"
        print(f"  [Rank {r}] {role:<6} holds {v}")
    print(f"Original: {chain.init}")
    if args.seed_faithful:
        print(f"After {w - 1} additions of 10: {chain.final}")
        print(f"Expected: {chain.seed_printed_expected}   <- the seed's formula (defect 1)")
    else:
        print(f"After {chain.relays} relay additions of 10: {chain.final}")
        print(
            f"Expected: {chain.expected}   (init + 10 x #relays; the seed prints "
            f"{chain.seed_printed_expected})"
        )
    sim = p2p.simulate(*p2p.chain(w))
    print(
        f"Same chain with blocking send/recv in the simulator: {sim.status}, sink holds "
        f"{sim.env[-1]['x']}"
    )

    print("\n=== Ex1 RING: value goes round once, every non-origin rank adds 10")
    print(
        f"  from 0: rank 0 ends with {demos.ring_pass(mesh, 0.0)[0]}; "
        f"from 42: {demos.ring_pass(mesh, 42.0)[0]}"
    )
    if w % 2 == 0:
        sent, received = demos.even_odd_swap(mesh)
        print("\n=== Ex2 EVEN <-> ODD in one ppermute")
        for r in range(w):
            print(f"  [Rank {r}] sent {sent[r].tolist()} received {received[r].tolist()}")

    print("\n=== Ex3 LATENCY of a jitted ppermute (1 KB per device)")
    x = jax.numpy.ones((w * 256,), jax.numpy.float32)
    ring = [(i, (i + 1) % w) for i in range(w)]
    shift = jax.shard_map(
        lambda a: jax.lax.ppermute(a, "x", ring),
        mesh=mesh,
        in_specs=jax.P("x"),
        out_specs=jax.P("x"),
    )
    f = jax.jit(shift)
    jax.block_until_ready(f(x))
    reps = 50
    t0 = time.perf_counter()
    for _ in range(reps):
        jax.block_until_ready(f(x))  # "blocking": wait after every call
    blocking = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    jax.block_until_ready([f(x) for _ in range(reps)])  # "non-blocking": dispatch all, wait once
    overlapped = (time.perf_counter() - t0) / reps
    print(
        f"  wait every call: {blocking * 1e3:.3f} ms/call; dispatch all then wait: "
        f"{overlapped * 1e3:.3f} ms/call (CPU, indicative)"
    )

    p, m, b, h = w, args.num_microbatches, args.batch_size, args.hidden_size
    print(f"\n=== PIPELINE: {p} stages (Linear+ReLU), {m} microbatches of [{b}, {h}], forward")
    rng = np.random.default_rng(0)
    w_ = (rng.normal(size=(p, h, h)) / np.sqrt(h)).astype(np.float32)
    b_ = (rng.normal(size=(p, h)) * 0.1).astype(np.float32)
    x_ = rng.normal(size=(m, b, h)).astype(np.float32)
    out = demos.pipeline_forward(mesh, w_, b_, x_)
    ref = x_
    for s in range(p):
        ref = np.maximum(ref @ w_[s] + b_[s], 0.0)
    for i in range(m):
        print(f"  [Stage {p - 1}] Microbatch {i}: Completed! Output mean: {out[i].mean():.4f}")
    print(
        f"  max |pipeline - sequential| = {np.abs(out - ref).max():.2e}; "
        f"hops per microbatch: {p - 1}; ticks: {m + p - 1}"
    )
    print("  In a real pipeline the backward pass sends gradients back (see experiment 07).\n")
    show_patterns()
    return 0


if __name__ == "__main__":
    sys.exit(main())
