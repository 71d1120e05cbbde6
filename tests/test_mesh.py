"""MeshSpec parser: named errors, aliases, -1 fill, and property-based round trips."""

import math

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxscale.mesh import MESH_AXES, MeshSpec, MeshSpecError, build_mesh, parse_mesh

pytestmark = pytest.mark.smoke

SHORT = {
    "data": "dp",
    "pipe": "pp",
    "fsdp": "fsdp",
    "expert": "ep",
    "context": "cp",
    "tensor": "tp",
}
LONG = {a: a for a in SHORT}


def test_parse_canonical_order_tensor_innermost():
    spec = parse_mesh("tp=2,dp=2,fsdp=2")
    assert spec.names == ("data", "fsdp", "tensor")
    assert spec.shape == (2, 2, 2)


def test_aliases_mean_the_same_axis():
    assert parse_mesh("dp=2,tp=4") == parse_mesh("data=2,tensor=4")
    assert parse_mesh("pp=2,ep=4") == parse_mesh("pipe=2,expert=4")


def test_fill_axis():
    assert parse_mesh("tp=2,dp=-1").resolve(8).shape == (4, 2)


@pytest.mark.parametrize(
    "text, n, fragment",
    [
        ("foo=2", 8, "unknown mesh axis 'foo'"),
        ("dp=two", 8, "must be an integer"),
        ("dp=2.5", 8, "must be an integer"),
        ("dp=0", 8, "must be positive"),
        ("dp=-2", 8, "must be positive"),
        ("dp=-1,tp=-1", 8, "at most one axis may be -1"),
        ("dp=2,tp=2", 8, "uses 4 devices but 8 are available"),
        ("dp=3,tp=-1", 8, "dp=3 does not divide 8 devices"),
        ("dp8", 8, "has no size"),
        ("", 8, "empty mesh spec"),
        ("dp=2,data=4", 8, "given twice"),
    ],
)
def test_errors_name_the_problem(text, n, fragment):
    with pytest.raises(MeshSpecError, match=fragment):
        parse_mesh(text).resolve(n)


def test_product_error_suggests_a_valid_alternative():
    with pytest.raises(MeshSpecError, match=r"try dp=4,tp=2"):
        parse_mesh("dp=2,tp=2").resolve(8)


def _factorizations(n: int):
    """Strategy: a dict axis -> size (>1 or chosen) whose product is n."""

    @st.composite
    def build(draw):
        axes = draw(st.lists(st.sampled_from(MESH_AXES), min_size=1, max_size=6, unique=True))
        remaining, sizes = n, {}
        for axis in axes[:-1]:
            divisors = [d for d in range(1, remaining + 1) if remaining % d == 0]
            sizes[axis] = draw(st.sampled_from(divisors))
            remaining //= sizes[axis]
        sizes[axes[-1]] = remaining
        return sizes

    return build()


@settings(max_examples=200, deadline=None)
@given(n=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 64]), data=st.data())
def test_roundtrip_and_fill_properties(n, data):
    sizes = data.draw(_factorizations(n))
    names = data.draw(st.permutations(list(sizes)))
    style = data.draw(st.sampled_from([SHORT, LONG]))
    text = ",".join(f"{style[a]}={sizes[a]}" for a in names)
    spec = parse_mesh(text).resolve(n)
    # canonical order whatever the input order, product = device count, sizes preserved
    assert spec.names == tuple(a for a in MESH_AXES if a in sizes)
    assert math.prod(spec.shape) == n
    assert dict(spec.axes) == sizes
    # printing and re-parsing gives the same spec
    assert parse_mesh(str(spec)).resolve(n) == spec
    # replacing any one axis by -1 fills it back to the same size
    hole = data.draw(st.sampled_from(names))
    filled = ",".join(f"{a}={-1 if a == hole else sizes[a]}" for a in names)
    assert parse_mesh(filled).resolve(n) == spec


@settings(max_examples=100, deadline=None)
@given(n=st.sampled_from([2, 4, 8]), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=3))
def test_wrong_product_always_rejected(n, sizes):
    axes = MESH_AXES[: len(sizes)]
    spec = MeshSpec(tuple(zip(axes, sizes, strict=True)))
    if math.prod(sizes) == n:
        assert spec.resolve(n) == spec
    else:
        with pytest.raises(MeshSpecError, match="devices"):
            spec.resolve(n)


def test_build_mesh_uses_all_devices_in_order():
    mesh = build_mesh("tp=2,dp=-1")
    assert mesh.axis_names == ("data", "tensor")
    assert dict(mesh.shape) == {"data": jax.device_count() // 2, "tensor": 2}
    # tensor innermost: the two members of a tensor group are neighbouring devices
    ids = [[d.id for d in row] for row in mesh.devices]
    assert all(row[1] - row[0] == 1 for row in ids)
