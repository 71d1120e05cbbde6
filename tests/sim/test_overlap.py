"""Scheduling- and launch-overhead models on the virtual clock (seed 002 ch10)."""

import itertools

import pytest

from jaxscale.sim import overlap as ov
from jaxscale.sim import timeline

TOL = 1e-6  # ms; sums of 0.05 ms steps carry float rounding


def total(spans) -> float:
    return timeline.makespan(spans)


def test_scheduling_goldens():
    # seed 002 ch10 scheduling_overhead_benchmark.py: sequential 20*13 = 260 ms, overlapped
    # 13 + 19*11 = 222 ms, 1.17x
    cfg = ov.SchedulingConfig()
    seq = total(ov.simulate_scheduling(cfg, "sequential"))
    over = total(ov.simulate_scheduling(cfg, "overlap"))
    assert seq == pytest.approx(260.0, abs=TOL)
    assert over == pytest.approx(222.0, abs=TOL)
    assert round(seq / over, 2) == 1.17
    a = ov.scheduling_analysis(cfg)  # seed's ANALYSIS: 23.1%, 1.0 ms, 67%
    assert round(100 * a["overhead_fraction"], 1) == 23.1
    assert a["effective_overhead_ms"] == 1.0
    assert round(100 * a["overhead_reduction"]) == 67


def test_futuremap_hides_postprocessing():
    # C >= S + P: the GPU never waits after the first schedule, so S + N*C + P = 2 + 200 + 1.
    cfg = ov.SchedulingConfig()
    assert total(ov.simulate_scheduling(cfg, "futuremap")) == pytest.approx(203.0, abs=TOL)


GRID = list(
    itertools.product([0.5, 2.0, 7.0, 12.0], [0.5, 3.0, 10.0], [0.5, 1.0, 4.0], [1, 2, 5, 20])
)


@pytest.mark.parametrize("s, c, p, n", GRID)
def test_event_simulation_matches_the_seeds_formulas(s, c, p, n):
    cfg = ov.SchedulingConfig(n, s, c, p)
    ideal = ov.seed_ideal_ms(cfg)
    got = {m: total(ov.simulate_scheduling(cfg, m)) for m in ov.SCHEDULING_MODES}
    assert got["sequential"] == pytest.approx(n * (s + c + p), abs=TOL)
    assert got["overlap"] == pytest.approx(ideal["overlap"], abs=TOL)
    assert got["futuremap"] <= got["overlap"] + TOL <= got["sequential"] + 2 * TOL
    # neither the GPU (N*C) nor the CPU (N*(S+P)) can be beaten
    assert got["futuremap"] >= max(n * c, n * (s + p)) - TOL
    if c >= s + p:
        assert got["futuremap"] == pytest.approx(s + n * c + p, abs=TOL)


@pytest.mark.parametrize("mode", ov.SCHEDULING_MODES)
def test_one_cpu_one_gpu_and_dependencies(mode):
    cfg = ov.SchedulingConfig(6, 3.0, 2.0, 1.0)
    spans = ov.simulate_scheduling(cfg, mode)
    for ops in timeline.by_resource(spans).values():
        for a, b in itertools.pairwise(ops):
            assert b.start >= a.end - TOL
    for i in range(cfg.batches):
        assert spans[("C", i)].start >= spans[("S", i)].end - TOL
        assert spans[("P", i)].start >= spans[("C", i)].end - TOL
        if mode == "overlap" and i:
            assert spans[("C", i)].start >= spans[("P", i - 1)].end - TOL


def _seed_bars(s, c, p, n=4, scale=2):
    """The seed's visualize_timeline strings (seed 002 ch10), rebuilt here."""

    def bar(ch, ms):
        return ch * int(ms * scale)

    seq_cpu = "".join(bar("S", s) + bar(".", c) + bar("P", p) for _ in range(n))
    seq_gpu = "".join(bar(".", s) + bar("C", c) + bar(".", p) for _ in range(n))
    ov_cpu = bar("S", s) + "".join(bar("S", s) + bar(".", c - s) + bar("P", p) for _ in range(n))
    ov_gpu = bar(".", s) + "".join(bar("C", max(c, s)) + bar(".", p) for _ in range(n))
    return {"sequential": (seq_cpu, seq_gpu), "overlap": (ov_cpu, ov_gpu)}


def test_bars_match_the_seeds_timeline():
    cfg = ov.SchedulingConfig()
    for mode, (cpu, gpu) in _seed_bars(2.0, 10.0, 1.0).items():
        spans = ov.simulate_scheduling(cfg, mode)
        bars = ov.bars(spans, spans[("P", 3)].end, 2)
        assert (bars["cpu"], bars["gpu"]) == (cpu, gpu)


def test_launch_goldens():
    # cuda_graph_simple --force-cpu [R]: 750.0 vs 550.0 ms, 1.36x, 0.25 -> 0.05 ms per iteration
    cfg = ov.LaunchConfig()
    eager = total(ov.simulate_launch(cfg, "eager"))
    graph = total(ov.simulate_launch(cfg, "graph"))
    assert eager == pytest.approx(750.0, abs=TOL)
    assert graph == pytest.approx(550.0, abs=TOL)
    assert f"{eager / graph:.2f}" == "1.36"
    assert ov.launch_overhead_per_iteration_ms(cfg, "eager") == pytest.approx(0.25)
    assert ov.launch_overhead_per_iteration_ms(cfg, "graph") == pytest.approx(0.05)


@pytest.mark.parametrize(
    "it, k, launch, compute", [(3, 5, 0.05, 0.5), (10, 2, 0.3, 1.0), (7, 4, 0.2, 0.4)]
)
def test_launch_closed_forms(it, k, launch, compute):
    cfg = ov.LaunchConfig(it, k, launch, compute)
    assert total(ov.simulate_launch(cfg, "eager")) == pytest.approx(
        it * (k * launch + compute), abs=TOL
    )
    assert total(ov.simulate_launch(cfg, "graph")) == pytest.approx(
        it * (launch + compute), abs=TOL
    )
    kernel = compute / k
    if kernel >= launch:  # async dispatch: the GPU never starves after the first launch
        expected = launch + it * compute
    else:  # the CPU is the bottleneck: the last kernel follows the last launch
        expected = it * k * launch + kernel
    assert total(ov.simulate_launch(cfg, "async")) == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize(
    "call",
    [
        lambda: ov.simulate_scheduling(ov.SchedulingConfig(batches=0), "overlap"),
        lambda: ov.simulate_scheduling(ov.SchedulingConfig(compute_ms=-1.0), "overlap"),
        lambda: ov.simulate_scheduling(ov.SchedulingConfig(), "turbo"),
        lambda: ov.simulate_launch(ov.LaunchConfig(kernels=0), "eager"),
        lambda: ov.simulate_launch(ov.LaunchConfig(launch_ms=0.0), "graph"),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_timeline_rejects_deadlock_and_bad_ops():
    a = timeline.Op("a", "x", 1.0, ("b",))
    b = timeline.Op("b", "y", 1.0, ("a",))
    with pytest.raises(ValueError, match="deadlock"):
        timeline.run({"x": [a], "y": [b]})
    with pytest.raises(ValueError, match="unknown"):
        timeline.run({"x": [timeline.Op("a", "x", 1.0, ("zz",))]})
    with pytest.raises(ValueError, match="duplicate"):
        timeline.run({"x": [timeline.Op("a", "x", 1.0), timeline.Op("a", "x", 1.0)]})
    with pytest.raises(ValueError, match="non-positive"):
        timeline.run({"x": [timeline.Op("a", "x", 0.0)]})
    # an order that waits for a later op on the same resource can never finish either
    c = timeline.Op("c", "x", 1.0, ("d",))
    d = timeline.Op("d", "x", 1.0)
    with pytest.raises(ValueError, match="deadlock"):
        timeline.run({"x": [c, d]})
