"""The pipeline executor (jaxscale/parallel/pp/): its program is the simulator's grid, the
executed grid has the closed-form bubble, the compiled step moves exactly the predicted
activations, and a broken schedule is caught by the equivalence check."""

import dataclasses

import pytest

from jaxscale import tolerances as tol
from jaxscale import verify
from jaxscale.bench import pipeline as bench_pp
from jaxscale.parallel import pp
from jaxscale.parallel.compose import Strategy, build
from jaxscale.sim import pipeline as sim

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))
CFG = verify.CFG.replace(n_layers=4)
REFS: dict = {}


@pytest.mark.parametrize("schedule, v", SCHEDULES)
def test_the_executor_runs_the_simulators_grid(schedule, v):
    plan = pp.make_plan(4, 8, schedule, v)
    cfg = sim.PipelineConfig(4, 8, schedule, 1.0, 2.0, v)
    assert plan.grid == tuple(tuple(row) for row in sim.schedule_grid(sim.simulate(cfg)))
    # every op of the grid is executed once, at the tick it starts
    ops = [
        (op.kind, op.microbatch, op.chunk * 4 + d)
        for t in plan.ticks
        for d, op in enumerate(t.ops)
        if op is not None
    ]
    per_mb = 3 if schedule == "zb-h1" else 2  # F, B (, W)
    assert len(ops) == len(set(ops)) == 8 * 4 * v * per_mb


@pytest.mark.parametrize("schedule, v", SCHEDULES)
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (8, 8)])
def test_executed_bubble_is_the_closed_form(schedule, v, p, m):
    plan = pp.make_plan(p, m, schedule, v)
    if schedule == "zb-h1":  # (P-1)/(3M+P-1) with t_B = 2 t_F, the paper's t_F = t_B' = t_W
        want = (p - 1) / (3 * m + p - 1)
    else:
        want = (p - 1) / (v * m + p - 1)
    assert plan.occupancy()["bubble"] == pytest.approx(want, abs=1e-12)
    # every activation and every input gradient crosses each of the vP-1 boundaries once
    assert plan.sends() == (m * (v * p - 1), m * (v * p - 1))


@pytest.mark.parametrize("schedule, v", SCHEDULES)
def test_what_is_compiled_stops_growing_with_m(schedule, v):
    """The steady state runs as one loop body: past the M at which a schedule has one, more
    microbatches add trips, not tick programs; every tick is still executed, in order."""
    for p in (2, 4):
        plans = {m: pp.make_plan(p, m, schedule, v) for m in (16, 32, 64)}
        assert (
            plans[16].compiled_ticks() == plans[32].compiled_ticks() == plans[64].compiled_ticks()
        )
        assert plans[64].compiled_ticks() < len(plans[64].ticks) / 4
        for plan in plans.values():
            covered = [
                i
                for seg in plan.segments()
                for i in range(seg.start, seg.start + seg.period * seg.reps)
            ]
            assert covered == list(range(len(plan.ticks)))
            for seg in plan.segments():  # a loop's trips are the same program
                unit = [pp.tick_shape(t) for t in plan.ticks[seg.start : seg.start + seg.period]]
                for r in range(seg.reps):
                    start = seg.start + r * seg.period
                    got = [pp.tick_shape(t) for t in plan.ticks[start : start + seg.period]]
                    assert got == unit


def test_stash_is_m_for_gpipe_and_bounded_by_the_stages_for_1f1b():
    for m in (4, 8, 16):
        assert pp.make_plan(4, m, "gpipe").stash_slots == m
        # 1F1B holds P - s microbatches on stage s between F and B; stage 0 stashes nothing
        # (its input is the tokens), so the busiest stash is stage 1's: its P - 1, plus the next
        # input, which arrives before a B frees a slot -- P, whatever M
        assert pp.make_plan(4, m, "1f1b").stash_slots == 4


def test_schedules_and_meshes_are_checked():
    tcfg = verify.TCFG
    for strategy, fragment in (
        (Strategy.parse("manual:dp+1f1b", "pp=2,dp=4", microbatches=3), "--microbatches 3"),
        (Strategy.parse("manual:dp+1f1b", "dp=8"), "needs a pipe axis"),
        (Strategy.parse("manual:dp+interleaved", "pp=2,dp=4", 4, 1), "--virtual-stages"),
        (Strategy.parse("manual:dp+interleaved", "pp=4,dp=2", 2, 2), "divisible by pp=4"),
        (Strategy.parse("auto", "pp=2,dp=4"), "pp=2 needs a pipeline schedule"),
        (Strategy.parse("manual:dp+1f1b", "pp=4,dp=2", 2), "n_layers=2 does not split"),
    ):
        with pytest.raises(ValueError, match=fragment):
            build(strategy, verify.CFG, tcfg)
    with pytest.raises(ValueError, match="microbatches are the gradient accumulation"):
        build(Strategy.parse("manual:dp+1f1b", "pp=2,dp=4", 2), CFG, tcfg.replace(grad_accum=2))


def test_compiled_step_moves_exactly_the_predicted_activations():
    row = bench_pp.pipe_row("manual:dp+1f1b", "pp=2,dp=4", 4, 1, CFG, verify.TCFG)
    # one collective-permute per tick that sends, forward and backward
    plan = pp.make_plan(2, 4, "1f1b")
    assert row.permutes == sum(bool(t.fwd) + bool(t.bwd) for t in plan.ticks)
    # 2 M (P-1) transfers of [B_m, T, D] = [16/4/4, 32, 64] f32, derived independently
    assert row.permute_bytes == 2 * 4 * 1 * (1 * 32 * 64 * 4)
    assert row.bubble == pytest.approx(1 / 5)


@pytest.mark.slow
@pytest.mark.first_line
@pytest.mark.parametrize("text", ["manual:tp+1f1b", "manual:tp+zb-h1"])
def test_a_long_steady_state_loop_equals_the_reference(text):
    """M = 8 on two stages: most of the schedule is one loop body run for many trips."""
    case = verify.Case(Strategy.parse(text, "pp=2,tp=4", microbatches=8), n_layers=4)
    plan = pp.make_plan(2, 8, text.split("+")[1])
    assert max(seg.reps for seg in plan.segments()) >= 5
    result = verify.check(case, verify.reference_for(case, REFS))
    assert result.passed, verify.format_matrix([result])


def _case(text="manual:dp+1f1b", mesh="pp=2,dp=4", m=2):
    return verify.Case(Strategy.parse(text, mesh, microbatches=m), n_layers=4)


def _check_with_plan(monkeypatch, broken):
    monkeypatch.setattr(pp, "make_plan", lambda *a, **k: broken)
    case = _case()
    return verify.check(case, verify.reference_for(case, REFS))


@pytest.mark.slow  # a dropped ppermute (below) is the fast suite's broken plan
@pytest.mark.first_line
def test_a_backward_before_its_input_arrives_is_caught(monkeypatch):
    good = pp.make_plan(2, 2, "1f1b")
    grid = [list(row) for row in good.grid]
    last = grid[1]
    f0 = next(t for t, c in enumerate(last) if c and c.kind == "F" and c.microbatch == 0)
    b0 = [t for t, c in enumerate(last) if c and c.kind == "B" and c.microbatch == 0]
    cells = [last[t] for t in b0] + [last[f0]]
    for t in (f0, *b0):
        last[t] = None
    for t, cell in enumerate(cells):  # B0 at ticks 0-1, before F0 on stage 0 has sent anything
        last[t] = cell
    result = _check_with_plan(monkeypatch, pp.make_plan(2, 2, "1f1b", grid=grid))
    assert result.error is None and result.grads_ok is False and not result.passed


def test_a_dropped_ppermute_is_caught(monkeypatch):
    good = pp.make_plan(2, 2, "1f1b")
    first_send = next(i for i, t in enumerate(good.ticks) if t.fwd)
    ticks = list(good.ticks)
    ticks[first_send] = dataclasses.replace(ticks[first_send], fwd=(), fwd_recv=(None, None))
    result = _check_with_plan(monkeypatch, dataclasses.replace(good, ticks=tuple(ticks)))
    assert result.error is None and result.loss_ok is False and not result.passed


@pytest.mark.slow  # the fast suite's pipeline verify case passes the same harness
@pytest.mark.first_line
def test_the_unbroken_plan_passes_the_same_check(monkeypatch):
    result = _check_with_plan(monkeypatch, pp.make_plan(2, 2, "1f1b"))
    assert result.passed, verify.format_matrix([result])


@pytest.mark.parametrize(
    "text, m, v",
    [
        ("manual:dp+1f1b", 2, 1),
        pytest.param(
            "manual:dp+interleaved", 2, 2, marks=[pytest.mark.slow, pytest.mark.first_line]
        ),
    ],
)
def test_the_forward_only_loss_equals_the_reference(text, m, v):
    """`Built.loss` (eval) runs the forwards alone: the same loss as one device."""
    import jax

    from jaxscale.parallel import auto

    tcfg = verify.TCFG
    built = build(Strategy.parse(text, "pp=2,dp=4", m, v), CFG, tcfg)
    params = auto.init_state(CFG, tcfg)["params"]
    batch = verify.batches(tcfg, 1)[0]
    want = float(auto.loss_fn(params, batch, CFG, None))
    with jax.set_mesh(built.mesh):
        got = float(
            built.loss(jax.device_put(params, built.state_shardings["params"]), built.put(batch))
        )
    assert got == pytest.approx(want, rel=tol.RTOL, abs=tol.ATOL)


@pytest.mark.slow
@pytest.mark.first_line
def test_1f1b_temporaries_stay_flat_as_m_grows_while_gpipes_grow_by_the_stash():
    """Compiler temporaries (memory_analysis) at M = 4 and 8, one microbatch of 32 rows x 32
    tokens per data shard: GPipe stashes every microbatch's stage input, so 4 more microbatches
    add 4 activations [32, 32, 64] f32; 1F1B's stash is P slots whatever M, so doubling M must
    not add even one activation."""
    act = 32 * 32 * verify.CFG.d_model * 4
    _, (m4, m8) = bench_pp.sweep(
        verify.CFG, verify.TCFG, (4, 8), (("gpipe", 1), ("1f1b", 1)), check_m=None, micro_rows=32
    )
    gpipe = m8["gpipe"]["temp_bytes"] - m4["gpipe"]["temp_bytes"]
    one_f_one_b = m8["1f1b"]["temp_bytes"] - m4["1f1b"]["temp_bytes"]
    assert gpipe >= 4 * act
    assert abs(one_f_one_b) < act


@pytest.mark.slow
@pytest.mark.first_line
def test_bench_pipeline_command_checks_rows_and_sweeps_in_workers(tmp_path, capsys):
    """`jaxscale bench pipeline` as `make bench` runs it (points in worker processes): every
    checked row equal to the reference, exact permute bytes and bubble; the sweep's record."""
    import json

    from jaxscale.cli import main as cli_main

    assert cli_main(["bench", "pipeline", "--sweep", "8", "--no-plot", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "As M grows" in out and "✗" not in out
    record = json.loads((tmp_path / "bench_pipeline.json").read_text())
    assert [(r["schedule"], r["microbatches"]) for r in record["rows"]] == [
        ("gpipe", 1),
        ("gpipe", 8),
        ("1f1b", 8),
        ("interleaved", 8),
        ("zb-h1", 8),
    ]
    assert all(r["passed"] and r["bubble_ok"] and r["permute_ok"] for r in record["rows"])
    (m8,) = record["sweep"]
    assert m8["1f1b"]["compiled_ticks"] == pp.make_plan(2, 8, "1f1b").compiled_ticks()
    assert m8["1f1b"]["compile_cpu_s"] > 0
    assert cli_main(["bench", "pipeline", "--dry-run"]) == 0
    assert "M=1,4,8,16,32" in capsys.readouterr().out  # the default sweep
