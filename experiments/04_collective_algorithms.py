"""Seed 002 ch4 "NCCL Algorithms and GPU Topology" and seed 004's all-reduce simulator (§11
"Communication Patterns").

    .venv/bin/python experiments/04_collective_algorithms.py [--seed-faithful]
        [--sizes 1000,10000,100000,1000000,10000000,100000000] [-w 4] [-i 50] [--plot PATH]

Ring / tree / recursive doubling as ppermute schedules (steps and bytes from the compiled HLO
census vs the alpha-beta model), the 1 GB NVLink-vs-PCIe table, seed 004's simulator (defaults
corrected; --seed-faithful prints the seed's numbers first), tree-vs-ring crossovers per link,
the topology inspector (nvidia-smi, or the seed's simulated DGX-A100), and benchmark_algorithms.py:
a measured all-reduce with the seed's bus-bandwidth formula (CPU timings are indicative).
"""

import argparse
import sys

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

from jaxscale.bench import collectives as bench  # noqa: E402
from jaxscale.bench.collective_plots import plot_algorithms  # noqa: E402
from jaxscale.calc import comm, topology  # noqa: E402

# seed 004 §11's examples: (MB, "Gbps", GPUs, algorithm)
SEED004 = ((100, 100, 8, "ring"), (100, 100, 8, "tree"), (100, 400, 8, "ring"))
SEED004 += ((1000, 100, 8, "ring"), (100, 100, 64, "ring"))


def schedules(w: int) -> None:
    import jax
    import jax.numpy as jnp

    from jaxscale.analysis import hlo
    from jaxscale.lessons.ranks import line_mesh
    from jaxscale.parallel import collectives as C

    d = 4096 * w  # bytes per device, divisible by N
    print(f"ALL-REDUCE SCHEDULES on {w} devices, D = {d} B: model vs compiled HLO census")
    print(f"{'algorithm':<20}{'steps':>6}{'wire B/rank':>13}   census")
    algs = [("ring", C.ring_all_reduce), ("tree", C.tree_all_reduce)]
    if w & (w - 1) == 0:
        algs.append(("recursive_doubling", C.recursive_doubling_all_reduce))
    mesh, P = line_mesh(w), jax.P("x")
    for name, fn in algs:
        steps, wire = comm.schedule("all-reduce", name, w, d)
        f = jax.shard_map(lambda a, fn=fn: fn(a, "x"), mesh=mesh, in_specs=P, out_specs=P)
        cs = hlo.collectives_of(jax.jit(f).lower(jnp.ones(w * d // 4)).compile())
        total = sum(c.bytes_per_device for c in cs)
        ok = "ok" if (len(cs), total) == (steps, wire) else "MISMATCH"
        print(f"{name:<20}{steps:>6}{wire:>13,.0f}   {len(cs)} permutes, {total:,.0f} B  {ok}")
    dbt_steps, dbt_wire = comm.schedule("all-reduce", "double_binary_tree", w, d)
    print(f"{'double_binary_tree':<20}{dbt_steps:>6}{dbt_wire:>13,.0f}   model only (pipelined)")


def model_tables(faithful: bool) -> None:
    mode = "seed-faithful" if faithful else "corrected"
    print(f"\n1 GB ALL-REDUCE ON 8 GPUS (seed 002 ch4), {mode} mode")
    seed = {
        k: comm.seed002_allreduce_intuition_s(1e9, bw)
        for k, bw in (("nvlink4", 900e9), ("pcie4", 32e9))
    }
    ring = {
        k: comm.collective_cost("all-reduce", "ring", 8, 1e9, comm.LINKS[k]).total_s for k in seed
    }
    first, second = (seed, ring) if faithful else (ring, seed)
    labels = ("seed: D/(headline/2)", "ring model") if faithful else ("ring model", "seed prints")
    print(f"{'link':<10}{labels[0]:>22}{labels[1]:>22}")
    for k in seed:
        print(f"{k:<10}{first[k] * 1e3:>19.2f} ms{second[k] * 1e3:>19.2f} ms")
    print(
        f"ratio PCIe/NVLink: {first['pcie4'] / first['nvlink4']:.1f}x "
        f"({labels[1]}: {second['pcie4'] / second['nvlink4']:.1f}x)"
    )

    print(f"\nSEED 004 simulate_allreduce_time (§11), {mode} mode")
    cols = ("seed prints", "corrected") if faithful else ("corrected", "seed prints")
    print(f"{'config':<30}{cols[0]:>22}{cols[1]:>22}")
    for mb, gbps, n, alg in SEED004:
        t = [comm.seed004_allreduce_ms(mb, gbps, n, alg, seed_faithful=f) for f in (True, False)]
        t = t if faithful else t[::-1]
        print(f"{mb:4d}MB, {gbps:3d}Gbps, {n:2d} GPUs, {alg:4s}  {t[0]:>19.2f}ms{t[1]:>20.2f}ms")
    print("(the seed reads its 'Gbps' argument as GB/s; corrected divides by 8)")

    print("\nTREE vs RING with a latency term: crossover sizes, N = 8")
    print(
        f"{'link':<13}{'alpha us':>9}{'GB/s':>7}{'tree<ring below':>17}{'DBT<ring below':>16}"
        f"{'best @1KB':>20}{'best @1MB':>20}{'best @100MB':>13}"
    )
    for key, link in comm.LINKS.items():
        tree = comm.crossover_bytes("all-reduce", "tree", "ring", 8, link)
        dbt = comm.crossover_bytes("all-reduce", "double_binary_tree", "ring", 8, link)
        best = [comm.best_algorithm("all-reduce", 8, s, link).algorithm for s in (1e3, 1e6, 1e8)]
        print(
            f"{key:<13}{link.latency_s * 1e6:>9.0f}{link.bandwidth_Bps / 1e9:>7.0f}"
            f"{tree / 1e3:>14.0f} KB{dbt / 1e6:>13.1f} MB{best[0]:>20}{best[1]:>20}{best[2]:>13}"
        )


def topology_section() -> None:
    from jaxscale.analysis import topology_devices

    text = topology.read_nvidia_smi_topology()
    print("\nTOPOLOGY INSPECTOR")
    if text is None:
        print("[INFO] nvidia-smi not found. Showing the seed's simulated DGX-A100 topology.")
        text = topology.SIMULATED_DGX_A100
    print(text)
    print(topology.format_report(t := topology.parse_topo_matrix(text), topology.analyze(t)))
    print("jax devices:\n" + topology_devices.format_devices(topology_devices.device_rows()))


def benchmark(args) -> list:
    w, rows = args.world_size, []
    print(f"\nALL_REDUCE BENCHMARK (seed 002 ch4): world size {w}, up to {args.iterations} iters")
    print(f"{'Size':<12}{'Median (ms)':>12}{'Bandwidth':>14}   (bus bandwidth, as seed 002 ch4)")
    for size in bench.parse_sizes(args.sizes):
        r = bench.measure("psum", w, size, args.iterations, 1, args.budget_s)
        rows.append(r)
        print(
            f"{bench.format_bytes(r.size_bytes):<12}{r.latency_s * 1e3:>12.3f}"
            f"{bench.format_bytes(r.busbw_Bps) + '/s':>14}"
        )
    if len(rows) >= 2:
        size_ratio = rows[-1].size_bytes / rows[0].size_bytes
        lat_ratio = rows[-1].latency_s / rows[0].latency_s
        kind = "sub-linearly" if lat_ratio < 0.5 * size_ratio else "roughly linearly or worse"
        print(f"size x{size_ratio:.0f} -> latency x{lat_ratio:.1f}: grows {kind}")
    print("On CPU devices these are host-memory copies, not NVLink or PCIe: indicative only.")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed-faithful", action="store_true", help="seed's numbers first")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000,10000000,100000000")
    parser.add_argument("--world-size", "-w", type=int, default=4)
    parser.add_argument("--iterations", "-i", type=int, default=50)
    parser.add_argument("--budget-s", type=float, default=1.0, help="timing budget per size")
    parser.add_argument("--plot", default="results/04_collective_algorithms.png")
    args = parser.parse_args()
    import jax

    if not 2 <= args.world_size <= jax.device_count() or args.iterations < 1:
        parser.error(f"need 2 <= --world-size <= {jax.device_count()} and --iterations >= 1")
    try:
        bench.parse_sizes(args.sizes)
    except ValueError as e:
        parser.error(str(e))  # exits 2
    schedules(args.world_size)
    model_tables(args.seed_faithful)
    topology_section()
    rows = benchmark(args)
    if args.plot:
        print(f"plot: {plot_algorithms(rows, args.world_size, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
