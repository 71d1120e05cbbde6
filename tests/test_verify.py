"""The equivalence matrix (jaxscale/verify.py): every strategy, auto and manual, on every
meaningful mesh (the pipeline schedules x compositions as a cover, `PIPE_COVER`), against the
single-device reference -- and each of its three checks (first-step loss, first-step gradients,
trajectory) failing for a strategy broken in just that respect."""

import json
import re

import numpy as np
import pytest

from jaxscale import verify
from jaxscale.cli import main as cli_main
from jaxscale.parallel import zero
from jaxscale.parallel.compose import Strategy
from jaxscale.tolerances import BF16_SAME_ATOL, BF16_SAME_RTOL

SMOKE = {"auto:dp_fsdp_tp@dp=2,fsdp=2,tp=2", "manual:zero3@fsdp=8"}
REFS: dict = {}  # one single-device reference per training variant, shared by the module


def _id(case):
    return f"{case.label}@{case.mesh}"


# The fast suite runs every dense strategy and training variant once, on the first mesh the
# list gives it, and one pipeline case; the other meshes, the other pipeline cases (10-30 s
# each on 2 cores) and the MoE cases are `slow`. CI's second Python line (the newest jax) runs,
# of the slow ones, the four most composed (`SECOND_LINE`), and of the fast ones a cover
# (`SECOND_LINE_FAST`, below); the rest are `first_line` (docs/testing.md).
PIPE_FAST = {"manual:dp+1f1b(M=4) L=8@pp=2,dp=4"}
# context parallelism: each form once in the fast suite (ring, gather and Ulysses alone on
# cheap meshes); its compositions, splits and variants are slow
CP_FAST = {
    "manual:dp+cp_ring@dp=2,cp=4",
    "manual:cp_gather@cp=8",
    "manual:cp_ulysses@cp=8",
    "auto:dp_cp@dp=2,cp=4",
}
FIRST_MESH = {}
for _c in verify.CASES:
    FIRST_MESH.setdefault(_c.label, _id(_c))

# MoE cases (15-25 s each) are slow; the fast suite checks the MoE forward sharded
# (tests/model/test_moe.py: routing terms and the expert-parallel layer against the reference)
MOE_FAST: set[str] = set()
SECOND_LINE = {
    # the longest schedule composed with ZeRO-1 and TP
    "manual:zero1+tp+interleaved(M=4 v=2) L=8@pp=2,dp=2,tp=2",
    # pipeline, experts and tensor parallelism in one program
    "manual:ep+tp+zb-h1(M=4) L=4 E=8 k=2 cf=2@pp=2,ep=2,tp=2",
    # experts on three axes, manual and auto (GSPMD's choices are what move with the version)
    "manual:zero3+ep+tp E=8 k=2 cf=2@ep=2,fsdp=2,tp=2",
    "auto:fsdp_ep_tp E=8 k=2 cf=2@ep=2,fsdp=2,tp=2",
}


# The fast cases CI's second line runs: a cover in which every part of a fast case (each manual
# and auto strategy, gradient buckets, accumulation, SGD, bf16) runs at least once, composed.
# The other fast cases are `first_line`: on the newest jax each costs 5-25 s of its slower
# compiles and checks no part the cover does not. The pipeline counts as one part there: its
# schedules are plans run by one tick executor, and the second line runs two of them, composed
# (SECOND_LINE: interleaved's forward and backward ticks, ZB-H1's split backward).
SECOND_LINE_FAST = {
    "manual:zero3+tp_sp@dp=2,fsdp=2,tp=2",
    "manual:zero2+tp accum=2@dp=2,tp=4",
    "manual:dp+tp buckets=4 L=4@dp=2,tp=4",
    "manual:zero3+tp [bfloat16]@fsdp=4,tp=2",
    "manual:zero3+tp sgd@fsdp=4,tp=2",
    "manual:zero1+tp@dp=4,tp=2",
    "manual:tp_gather@tp=8",
    "manual:dp+cp_ring@dp=2,cp=4",
    "manual:cp_gather@cp=8",
    "manual:cp_ulysses@cp=8",
    "auto:dp_fsdp_tp [bfloat16]@dp=2,fsdp=2,tp=2",
    "auto:dp_cp@dp=2,cp=4",
}
SHAPE_WORDS = ("L", "E", "k", "cf", "every")  # a variant's model shape, not a strategy part


def _parts(case) -> set[str]:
    """What a case composes: `kind:part` for each strategy part and training variant."""
    kind, rest = case.label.split(":", 1)
    head, *variants = re.sub(r"\(.*?\)", "", rest).split(" ")  # "(M=4 v=2)": the schedule's
    split = head.split("+" if kind == "manual" else "_")  # manual:zero3+tp_sp, auto:dp_fsdp
    parts = {"pipeline" if p == case.strategy.schedule else p for p in split}
    parts |= {v.split("=")[0] for v in variants if v.split("=")[0] not in SHAPE_WORDS}
    return {f"{kind}:{p}" for p in parts}


def test_the_second_lines_cases_are_in_the_matrix():
    """A renamed case must not silently leave CI's second line with fewer cases."""
    assert SECOND_LINE <= {_id(c) for c in verify.CASES}


def test_the_second_line_runs_every_part_of_the_fast_cases():
    fast = [c for c in IN_PROCESS if not any(m.name == "slow" for m in _param(c).marks)]
    assert SECOND_LINE_FAST <= {_id(c) for c in fast}
    second = [c for c in verify.CASES if _id(c) in SECOND_LINE_FAST | SECOND_LINE]
    covered = set().union(*map(_parts, second))
    assert set().union(*map(_parts, fast)) <= covered
    # the parts are read from the labels
    assert {"manual:zero3", "manual:tp_sp", "manual:accum", "auto:[bfloat16]"} <= covered
    assert _parts(next(c for c in fast if c.strategy.schedule)) == {"manual:dp", "manual:pipeline"}


# The dense pipeline product (`verify.PIPE_SCHEDULES` x four compositions on their meshes, 16
# cases): `jaxscale verify` runs all of it; the suite runs a cover in which every schedule runs
# under two compositions or more and every composition under two schedules or more (9 of 16).
# Each schedule meets the other parts in the matrix's MoE, context and 16-device pipeline cases
# too (docs/testing.md, "What the slow suite runs once").
COMPOSITIONS = ("dp", "zero3", "tp", "zero1+tp")
PIPE_COVER = {
    ("dp", "1f1b"),
    ("dp", "zb-h1"),
    ("zero3", "interleaved"),
    ("zero3", "zb-h1"),
    ("tp", "gpipe"),
    ("tp", "interleaved"),
    ("zero1+tp", "gpipe"),
    ("zero1+tp", "1f1b"),
    ("zero1+tp", "interleaved"),
}


def _composed(case):
    """(composition, schedule) of a case of the dense pipeline product, else None."""
    sched = case.strategy.schedule
    if not sched or case.model or case.compute_dtype != "float32" or case.mesh == "pp=8":
        return None
    comp = case.label.split("(")[0].removeprefix("manual:").removesuffix("+" + sched)
    return (comp, sched) if comp in COMPOSITIONS else None


def test_the_pipeline_cover_holds_each_schedule_and_composition_twice():
    product = {_composed(c) for c in verify.CASES} - {None}
    assert product == {(c, s) for c in COMPOSITIONS for s in verify.PIPE_SCHEDULES}
    assert PIPE_COVER <= product
    for sched in verify.PIPE_SCHEDULES:
        assert sum(s == sched for _, s in PIPE_COVER) >= 2, sched
    for comp in COMPOSITIONS:
        assert sum(c == comp for c, _ in PIPE_COVER) >= 2, comp
    kept = {_id(c) for c in IN_PROCESS}
    assert PIPE_FAST | SECOND_LINE <= kept


def _param(case):
    marks = [pytest.mark.smoke] if _id(case) in SMOKE else []
    pipeline_slow = case.strategy.schedule and _id(case) not in PIPE_FAST
    other_mesh = not case.strategy.schedule and FIRST_MESH[case.label] != _id(case)
    context_slow = case.strategy.mesh.size("context") > 1 and _id(case) not in CP_FAST
    if pipeline_slow or other_mesh or context_slow or (case.model and _id(case) not in MOE_FAST):
        marks.append(pytest.mark.slow)
        if _id(case) not in SECOND_LINE:
            marks.append(pytest.mark.first_line)
    elif _id(case) not in SECOND_LINE_FAST:
        marks.append(pytest.mark.first_line)
    return pytest.param(case, id=_id(case), marks=marks)


# the cases on more devices than the suite's 8 run in a process of their own (below)
IN_PROCESS = [c for c in verify.CASES if c.n_devices <= 8 and _composed(c) in PIPE_COVER | {None}]


@pytest.mark.parametrize("case", [_param(c) for c in IN_PROCESS])
def test_strategy_matches_single_device_reference(case):
    ref = verify.reference_for(case, REFS)
    result = verify.check(case, ref)
    assert result.error is None, result.error
    assert result.passed, verify.format_matrix([result])
    # the trajectory is a real training run: the loss falls over the 10 steps
    assert ref.losses[-1] < ref.losses[0] - 0.5


@pytest.mark.parametrize("text, mesh", [("auto", "fsdp=8"), ("manual:zero3+tp", "fsdp=4,tp=2")])
def test_a_strategys_own_init_is_the_references_initial_state(text, mesh):
    """verify starts every case from the reference's initial state placed in the case's layout
    (one compile fewer per case); the strategies' own init (what `train` runs) must be that very
    state, bit for bit, in its own layout."""
    import jax
    import numpy as np

    from jaxscale.parallel.compose import build

    ref = verify.reference_for(verify.CASES[0], REFS)
    built = build(Strategy.parse(text, mesh), verify.CFG, verify.TCFG)
    with jax.set_mesh(built.mesh):
        state = built.init()
    assert jax.tree.structure(state) == jax.tree.structure(ref.initial)
    for got, want in zip(
        jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(ref.initial), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    wq = state["params"]["blocks"]["wq_DHK"]
    assert wq.sharding.is_equivalent_to(built.state_shardings["params"]["blocks"]["wq_DHK"], 4)


@pytest.mark.smoke
def test_gradient_check_catches_the_extra_pmean(extra_pmean):
    """check_vma: grads of replicated params are already summed; pmean-ing them again (pmap
    habit) leaves them 8x the mean. The loss is right; the gradients are not."""
    case = verify.Case(Strategy.parse("manual:dp", "dp=8"))
    result = verify.check(case, verify.reference_for(case, REFS))
    assert result.loss_ok and result.grads_ok is False and not result.passed
    assert result.grad_ratio > 1.0
    # the correct forms pass: "explicit" is the matrix's manual:dp case, and
    # tests/lessons/test_data_parallel.py checks both correct forms and the bug's exact factor N


def test_loss_check_catches_a_summed_instead_of_averaged_loss(monkeypatch):
    """The logged loss psum'd over the 8 data shards instead of averaged: gradients and
    training are right, the first-step loss (and the loss trajectory) is 8x."""
    real = zero.loss_and_grads

    def summed(*args, **kw):
        loss, grads = real(*args, **kw)
        return loss * kw["n"], grads  # = psum of the shards' mean losses

    monkeypatch.setattr(zero, "loss_and_grads", summed)
    case = verify.Case(Strategy.parse("manual:zero1", "dp=8"))
    result = verify.check(case, verify.reference_for(case, REFS))
    assert result.loss_ok is False and result.grads_ok and not result.passed


def test_trajectory_check_catches_an_update_that_is_never_applied(monkeypatch):
    """ZeRO-1 computing its update but returning the old parameters: the first step's loss and
    gradients are right (they come before the update); only the trajectory can tell."""
    real = zero.update

    def lost(stage, tx, grads, opt_state, params, specs, axes):
        _, opt_state = real(stage, tx, grads, opt_state, params, specs, axes)
        return params, opt_state

    monkeypatch.setattr(zero, "update", lost)
    case = verify.Case(Strategy.parse("manual:zero1", "dp=8"))
    result = verify.check(case, verify.reference_for(case, REFS))
    assert result.loss_ok and result.grads_ok and result.traj_ok is False
    assert not result.passed


def test_bad_strategies_are_refused_with_a_message():
    for strategy, fragment in (
        (Strategy.parse("manual:zero3", "fsdp=4,tp=2"), "tp=2 is unused by manual:zero3"),
        (Strategy.parse("manual:zero2+tp", "tp=8"), "shards over the data axes"),
        (Strategy("pp=2,dp=4"), "pp=2 needs a pipeline schedule"),
        (Strategy("ep=2,dp=4"), "ep=2 needs a mixture-of-experts"),
    ):
        result = verify.check(verify.Case(strategy), verify.reference_for(verify.CASES[0], REFS))
        assert result.error and fragment in result.error, result.error
    with pytest.raises(ValueError, match="unknown part 'zero9'"):
        Strategy.parse("manual:zero9", "dp=8")


def test_verify_cli_prints_the_matrix(capsys):
    assert cli_main(["verify", "--only", "auto:fsdp@"]) == 2  # nothing matches: clear error
    assert "matches no case" in capsys.readouterr().err
    assert cli_main(["verify", "--only", "manual:zero1 dp=8", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()  # JSON lines: one per case, as it ends
    row = json.loads(line)
    assert (row["strategy"], row["mesh"], row["stage"], row["passed"]) == ("zero1", "dp=8", 1, True)
    assert row["loss_ok"] and row["grads_ok"] and row["traj_ok"]


def test_the_bf16_same_precision_rule_judges_errors_against_the_f32_twin():
    """vs-bf16 cases: an element may be wrong by the one-device bf16 run's own error (measured
    against the f32 model) plus the band, on either side of the true value; no more."""
    truth = np.array([1.0, 1.0, 1.0])
    ref = np.array([1.05, 1.0, 0.98])  # the one-device bf16 run's errors: 5%, 0, 2%
    band = BF16_SAME_ATOL + BF16_SAME_RTOL * np.abs(ref)
    opposite = np.array([0.95, 1.0, 1.02])  # as far off as the reference, on the other side
    assert verify._ratio(opposite, ref, True, True, truth) == 0.0
    assert verify._ratio(opposite, ref, True, True) > 1  # the old rule: |g - r| = 2x the error
    worse = np.array([1.05, 1.0 + 2 * band[1], 0.98])  # exact where the reference is exact
    assert verify._ratio(worse, ref, True, True, truth) == pytest.approx(2.0)


@pytest.mark.slow
@pytest.mark.first_line
def test_the_sixteen_device_case_runs_in_verify_by_default():
    """`jaxscale verify` asks for 16 simulated devices unless the user set a count: its
    four-axis case (dp x pp x cp x tp, each 2) passes there, the 8-device cases take the first
    8 of them."""
    import os
    import subprocess
    import sys

    (case,) = [c for c in verify.CASES if c.n_devices == 16]
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    only = ["--only", case.mesh]
    out = subprocess.run(
        [sys.executable, "-m", "jaxscale", "verify", *only, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1 and rows[0]["passed"], rows


@pytest.mark.slow  # two cases checked
@pytest.mark.first_line
def test_verify_prints_each_case_as_it_finishes(monkeypatch, capsys):
    """`verify --json` streams: when the second case starts, the first case's JSON line is
    already out (a run killed midway keeps what finished); the table form prints its rows the
    same way, through the same callback."""
    two = ("manual:zero1", "manual:zero2")
    cases = [c for c in verify.CASES if c.mesh == "dp=8" and c.label in two]
    assert len(cases) == 2, [c.label for c in verify.CASES if c.mesh == "dp=8"]
    monkeypatch.setattr(verify, "CASES", cases)
    seen = []  # JSON lines out when each check starts
    real = verify.check

    def check(case, *a, **k):
        seen.append(len([x for x in capsys.readouterr().out.splitlines() if x.startswith("{")]))
        return real(case, *a, **k)

    monkeypatch.setattr(verify, "check", check)
    assert cli_main(["verify", "--only", "dp=8", "--json"]) == 0
    assert seen == [0, 1]
