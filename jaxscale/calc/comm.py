"""Alpha-beta cost model for collectives (pure Python; no jax).

T = steps x alpha + wire_bytes / bandwidth, per rank on the critical path. alpha is the start-up
latency of one step, bandwidth the one-way bytes/s one rank can push into the fabric. Sizes follow
the census convention of `jaxscale.analysis.hlo` (D = one device's buffer: the all-reduce operand,
the all-gather OUTPUT, the reduce-scatter INPUT, the all-to-all operand), so a compiled program's
census and this model talk about the same bytes.

Algorithms (N ranks, L = ceil(log2 N)):
  ring                 N-1 steps per phase of D/N (all-reduce: 2 phases, seed 002 ch4)
  tree                 binomial reduce up + broadcast down, the full buffer per step (ch4);
                       for gathers/scatters: gather/scatter to a root plus a broadcast/reduce
  recursive_doubling   L steps (power-of-two N): doubling for all-reduce and all-gather, halving
                       for reduce-scatter, Bruck's D/2 per step for all-to-all
  double_binary_tree   all-reduce only; NCCL's two complementary trees, pipelined: log-depth
                       latency with a 2D bandwidth term (Sanders, Speck & Traeff 2009)
"""

import math
from dataclasses import dataclass

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
ALGORITHMS = ("ring", "tree", "recursive_doubling", "double_binary_tree")


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth_Bps: float  # one-way bytes/s per rank into the fabric
    latency_s: float  # alpha: start-up cost of one step
    source: str  # where the numbers come from


# Per-direction bandwidths. Headline figures are often bidirectional (NVLink 4: 900 GB/s), which
# is twice what one rank can send: mixing the two conventions is the seed's 28x (seed-notes).
LINKS = {
    "nvlink3": Link("NVLink 3 (A100)", 300e9, 1e-6, "12 links x 25 GB/s, seed 002 ch4"),
    "nvlink4": Link("NVLink 4 (H100)", 450e9, 1e-6, "18 links x 25 GB/s, seed 002 ch4"),
    "pcie4": Link("PCIe 4.0 x16", 32e9, 2e-6, "~32 GB/s, seed 002 ch4; alpha assumed"),
    "ib_ndr": Link("InfiniBand NDR", 50e9, 2e-6, "400 Gb/s per port; alpha seed 001 §7"),
    "eth100": Link("100 GbE", 12.5e9, 10e-6, "100 Gb/s; alpha seed 001 §7"),
    "tpu_v5e_ici": Link("TPU v5e ICI link", 50e9, 1e-6, "400 GB/s bidir over 4 ports"),
    "tpu_v5p_ici": Link("TPU v5p ICI link", 100e9, 1e-6, "1200 GB/s bidir over 6 ports"),
}  # TPU figures: Cloud TPU v5e / v5p spec pages; alpha for ICI and PCIe is an assumption.


@dataclass(frozen=True)
class Cost:
    collective: str
    algorithm: str
    n_ranks: int
    size_bytes: float  # D, census convention
    steps: int  # latency terms on the critical path
    wire_bytes: float  # bytes one rank sends on the critical path
    latency_s: float
    transfer_s: float

    @property
    def total_s(self) -> float:
        return self.latency_s + self.transfer_s


def _check(n_ranks: int, size_bytes: float) -> None:
    if not isinstance(n_ranks, int) or n_ranks < 1:
        raise ValueError(f"n_ranks must be a positive integer, got {n_ranks!r}")
    if size_bytes < 0:
        raise ValueError(f"size must be non-negative, got {size_bytes} bytes")


def _log2_steps(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def schedule(collective: str, algorithm: str, n_ranks: int, size_bytes: float) -> tuple[int, float]:
    """(steps, wire bytes per rank) of one algorithm; ValueError for combinations not modelled."""
    _check(n_ranks, size_bytes)
    n, d, lg = n_ranks, float(size_bytes), _log2_steps(n_ranks)
    frac = (n - 1) / n
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose from {', '.join(COLLECTIVES)}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    if algorithm == "recursive_doubling" and n & (n - 1):
        raise ValueError(f"recursive doubling needs a power-of-two rank count, got {n}")
    table = {
        ("all-reduce", "ring"): (2 * (n - 1), 2 * frac * d),
        ("all-reduce", "tree"): (2 * lg, 2 * lg * d),
        ("all-reduce", "recursive_doubling"): (lg, lg * d),
        ("all-reduce", "double_binary_tree"): (2 * lg, 2 * d if n > 1 else 0.0),
        ("all-gather", "ring"): (n - 1, frac * d),
        ("all-gather", "tree"): (2 * lg, frac * d + lg * d),
        ("all-gather", "recursive_doubling"): (lg, frac * d),
        ("reduce-scatter", "ring"): (n - 1, frac * d),
        ("reduce-scatter", "tree"): (2 * lg, lg * d + frac * d),
        ("reduce-scatter", "recursive_doubling"): (lg, frac * d),
        ("all-to-all", "ring"): (n - 1, frac * d),
        ("all-to-all", "recursive_doubling"): (lg, lg * d / 2),
    }
    if (collective, algorithm) not in table:
        raise ValueError(f"no {algorithm} algorithm for {collective} in this model")
    return table[(collective, algorithm)]


def collective_cost(
    collective: str, algorithm: str, n_ranks: int, size_bytes: float, link: Link
) -> Cost:
    """Alpha-beta time of one collective of D = size_bytes on n_ranks ranks joined by `link`."""
    steps, wire = schedule(collective, algorithm, n_ranks, size_bytes)
    return Cost(
        collective,
        algorithm,
        n_ranks,
        float(size_bytes),
        steps,
        wire,
        steps * link.latency_s,
        wire / link.bandwidth_Bps,
    )


def algorithms_for(collective: str, n_ranks: int) -> list[str]:
    """The algorithms the model defines for this collective and rank count."""
    out = []
    for alg in ALGORITHMS:
        try:
            schedule(collective, alg, n_ranks, 0)
        except ValueError:
            continue
        out.append(alg)
    return out


def best_algorithm(collective: str, n_ranks: int, size_bytes: float, link: Link) -> Cost:
    """The fastest algorithm under the model (an NCCL-style auto-selection rule)."""
    costs = [
        collective_cost(collective, alg, n_ranks, size_bytes, link)
        for alg in algorithms_for(collective, n_ranks)
    ]
    return min(costs, key=lambda c: c.total_s)


def crossover_bytes(
    collective: str, small_alg: str, large_alg: str, n_ranks: int, link: Link
) -> float | None:
    """Size below which `small_alg` is faster than `large_alg` (None if it never or always is).

    Both times are affine in D (T = a + b D), so the crossing is (a_large - a_small) / (b_small -
    b_large), valid when small_alg has less latency and more bandwidth cost.
    """
    s0, s1 = (collective_cost(collective, small_alg, n_ranks, d, link).total_s for d in (0, 1))
    l0, l1 = (collective_cost(collective, large_alg, n_ranks, d, link).total_s for d in (0, 1))
    if not (s0 < l0 and s1 - s0 > l1 - l0):
        return None
    return (l0 - s0) / ((s1 - s0) - (l1 - l0))


# --- conventions and the seeds' own numbers --------------------------------------------------


def bus_bandwidth(collective: str, size_bytes: float, time_s: float, n_ranks: int) -> float:
    """NCCL's bus bandwidth: algbw = size / time, times the bytes-on-the-wire factor.

    all-reduce 2(N-1)/N (seed 002 ch4 benchmark_algorithms.py); all-gather, reduce-scatter,
    all-to-all (N-1)/N; collective-permute (point-to-point) and broadcast 1.
    """
    _check(n_ranks, size_bytes)
    if time_s <= 0:
        raise ValueError(f"time must be positive, got {time_s} s")
    factors = {
        "all-reduce": 2 * (n_ranks - 1) / n_ranks,
        "all-gather": (n_ranks - 1) / n_ranks,
        "reduce-scatter": (n_ranks - 1) / n_ranks,
        "all-to-all": (n_ranks - 1) / n_ranks,
        "collective-permute": 1.0,
        "broadcast": 1.0,
    }
    if collective not in factors:
        raise ValueError(f"no bus-bandwidth factor for {collective!r}")
    return size_bytes / time_s * factors[collective]


def seed_volume_per_process(op: str, data_bytes: float, n_ranks: int) -> float:
    """Seed 002 ch3 "Performance Intuition", with ITS D: the data each process holds first."""
    _check(n_ranks, data_bytes)
    volumes = {
        "broadcast": data_bytes,  # received
        "scatter": data_bytes / n_ranks,  # received
        "all_gather": data_bytes * (n_ranks - 1),  # sent + received, as the seed counts
        "all_reduce": 2 * data_bytes * (n_ranks - 1) / n_ranks,  # ring
    }
    if op not in volumes:
        raise ValueError(f"the seed's table has no {op!r}; choose from {', '.join(volumes)}")
    return volumes[op]


def seed004_allreduce_ms(
    tensor_size_mb: float,
    bandwidth_gbps: float,
    n_gpus: int,
    algorithm: str = "ring",
    *,
    seed_faithful: bool = False,
    latency_s: float = 0.0,
) -> float:
    """Seed 004 `simulate_allreduce_time` (§11 "Communication Patterns").

    seed_faithful=True reproduces its numbers (1.71 / 5.86 / 0.43 / 17.09 / 1.92 ms): the argument
    labelled Gbps is used as GB/s. Default: Gbps means gigabits/s (divide by 8); the size stays in
    the seed's binary MB (it divides by 1024). The seed has no latency term; `latency_s` adds one.
    """
    if tensor_size_mb < 0 or bandwidth_gbps <= 0:
        raise ValueError("size must be >= 0 MB and bandwidth > 0 Gbps")
    if algorithm not in ("ring", "tree"):
        raise ValueError(f"seed 004 models 'ring' and 'tree', not {algorithm!r}")
    if seed_faithful:
        size_bytes, bandwidth_Bps = tensor_size_mb / 1024 * 1e9, bandwidth_gbps * 1e9
    else:
        size_bytes, bandwidth_Bps = tensor_size_mb * 2**20, bandwidth_gbps * 1e9 / 8
    link = Link("seed 004", bandwidth_Bps, latency_s, "seed 004 §11")
    return collective_cost("all-reduce", algorithm, n_gpus, size_bytes, link).total_s * 1e3


def seed002_allreduce_intuition_s(size_bytes: float, headline_Bps: float) -> float:
    """Seed 002 ch4 "Performance Intuition": time = size / (headline / 2) ("~450 GB/s effective").

    Reproduces 2.2 ms (NVLink 4, 900 GB/s) and 62 ms (PCIe 4, 32 GB/s) for 1 GB. The headline
    figures mix conventions (NVLink's is bidirectional, PCIe's one-way); see `collective_cost`
    with LINKS for the ring model on per-direction bandwidths.
    """
    if size_bytes < 0 or headline_Bps <= 0:
        raise ValueError("size must be >= 0 and bandwidth > 0")
    return size_bytes / (headline_Bps / 2)


def double_binary_tree(n_ranks: int) -> tuple[list[int | None], list[int | None]]:
    """Parents of every rank in NCCL-style complementary binary trees (None marks the root).

    Tree A is the in-order tree on positions 1..N (a node's level is its lowest set bit), so even
    ranks are leaves and only odd ranks forward data. Tree B is tree A with every rank shifted by
    one, so its inner nodes are even ranks: no rank forwards in both trees, which is what lets the
    pair use every link in both directions (seed 002 ch4 "Double Binary Tree" draws the idea).
    """
    _check(n_ranks, 0)

    def in_order_parent(p: int) -> int | None:
        low = p & -p  # the node's level
        # Exactly one of p - low, p + low sits one level up (lowest set bit 2 * low).
        up = p - low if (p - low) % (4 * low) == 2 * low else p + low
        if up <= n_ranks:
            return up
        # Past the end: hang under the left neighbour, which is an ancestor level; none -> root.
        return p - low if p - low >= 1 else None

    tree_a = [None if (q := in_order_parent(r + 1)) is None else q - 1 for r in range(n_ranks)]
    tree_b: list[int | None] = [None] * n_ranks
    for r, parent in enumerate(tree_a):
        tree_b[(r + 1) % n_ranks] = None if parent is None else (parent + 1) % n_ranks
    return tree_a, tree_b


def moe_layer_volumes(
    tokens: int, hidden: int, top_k: int, n: int, dtype_bytes: int = 2
) -> dict[str, float]:
    """Bytes one MoE layer moves (seed 002 ch7 "EP vs TP"): TP's 2 all-reduces of S =
    tokens x hidden (2S, and 2S (n-1)/n on a ring) against EP's 2 all-to-alls of k/n of the
    tokens each (2kS/n). The seed leaves n ambiguous: EP ranks or experts; pass either."""
    if min(tokens, hidden, top_k, n, dtype_bytes) < 1:
        raise ValueError("tokens, hidden, top_k, n and dtype_bytes must be >= 1")
    S = tokens * hidden * dtype_bytes
    return {
        "S": float(S),
        "tp_2S": 2.0 * S,
        "tp_2S_ring": 2.0 * S * (n - 1) / n,
        "ep_2kS_over_n": 2.0 * top_k * S / n,
    }
