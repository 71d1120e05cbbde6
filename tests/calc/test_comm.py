"""Alpha-beta collective cost model: seed goldens, closed forms, and the crossover derivation."""

import math
import subprocess
import sys

import pytest

from jaxscale.calc import comm

REL = 1e-9  # closed forms are exact up to float rounding
NVLINK4 = comm.LINKS["nvlink4"]
PCIE4 = comm.LINKS["pcie4"]


@pytest.mark.parametrize(
    "args, printed_ms",
    [  # seed 004 §11 simulate_allreduce_time's examples, as it prints them (:6.2f)
        ((100, 100, 8, "ring"), 1.71),
        ((100, 100, 8, "tree"), 5.86),
        ((100, 400, 8, "ring"), 0.43),
        ((1000, 100, 8, "ring"), 17.09),
        ((100, 100, 64, "ring"), 1.92),
    ],
)
def test_seed004_simulator_goldens_under_seed_faithful(args, printed_ms):
    assert round(comm.seed004_allreduce_ms(*args, seed_faithful=True), 2) == printed_ms


def test_seed004_corrected_reads_gbps_as_gigabits():
    # 100 MiB ring on 8 GPUs at 100 Gb/s = 12.5e9 B/s: 2(N-1) steps of D/N.
    expected_s = 2 * 7 * (100 * 2**20 / 8) / 12.5e9
    got_ms = comm.seed004_allreduce_ms(100, 100, 8, "ring")
    assert got_ms == pytest.approx(expected_s * 1e3, rel=REL)
    # the latency term the seed lacks: 14 steps of alpha
    with_alpha = comm.seed004_allreduce_ms(100, 100, 8, "ring", latency_s=5e-6)
    assert with_alpha - got_ms == pytest.approx(14 * 5e-6 * 1e3, rel=1e-6)


def test_seed002_one_gigabyte_intuition_and_the_ring_model():
    # seed 002 ch4: ~2.2 ms on NVLink 4 (900 GB/s), ~62 ms on PCIe 4 (32 GB/s), "28x"
    nvlink = comm.seed002_allreduce_intuition_s(1e9, 900e9)
    pcie = comm.seed002_allreduce_intuition_s(1e9, 32e9)
    assert round(nvlink * 1e3, 1) == 2.2 and round(pcie * 1e3) == 62
    assert round(pcie / nvlink) == 28
    # Ring model on per-direction bandwidths: 14 alpha + 2 (7/8) 1 GB / B.
    ring_nv = comm.collective_cost("all-reduce", "ring", 8, 1e9, NVLINK4).total_s
    ring_pcie = comm.collective_cost("all-reduce", "ring", 8, 1e9, PCIE4).total_s
    assert ring_nv == pytest.approx(14 * 1e-6 + 1.75e9 / 450e9, rel=REL)
    assert ring_pcie == pytest.approx(14 * 2e-6 + 1.75e9 / 32e9, rel=REL)
    assert 13.5 < ring_pcie / ring_nv < 14.5  # 450 / 32, not 28


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_step_counts_and_volumes_from_seed002(n):
    d = 1e6
    steps, wire = comm.schedule("all-reduce", "ring", n, d)
    assert steps == 2 * (n - 1)  # seed 002 ch4 ring
    assert wire == pytest.approx(2 * d * (n - 1) / n, rel=REL)  # ch4 ring, ch3 volume table
    assert comm.schedule("all-reduce", "tree", n, d)[0] == 2 * int(math.log2(n))  # ch4 tree
    assert comm.schedule("all-reduce", "recursive_doubling", n, d)[0] == int(math.log2(n))
    assert comm.schedule("all-gather", "ring", n, d) == (n - 1, pytest.approx(d * (n - 1) / n))
    assert comm.schedule("reduce-scatter", "ring", n, d)[0] == n - 1


def test_seed_volume_table_per_process():
    d, n = 1000.0, 4  # seed 002 ch3 "Performance Intuition"
    assert comm.seed_volume_per_process("broadcast", d, n) == d
    assert comm.seed_volume_per_process("scatter", d, n) == d / n
    assert comm.seed_volume_per_process("all_gather", d, n) == d * (n - 1)
    assert comm.seed_volume_per_process("all_reduce", d, n) == 2 * d * (n - 1) / n


def test_bus_bandwidth_convention():
    # seed 002 ch4 benchmark_algorithms.py: bytes_moved = 2 * size * (W - 1) / W
    assert comm.bus_bandwidth("all-reduce", 1e9, 1.0, 4) == pytest.approx(1.5e9, rel=REL)
    assert comm.bus_bandwidth("all-gather", 1e9, 2.0, 8) == pytest.approx(0.5e9 * 7 / 8, rel=REL)
    assert comm.bus_bandwidth("collective-permute", 1e9, 1.0, 8) == 1e9


def test_tree_beats_ring_below_the_crossover_only():
    n, lg = 8, 3
    alpha, bw = NVLINK4.latency_s, NVLINK4.bandwidth_Bps
    # Independent derivation: 2 lg (a + D/B) = 2(n-1) a + 2 (n-1)/n D/B
    expected = (n - 1 - lg) * alpha * bw / (lg - (n - 1) / n)
    got = comm.crossover_bytes("all-reduce", "tree", "ring", n, NVLINK4)
    assert got == pytest.approx(expected, rel=1e-6)

    def t(alg, d):
        return comm.collective_cost("all-reduce", alg, n, d, NVLINK4).total_s

    assert t("tree", 0.9 * got) < t("ring", 0.9 * got)
    assert t("tree", 1.1 * got) > t("ring", 1.1 * got)
    # The seed's own model has no alpha: then the tree never wins (seed 004 §11).
    no_alpha = comm.Link("no alpha", bw, 0.0, "test")
    assert comm.crossover_bytes("all-reduce", "tree", "ring", n, no_alpha) is None


def test_double_binary_tree_crossover_closed_form():
    n, lg = 8, 3
    # 2 lg a + 2 D/B = 2(n-1) a + 2(n-1)/n D/B  ->  D* = n (n-1-lg) a B
    expected = n * (n - 1 - lg) * NVLINK4.latency_s * NVLINK4.bandwidth_Bps
    got = comm.crossover_bytes("all-reduce", "double_binary_tree", "ring", n, NVLINK4)
    assert got == pytest.approx(expected, rel=1e-6)


def test_best_algorithm_switches_with_size():
    assert comm.best_algorithm("all-reduce", 8, 1e3, NVLINK4).algorithm == "recursive_doubling"
    assert comm.best_algorithm("all-reduce", 8, 1e9, NVLINK4).algorithm == "ring"
    assert "recursive_doubling" not in comm.algorithms_for("all-reduce", 6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: comm.schedule("all-reduce", "recursive_doubling", 6, 1), "power-of-two"),
        (lambda: comm.schedule("broadcast", "ring", 4, 1), "unknown collective"),
        (lambda: comm.schedule("all-reduce", "butterfly", 4, 1), "unknown algorithm"),
        (lambda: comm.schedule("all-gather", "double_binary_tree", 4, 1), "no double_binary"),
        (lambda: comm.schedule("all-reduce", "ring", 0, 1), "positive integer"),
        (lambda: comm.schedule("all-reduce", "ring", 4, -1), "non-negative"),
        (lambda: comm.bus_bandwidth("all-reduce", 1, 0.0, 4), "positive"),
        (lambda: comm.seed004_allreduce_ms(100, 0, 8), "bandwidth"),
    ],
)
def test_bad_input_raises_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("n", range(2, 17))
def test_double_binary_trees_are_trees_with_disjoint_inner_nodes(n):
    trees = comm.double_binary_tree(n)
    inner_sets = []
    for parents in trees:
        assert parents.count(None) == 1
        children = [parents.count(r) for r in range(n)]
        assert max(children) <= 2
        for r in range(n):  # every rank reaches the root without a cycle
            seen, cur = set(), r
            while parents[cur] is not None:
                assert cur not in seen
                seen.add(cur)
                cur = parents[cur]
        depth = max(_depth(parents, r) for r in range(n))
        assert depth <= math.ceil(math.log2(n)) + 1
        inner_sets.append({r for r in range(n) if children[r]})
    assert not inner_sets[0] & inner_sets[1]  # no rank forwards in both trees


def _depth(parents, r):
    d = 0
    while parents[r] is not None:
        r, d = parents[r], d + 1
    return d


def test_importing_comm_does_not_import_jax():
    code = "import sys, jaxscale.calc.comm; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_moe_layer_volumes_seed_exercise_2():
    """Seed 002 ch7 "Exercise 2: MoE Communication Analysis": 64 experts, top-2, h=4096, 4x1024
    tokens in bf16: S = 32 MiB; TP 2S = 64 MiB (56 MiB with the ring's 7/8); EP 2kS/N = 2 MiB with
    N = 64 experts, 16 MiB with N = 8 EP ranks."""
    mib = 2**20
    v64 = comm.moe_layer_volumes(4 * 1024, 4096, 2, 64)
    v8 = comm.moe_layer_volumes(4 * 1024, 4096, 2, 8)
    assert v64["S"] == 32 * mib and v64["tp_2S"] == 64 * mib
    assert v64["ep_2kS_over_n"] == 2 * mib and v8["ep_2kS_over_n"] == 16 * mib
    assert v8["tp_2S_ring"] == 56 * mib
    with pytest.raises(ValueError):
        comm.moe_layer_volumes(0, 4096, 2, 8)
