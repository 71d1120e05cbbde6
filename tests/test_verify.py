"""The equivalence matrix (jaxscale/verify.py): every strategy, auto and manual, on every
meaningful mesh, against the single-device reference -- and the same check catching a broken
strategy."""

import json

import pytest

from jaxscale import verify
from jaxscale.cli import main as cli_main

SMOKE = {("auto", "dp_fsdp_tp", "dp=2,fsdp=2,tp=2"), ("manual", "zero3", "fsdp=8")}


@pytest.fixture(scope="module")
def ref():
    return verify.reference()


def _param(case):
    marks = [pytest.mark.smoke] if (case.path, case.strategy, case.mesh) in SMOKE else []
    return pytest.param(case, id=f"{case.label}@{case.mesh}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in verify.all_cases()])
def test_strategy_matches_single_device_reference(case, ref):
    result = verify.check(case, ref)
    assert result.error is None, result.error
    assert result.passed, verify.format_matrix([result])
    # the trajectory is a real training run: the loss falls over the 10 steps
    assert ref.losses[-1] < ref.losses[0] - 0.5


@pytest.mark.smoke
def test_extra_pmean_bug_is_caught_and_is_n_times_too_large(ref):
    """check_vma: grads of replicated params are already summed; pmean-ing them again (pmap
    habit) leaves them 8x the mean. The same check that passes every strategy fails this one."""
    broken = verify.Case("manual", "dp", "dp=8", dp_variant="extra_pmean")
    result = verify.check(broken, ref)
    assert not result.passed
    assert result.grad_ratio > 1.0
    # the correct forms pass: "explicit" is the matrix's manual:dp case, and tests/test_manual.py
    # checks both correct variants and the bug's exact factor N directly


def test_verify_cli_prints_the_matrix(capsys):
    assert cli_main(["verify", "--only", "auto:fsdp@"]) == 2  # nothing matches: clear error
    assert "no case matches" in capsys.readouterr().err
    assert cli_main(["verify", "--only", "zero1 dp=8", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["strategy"], row["mesh"], row["stage"], row["passed"]) == ("zero1", "dp=8", 1, True)
