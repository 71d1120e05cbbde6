"""Collectives built from ppermute equal the jax.lax built-ins (seed 002 ch3 Ex3, ch4).

Integers must match exactly; floats within the tolerances below (the summation order differs).
One program per (axis size, dtype) computes every variant, so each case compiles once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from jaxscale.parallel import collectives as C

RTOL = 1e-5
ATOL = 1e-5
# Integers (exact) on every size, 3 being a non-power-of-two ring/tree; floats (tolerance) on the
# smallest and largest axis: XLA:CPU takes 2-3 s to compile each case.
CASES = [(2, jnp.int32), (3, jnp.int32), (4, jnp.int32), (8, jnp.int32)]
CASES += [(2, jnp.float32), (8, jnp.float32)]


def _mesh(n: int):
    return jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])


def _body(n: int, root: int):
    def body(x):
        outs = {
            "ring_all_reduce": C.ring_all_reduce(x, "x"),
            "tree_all_reduce": C.tree_all_reduce(x, "x"),
            "psum": jax.lax.psum(x, "x"),
            "ring_reduce_scatter": C.ring_reduce_scatter(x, "x"),
            "psum_scatter": jax.lax.psum_scatter(x, "x", tiled=True),
            "ring_all_gather": C.ring_all_gather(x, "x"),
            "all_gather": jax.lax.all_gather(x, "x", tiled=True),
            "all_to_all": C.all_to_all(x, "x"),
            "lax_all_to_all": jax.lax.all_to_all(x, "x", 0, 0, tiled=True),
            "broadcast": C.broadcast(x, "x", root),
            "scatter": C.scatter(x, "x", root),
            "gather": C.gather(x, "x", root),
            "reduce": C.reduce(x, "x", root),
            # odd local shape: ring_all_reduce pads to a multiple of n and unpads
            "ring_all_reduce_odd": C.ring_all_reduce(x[:1, :1] * 3 + 1, "x"),
            "psum_odd": jax.lax.psum(x[:1, :1] * 3 + 1, "x"),
        }
        if n & (n - 1) == 0:
            outs["recursive_doubling"] = C.recursive_doubling_all_reduce(x, "x")
        return {k: v[None] for k, v in outs.items()}  # stack per device: row i = device i

    return body


def _input(n: int, dtype) -> np.ndarray:
    """Local block (n * 2, 3) per device; distinct, non-trivial values (squares, negatives)."""
    base = np.arange(n * n * 2 * 3).reshape(n * n * 2, 3)
    values = (base**2 % 97) - 40
    return values.astype(np.float32) / 7 if dtype == jnp.float32 else values.astype(np.int32)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"n{c[0]}-{c[1].__name__}")
def case(request):
    n, dtype = request.param
    root = n - 1  # a root other than 0 exercises the renumbering
    x = _input(n, dtype)
    f = jax.jit(jax.shard_map(_body(n, root), mesh=_mesh(n), in_specs=P("x"), out_specs=P("x")))
    outs = {k: np.asarray(v) for k, v in f(x).items()}
    return n, dtype, root, x.reshape(n, n * 2, 3), outs


def assert_same(a, b, dtype):
    if dtype == jnp.int32:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_all_reduces_equal_psum(case):
    n, dtype, _, blocks, o = case
    # The built-in itself against an independent numpy sum, so the reference is not circular.
    assert_same(o["psum"], np.broadcast_to(blocks.sum(0), o["psum"].shape), dtype)
    assert_same(o["ring_all_reduce"], o["psum"], dtype)
    assert_same(o["tree_all_reduce"], o["psum"], dtype)
    assert_same(o["ring_all_reduce_odd"], o["psum_odd"], dtype)
    if n & (n - 1) == 0:
        assert_same(o["recursive_doubling"], o["psum"], dtype)


def test_reduce_scatter_all_gather_all_to_all_equal_builtins(case):
    _, dtype, _, blocks, o = case
    assert_same(o["ring_reduce_scatter"], o["psum_scatter"], dtype)
    assert_same(o["ring_all_gather"], o["all_gather"], dtype)
    assert_same(o["all_to_all"], o["lax_all_to_all"], dtype)
    np.testing.assert_array_equal(o["all_gather"][0], blocks.reshape(-1, 3))


def test_rooted_collectives(case):
    n, dtype, root, blocks, o = case
    chunk = blocks.shape[1] // n
    for i in range(n):
        assert_same(o["broadcast"][i], blocks[root], dtype)
        assert_same(o["scatter"][i], blocks[root][i * chunk : (i + 1) * chunk], dtype)
    # gather/reduce: the root holds the all_gather / psum result, everyone else zeros
    assert_same(o["gather"][root], o["all_gather"][root], dtype)
    assert_same(o["reduce"][root], o["psum"][root], dtype)
    others = [i for i in range(n) if i != root]
    assert not o["gather"][others].any() and not o["reduce"][others].any()


def test_recursive_doubling_rejects_non_power_of_two():
    f = jax.shard_map(
        lambda x: C.recursive_doubling_all_reduce(x, "x"),
        mesh=_mesh(3),
        in_specs=P("x"),
        out_specs=P("x"),
    )
    with pytest.raises(ValueError, match="power-of-two"):
        jax.jit(f).lower(jnp.zeros(6))


def test_chunked_ops_reject_indivisible_blocks():
    f = jax.shard_map(
        lambda x: C.ring_reduce_scatter(x, "x"), mesh=_mesh(4), in_specs=P("x"), out_specs=P("x")
    )
    with pytest.raises(ValueError, match="multiple of 4"):
        jax.jit(f).lower(jnp.zeros(12))  # local block of 3 rows cannot split 4 ways


def test_bad_root_is_rejected():
    f = jax.shard_map(
        lambda x: C.broadcast(x, "x", root=4), mesh=_mesh(4), in_specs=P("x"), out_specs=P("x")
    )
    with pytest.raises(ValueError, match="root 4"):
        jax.jit(f).lower(jnp.zeros(8))


@pytest.mark.parametrize("axis", ["a", "b"])
def test_one_axis_of_a_2d_mesh(axis):
    """Reducing over one axis of a (2, 4) mesh leaves the other axis independent."""
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    n = mesh.shape[axis]

    def body(x):
        outs = (
            C.ring_all_reduce(x, axis),
            C.tree_all_reduce(x, axis),
            C.recursive_doubling_all_reduce(x, axis),
            C.ring_all_gather(x, axis),
            C.ring_reduce_scatter(x, axis),
            C.all_to_all(x, axis),
            jax.lax.psum(x, axis),
            jax.lax.all_gather(x, axis, tiled=True),
            jax.lax.psum_scatter(x, axis, tiled=True),
            jax.lax.all_to_all(x, axis, 0, 0, tiled=True),
        )
        return tuple(o[None, None] for o in outs)

    x = (np.arange(8 * 8 * 2) % 13).astype(np.int32).reshape(8 * 8, 2)
    spec = P("a", "b")
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(("a", "b")), out_specs=(spec,) * 10))
    ring, tree, rd, ag, rs, a2a, psum, lax_ag, lax_rs, lax_a2a = (np.asarray(o) for o in f(x))
    blocks = x.reshape(2, 4, 8, 2)  # [a, b, local rows, 2]
    expected_sum = blocks.sum(axis=0 if axis == "a" else 1, keepdims=True)
    np.testing.assert_array_equal(psum, np.broadcast_to(expected_sum, psum.shape))
    for mine, ref in ((ring, psum), (tree, psum), (rd, psum), (ag, lax_ag), (rs, lax_rs)):
        np.testing.assert_array_equal(mine, ref)
    np.testing.assert_array_equal(a2a, lax_a2a)
    assert ag.shape[-2] == 8 * n
