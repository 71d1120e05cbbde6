"""A strategy is parsed once: its parts, one per kind, and its mesh as a MeshSpec."""

import pytest

from jaxscale.mesh import MeshSpec
from jaxscale.parallel.strategy import Strategy


@pytest.mark.parametrize(
    "text, kind",
    [
        ("manual:zero3+zero1", "data"),
        ("manual:dp+zero2", "data"),
        ("manual:tp+tp_sp", "tensor"),
        ("manual:dp+1f1b+gpipe", "pipeline"),
        ("manual:dp+ep+ep", "experts"),
    ],
)
def test_two_parts_of_one_kind_are_refused(text, kind):
    """Before, the last part silently won (zero3+zero1 ran ZeRO-1)."""
    with pytest.raises(ValueError, match=f"both {kind} parts"):
        Strategy.parse(text, "dp=8")


def test_a_schedule_given_twice_must_agree():
    strategy = Strategy.parse("manual:dp+gpipe", "pp=2,dp=4", microbatches=4)
    assert strategy.with_schedule("gpipe") == strategy
    with pytest.raises(ValueError, match="--schedule 1f1b conflicts with gpipe"):
        strategy.with_schedule("1f1b")
    auto = Strategy.parse("auto", "pp=2,dp=4", microbatches=4).with_schedule("1f1b")
    assert (auto.path, auto.zero, auto.schedule, auto.microbatches) == ("manual", 0, "1f1b", 4)


def test_the_mesh_is_parsed_once_and_printed_as_written():
    strategy = Strategy.parse("manual:dp+1f1b", "pp=2,dp=4")
    assert isinstance(strategy.mesh, MeshSpec)
    assert strategy.mesh.axes == (("data", 4), ("pipe", 2))  # canonical order inside
    assert f"{strategy.mesh:<12}|" == "pp=2,dp=4   |"  # the user's spelling outside
    assert strategy.label() == "manual:dp+1f1b(M=1)"
    with pytest.raises(ValueError, match="--mesh dp=x"):
        Strategy("dp=x")


@pytest.mark.parametrize(
    "mesh, label",
    [
        ("pp=2,dp=4", "manual:dp+1f1b(M=4)"),
        ("pp=2,dp=2,tp=2", "manual:dp+tp+1f1b(M=4)"),
        ("pp=2,fsdp=2,tp=2", "manual:zero3+tp+1f1b(M=4)"),
    ],
)
def test_a_schedule_on_the_auto_path_takes_the_parts_the_mesh_implies(mesh, label):
    """`--mesh pp=2,dp=2,tp=2 --schedule 1f1b` needs no --strategy manual:dp+tp: the mesh says
    what each axis is for."""
    strategy = Strategy.parse("auto", mesh, microbatches=4).with_schedule("1f1b")
    assert strategy.label() == label
