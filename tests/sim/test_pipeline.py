"""Pipeline schedule simulator: seed goldens, dependency invariants, closed forms, seed port."""

import itertools

import pytest

from jaxscale.sim import pipeline as pp
from jaxscale.sim import pipeline_seed, timeline

TOL = 1e-9  # absolute, on times and fractions built from small rationals

# Seed 002 ch7's 1F1B rules ("1F1B Scheduling") on a dependency-driven clock, unit F and B:
# the time-aligned 1F1B grid for P=4, M=8.
GOLDEN_1F1B_P4M8 = """\
GPU0: F0 F1 F2 F3 .. .. .. B0 F4 B1 F5 B2 F6 B3 F7 B4 .. B5 .. B6 .. B7
GPU1: .. F0 F1 F2 .. .. B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .. B6 .. B7 ..
GPU2: .. .. F0 F1 .. B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .. B7 .. ..
GPU3: .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .. .. .."""

# Seed 002 ch7 pipeline_schedule_viz.py, "Run It": the per-GPU 1F1B op order it expects.
SEED_1F1B_ORDER_P4M8 = [
    "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
    "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
    "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
    "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
]


def sim(p, m, schedule, t_f=1.0, t_b=1.0, v=1):
    return pp.simulate(pp.PipelineConfig(p, m, schedule, t_f, t_b, v))


def test_1f1b_grid_matches_the_golden_simulation():
    assert sim(4, 8, "1f1b").grid() == GOLDEN_1F1B_P4M8


def test_1f1b_per_stage_order_matches_the_seed_lists():
    res = sim(4, 8, "1f1b")
    rows = timeline.by_resource(res.spans)
    for stage, expected in enumerate(SEED_1F1B_ORDER_P4M8):
        assert " ".join(s.op.label for s in rows[stage]) == expected


@pytest.mark.parametrize("schedule, t_b, v", [("1f1b", 2.0, 1), ("interleaved", 1.0, 2)])
def test_schedule_grid_places_every_op_on_its_ticks(schedule, t_b, v):
    p = 4
    res = sim(p, 8, schedule, 1.0, t_b, v)  # ticks of 1 and 0.5
    grid = pp.schedule_grid(res)
    assert len(grid) == p and {len(row) for row in grid} == {round(res.makespan / res.tick)}
    for span in res.spans.values():
        kind, stage, mb = span.op.key
        first, last = round(span.start / res.tick), round(span.end / res.tick)
        cells = grid[span.op.resource][first:last]
        assert cells == [pp.Slot(kind, mb, stage, t == 0) for t in range(last - first)]
    busy = sum(cell is not None for row in grid for cell in row)
    assert busy * res.tick == pytest.approx(p * res.work_per_stage, abs=TOL)


def test_bubble_table_simulates_both_schedules():
    rows = pp.bubble_table(4, virtual_stages=2)
    assert [r["microbatches"] for r in rows] == list(pp.BUBBLE_MICROBATCHES)
    for r in rows:
        assert r["simulated_1f1b_bubble"] == pytest.approx(r["bubble_s2"], abs=TOL)
        inter = r["simulated_interleaved_bubble"]
        assert inter is None if r["microbatches"] % 4 else inter < r["bubble_s2"]


@pytest.mark.parametrize(
    "schedule, m, makespan, peaks",
    [
        # computed from seed 002 ch7's schedules, unit F and B
        ("gpipe", 8, 22, (8, 8, 8, 8)),
        ("1f1b", 8, 22, (4, 3, 2, 1)),
        ("gpipe", 4, 14, (4, 4, 4, 4)),
        ("1f1b", 4, 14, (4, 3, 2, 1)),
        ("1f1b", 16, 38, (4, 3, 2, 1)),
    ],
)
def test_seed_spec_goldens(schedule, m, makespan, peaks):
    res = sim(4, m, schedule)
    assert res.makespan == pytest.approx(makespan, abs=TOL)
    assert res.peak_activations == peaks
    assert res.bubble_s2 == pytest.approx(3 / (m + 3), abs=TOL)  # 27.27%, 42.86%, 15.79%


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_backward_twice_forward_keeps_the_bubble(schedule):
    res = sim(4, 8, schedule, 1.0, 2.0)  # makespan 33, bubble still 27.27%
    assert res.makespan == pytest.approx(33, abs=TOL)
    assert res.bubble_s2 == pytest.approx(6 / 22, abs=TOL)


CASES = [
    (schedule, p, m, t_f, t_b, 1)
    for schedule in ("gpipe", "1f1b")
    for p, m in [(1, 1), (1, 3), (2, 1), (3, 2), (4, 8), (5, 3), (6, 12)]
    for t_f, t_b in [(1.0, 1.0), (1.0, 2.0), (1.5, 0.5)]
] + [
    ("interleaved", p, m, t_f, t_b, v)
    for p, m, v in [(2, 4, 2), (3, 6, 3), (4, 8, 2), (4, 4, 4), (1, 3, 2)]
    for t_f, t_b in [(1.0, 1.0), (1.0, 2.0)]
]


@pytest.mark.parametrize("schedule, p, m, t_f, t_b, v", CASES)
def test_dependency_invariants(schedule, p, m, t_f, t_b, v):
    cfg = pp.PipelineConfig(p, m, schedule, t_f, t_b, v)
    res = pp.simulate(cfg)
    spans = res.spans
    n_virtual = p * v
    assert len(spans) == 2 * m * n_virtual
    for device, ops in timeline.by_resource(spans).items():
        assert len(ops) == 2 * m * v
        for a, b in itertools.pairwise(ops):  # a device never runs two ops at once
            assert b.start >= a.end - TOL
        # ... and it runs them in the schedule's order
        assert [s.op.key for s in ops] == [op.key for op in pp.stage_orders(cfg)[device]]
    for j in range(n_virtual):
        for mb in range(m):
            f, b = spans[("F", j, mb)], spans[("B", j, mb)]
            assert f.end - f.start == pytest.approx(t_f / v, abs=TOL)
            assert b.end - b.start == pytest.approx(t_b / v, abs=TOL)
            assert b.start >= f.end - TOL
            if j > 0:
                assert f.start >= spans[("F", j - 1, mb)].end - TOL
            if j < n_virtual - 1:
                assert b.start >= spans[("B", j + 1, mb)].end - TOL


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_makespan_closed_form(schedule):
    # (M + P - 1)(t_F + t_B): the pipeline fills in P-1 forward slots and drains in P-1 backward
    # slots around M full (F+B) steps.
    for p, m in itertools.product(range(1, 7), range(1, 11)):
        for t_f, t_b in [(1.0, 1.0), (1.0, 2.0)]:
            assert sim(p, m, schedule, t_f, t_b).makespan == pytest.approx(
                (m + p - 1) * (t_f + t_b), abs=TOL
            )


def test_peak_activations_1f1b_is_p_minus_s_and_gpipe_is_m():
    for p, m in [(2, 2), (4, 8), (5, 5), (6, 9)]:
        assert sim(p, m, "1f1b").peak_activations == tuple(p - s for s in range(p))
        assert sim(p, m, "gpipe").peak_activations == (m,) * p
    # fewer microbatches than stages: a stage can hold at most M
    assert sim(4, 2, "1f1b").peak_activations == (2, 2, 2, 1)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 16, 2), (4, 8, 4), (3, 9, 3)])
def test_interleaved_bubble_matches_formula(p, m, v):
    for t_f, t_b in [(1.0, 1.0), (1.0, 2.0)]:
        res = sim(p, m, "interleaved", t_f, t_b, v)
        assert res.bubble_s2 == pytest.approx((p - 1) / (v * m + p - 1), abs=TOL)
        assert res.bubble_s4 == pytest.approx(pp.bubble_fraction(p, m, "s4", v), abs=TOL)
    assert res.bubble_s2 < sim(p, m, "1f1b").bubble_s2  # interleaving shrinks the bubble


def test_simulated_bubble_equals_both_formulas():
    for p, m in itertools.product(range(1, 6), range(1, 9)):
        res = sim(p, m, "1f1b")
        assert res.bubble_s2 == pytest.approx(pp.bubble_fraction(p, m, "s2"), abs=TOL)
        assert res.bubble_s4 == pytest.approx(pp.bubble_fraction(p, m, "s4"), abs=TOL)


def test_pipeline_efficiency_seed_004_goldens():
    # seed 004 §6 pipeline_efficiency prints: 25.0 / 62.5 / 81.2 (81.25) / 90.6 (90.625) %
    got = [pp.pipeline_efficiency(4, m, convention="s4") for m in (4, 8, 16, 32)]
    assert got == pytest.approx([0.25, 0.625, 0.8125, 0.90625], abs=TOL)


def test_bubble_seed_002_goldens():
    # seed 002 ch7 (P-1)/(M+P-1): P=4, M=1..64 -> 75.0 / 60.0 / 42.9 / 27.3 / 15.8 / 8.6 / 4.5 %
    got = [round(100 * pp.bubble_fraction(4, m), 1) for m in (1, 2, 4, 8, 16, 32, 64)]
    assert got == [75.0, 60.0, 42.9, 27.3, 15.8, 8.6, 4.5]
    assert round(100 * pp.pipeline_efficiency(4, 16), 1) == 84.2  # seed 002 ch7 takeaway
    # seed 002 ch7 Exercise 1: 3/19 naive and 1F1B; seed 004 convention 3/16
    assert pp.bubble_fraction(4, 16) == pytest.approx(3 / 19, abs=TOL)
    assert pp.bubble_fraction(4, 16, "s4") == pytest.approx(0.1875, abs=TOL)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(stages=0),
        dict(microbatches=-1),
        dict(schedule="zigzag"),
        dict(forward_time=0.0),
        dict(backward_time=-1.0),
        dict(schedule="interleaved", virtual_stages=1),
        dict(schedule="interleaved", microbatches=6, virtual_stages=2),
        dict(schedule="1f1b", virtual_stages=2),
    ],
)
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        pp.simulate(pp.PipelineConfig(**kwargs))


def test_bad_formula_arguments_raise():
    with pytest.raises(ValueError, match="stages"):
        pp.pipeline_efficiency(0, 4)
    with pytest.raises(ValueError, match="convention"):
        pp.bubble_fraction(4, 8, convention="s3")


def test_seed_port_reproduces_the_seed_printout():
    # seed 002 ch7 pipeline_schedule_viz.py prints a naive "Bubble ratio: 68.6%" and corrupted
    # 1F1B rows.
    assert pipeline_seed.naive_bubble(4, 8) == pytest.approx(24 / 35, abs=TOL)
    grid = pipeline_seed.seed_report(4, 8)["one_f_one_b_grid"].splitlines()
    assert grid[2].startswith("GPU 0:   F0 F1 F2 F3 F4 F5 F6 F7 B2 B3  . B4 B5 B6 B7")
    assert grid[5].startswith("GPU 3:    .  .  . F0 F1 F2 F3 F4 F5 F6 F7 B6  .  . B7")
    assert "B0" not in "".join(grid) and "B1" not in "".join(grid)  # defect 4


def test_seed_naive_grid_places_ops_like_the_gpipe_simulation():
    # The seed's fill-drain grid is right (only its bubble formula is wrong): it must coincide
    # cell by cell with the dependency-driven GPipe schedule.
    for p, m in [(2, 3), (4, 8), (3, 5)]:
        cells = pipeline_seed.naive_cells(p, m)
        res = sim(p, m, "gpipe")
        for span in res.spans.values():
            assert cells[span.op.resource][round(span.start)] == span.op.label
        busy = sum(c != "." for row in cells for c in row)
        assert busy == 2 * p * m


@pytest.mark.parametrize("p, m", [(2, 2), (2, 8), (4, 4), (4, 16), (8, 8), (8, 32)])
@pytest.mark.parametrize("t_b", [0.5, 1.0, 2.0])
def test_zb_h1_reaches_the_papers_bubble_with_bounded_inputs(p, m, t_b):
    # Qi et al. 2023: ZB-H1 idles (P-1)(T_F + T_B - T_W) per device, with B and W the two halves
    # of the backward: (P-1) t_F; derived here from the makespan, not from predicted_bubble
    res = sim(p, m, "zb-h1", 1.0, t_b)
    assert res.makespan == pytest.approx(m * (1.0 + t_b) + (p - 1) * 1.0, abs=TOL)
    assert res.bubble_s2 == pytest.approx(pp.predicted_bubble(res.config), abs=TOL)
    # a stage input is held from F to W: at most (P - s) + (P - 1) on stage s, whatever M
    assert all(peak <= (p - s) + (p - 1) for s, peak in enumerate(res.peak_activations))
    kinds = sorted(span.op.key[0] for span in res.spans.values())
    assert kinds == ["B"] * (p * m) + ["F"] * (p * m) + ["W"] * (p * m)
