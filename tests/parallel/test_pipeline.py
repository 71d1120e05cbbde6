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
    checked row equal to the reference, exact permute bytes and bubble; the sweep's record;
    with --time, each checked row profiled: step = compute + collectives + idle."""
    import json

    from jaxscale.cli import main as cli_main

    argv = ["bench", "pipeline", "--sweep", "8", "--no-plot", "--out", str(tmp_path)]
    assert cli_main([*argv, "--time", "--time-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "As M grows" in out and "✗" not in out and "tick bubble x step" in out
    record = json.loads((tmp_path / "bench_pipeline.json").read_text())
    assert [(r["schedule"], r["microbatches"]) for r in record["rows"]] == [
        ("gpipe", 1),
        ("gpipe", 8),
        ("1f1b", 8),
        ("interleaved", 8),
        ("zb-h1", 8),
    ]
    assert all(r["passed"] and r["bubble_ok"] and r["permute_ok"] for r in record["rows"])
    for r in record["rows"]:
        parts = r["compute_ms"] + r["collective_ms"] + r["idle_ms"]
        assert r["compute_ms"] > 0 and parts == pytest.approx(r["step_ms"], rel=1e-6)
    (m8,) = record["sweep"]
    assert m8["1f1b"]["compiled_ticks"] == pp.make_plan(2, 8, "1f1b").compiled_ticks()
    assert m8["1f1b"]["compile_cpu_s"] > 0
    assert cli_main(["bench", "pipeline", "--dry-run"]) == 0
    assert "M=1,4,8,16,32" in capsys.readouterr().out  # the default sweep


def _interleaved_orders(p: int, v: int, m: int) -> dict:
    """Megatron-LM's interleaved 1F1B, stated as nested loops: microbatches in groups of P; a
    group runs through chunks 0..v-1 forward and v-1..0 backward, P microbatches per chunk.
    Device d warms up with 2 (P - d - 1) + (v - 1) P forwards, then alternates F and B."""
    fwd = [(c, g * p + i) for g in range(m // p) for c in range(v) for i in range(p)]
    bwd = [(c, g * p + i) for g in range(m // p) for c in reversed(range(v)) for i in range(p)]
    orders = {}
    for d in range(p):
        warm = min(2 * (p - d - 1) + (v - 1) * p, m * v)
        order = [("F", *op) for op in fwd[:warm]]
        for k in range(m * v - warm):
            order += [("F", *fwd[warm + k]), ("B", *bwd[k])]
        orders[d] = order + [("B", *op) for op in bwd[m * v - warm :]]
    return orders


def _asap_ticks(p: int, v: int, m: int) -> dict:
    """(device, start tick) -> (kind, chunk, microbatch): each device runs its order as soon as
    its last op is done and the op's inputs exist (an F takes 1 tick, a B 2). Layer chunk c on
    device d is virtual stage j = c P + d: F(j) needs F(j - 1); B(j) needs F(j) and B(j + 1)."""
    n = p * v
    orders, head, free, end, table = _interleaved_orders(p, v, m), [0] * p, [0] * p, {}, {}
    while any(head[d] < len(orders[d]) for d in range(p)):
        moved = False
        for d in range(p):
            if head[d] == len(orders[d]):
                continue
            kind, c, mb = orders[d][head[d]]
            j = c * p + d
            deps = [("F", j - 1, mb)] if kind == "F" and j > 0 else []
            if kind == "B":
                deps = [("F", j, mb)] + ([("B", j + 1, mb)] if j < n - 1 else [])
            if any(dep not in end for dep in deps):
                continue
            start = max([free[d]] + [end[dep] for dep in deps])
            end[(kind, j, mb)] = free[d] = start + (1 if kind == "F" else 2)
            table[(d, start)] = (kind, c, mb)
            head[d] += 1
            moved = True
        assert moved, "the stated schedule deadlocks"
    return table


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (2, 2, 8), (4, 2, 8)])
def test_the_interleaved_plan_runs_megatrons_chunks_and_its_transfers_wrap_around(p, v, m):
    """The interleaved plan's (device, tick) -> (op, chunk, microbatch) table equals Megatron's
    schedule stated independently, and replaying the plan's transfers into per-device buffers
    (a plain-Python model of the executor's stash and gradient buffers) delivers every F the
    activation of virtual stage j - 1 and every B the gradient of stage j + 1, for its own
    microbatch. Device P-1's chunk c feeds device 0's chunk c + 1 (and gradients wrap back):
    a transfer landing in the wrong chunk, or a slot overwritten while live, fails."""
    plan = pp.make_plan(p, m, "interleaved", v)
    got = {
        (d, t.index): (op.kind, op.chunk, op.microbatch)
        for t in plan.ticks
        for d, op in enumerate(t.ops)
        if op is not None
    }
    assert got == _asap_ticks(p, v, m)

    n = p * v
    stash = [{} for _ in range(p)]  # device -> {(chunk, slot): what lies there}
    grads = [{} for _ in range(p)]
    for t in plan.ticks:
        sent_fwd, sent_bwd = {}, {}
        for d, op in enumerate(t.ops):
            if op is None:
                continue
            j = op.chunk * p + d
            if j > 0:  # its input: stage j - 1's output, for F and again for B's recompute
                assert stash[d].get((op.chunk, op.stash_slot)) == ("act", j - 1, op.microbatch)
            if op.kind == "B" and j < n - 1:
                assert grads[d].get((op.chunk, op.grad_slot)) == ("grad", j + 1, op.microbatch)
            if op.kind == "F" and j < n - 1:
                sent_fwd[d] = ("act", j, op.microbatch)
            if op.kind == "B" and j > 0:
                sent_bwd[d] = ("grad", j, op.microbatch)
        assert sorted(src for src, _ in t.fwd) == sorted(sent_fwd)
        assert sorted(src for src, _ in t.bwd) == sorted(sent_bwd)
        for pairs, recv, sent, buffers, step in (
            (t.fwd, t.fwd_recv, sent_fwd, stash, 1),
            (t.bwd, t.bwd_recv, sent_bwd, grads, -1),
        ):
            for src, dst in pairs:
                assert dst == (src + step) % p
                chunk, slot = recv[dst]
                buffers[dst][(chunk, slot)] = sent[src]
    # each microbatch's loss: the last virtual stage ran F and B for all M
    last = [(k, mb) for (d, _), (k, c, mb) in got.items() if c * p + d == n - 1]
    assert sorted(last) == sorted([("F", mb) for mb in range(m)] + [("B", mb) for mb in range(m)])
