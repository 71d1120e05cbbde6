"""Collective census from HLO text: hand-written snippets of every printed form, then real compiled
programs whose collectives are known in advance (seed 002 ch4, "The Ring Algorithm": a ring
all-reduce is 2(N-1) steps of D/N)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale.analysis import hlo
from jaxscale.calc import comm
from jaxscale.parallel import collectives as C

F32 = 4  # bytes per element


def _module(*body_lines: str, extra: str = "") -> str:
    body = "\n".join(f"  {line}" for line in body_lines)
    return (
        "HloModule m, is_scheduled=true, num_partitions=8\n\n"
        "%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n"
        "  %b = f32[] parameter(1)\n  ROOT %s = f32[] add(%a, %b)\n}\n\n"
        f"{extra}"
        "ENTRY %main (p0: f32[64], p1: bf16[64]) -> f32[64] {\n"
        "  %p0 = f32[64]{0} parameter(0)\n  %p1 = bf16[64]{0} parameter(1)\n"
        f"{body}\n}}\n"
    )


# --- replica groups in every printed form -----------------------------------------------------


@pytest.mark.parametrize(
    "text, groups",
    [
        ("{{0,1},{2,3}}", ((0, 1), (2, 3))),
        ("{{0,1,2,3,4,5,6,7}}", (tuple(range(8)),)),
        ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ("[1,8]<=[8]", (tuple(range(8)),)),
        ("mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("mesh['a'=2,'b'=2,'c'=2] {'a','c'}", ((0, 1, 4, 5), (2, 3, 6, 7))),
        ("mesh['x'=8] {'x':(1)2}", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ("mesh['x'=8] {'x':(2)4}", ((0, 1, 2, 3), (4, 5, 6, 7))),
        # devices not in id order: position p holds device [0,4,1,5,2,6,3,7][p]
        ("mesh['a'=4,'b'=1,'c'=2], device_ids=([2,4]T(1,0)) {'a'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'b'}", ((0, 4), (1, 5), (2, 6), (3, 7))),
        ("mesh['a'=2,'b'=2], device_ids=(3,2,1,0) {'a'}", ((3, 1), (2, 0))),
    ],
)
def test_replica_group_formats(text, groups):
    assert hlo.parse_replica_groups(text) == groups


def test_empty_replica_groups_mean_all_devices():
    assert hlo.parse_replica_groups("{}", num_devices=4) == ((0, 1, 2, 3),)
    with pytest.raises(ValueError, match="device count"):
        hlo.parse_replica_groups("{}")


# --- instruction forms -----------------------------------------------------------------------


def test_sync_all_reduce_with_metadata():
    text = _module(
        "ROOT %ar = f32[64]{0} all-reduce(%p0), channel_id=1, replica_groups=[2,4]<=[8], "
        'use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(f)/psum, (x)"}'
    )
    (c,) = hlo.collectives_from_text(text)
    assert (c.op, c.dtype, c.bytes_per_device, c.group_size, c.num_groups) == (
        "all-reduce",
        "f32",
        64 * F32,
        4,
        2,
    )
    assert not c.is_async and not c.scattered and c.upcast_from is None


def test_async_start_done_counted_once_with_done_shape():
    text = _module(
        "%ag-start = (f32[8]{0}, f32[64]{0}) all-gather-start(%p0), channel_id=1, "
        "replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}",
        "%ag-done = f32[64]{0} all-gather-done(%ag-start)",
        "%ar-start = f32[64]{0} all-reduce-start(%ag-done), replica_groups={{0,1},{2,3},{4,5},"
        "{6,7}}, to_apply=%add",
        "%ar-done = f32[64]{0} all-reduce-done(%ar-start)",
        "%cp-start = (f32[64]{0}, f32[64]{0}, u32[], u32[]) collective-permute-start(%ar-done), "
        "source_target_pairs={{0,1},{1,0},{2,3},{3,2}}",
        "ROOT %cp-done = f32[64]{0} collective-permute-done(%cp-start)",
    )
    cs = hlo.collectives_from_text(text)
    assert [c.op for c in cs] == ["all-gather", "all-reduce", "collective-permute"]
    assert all(c.is_async for c in cs)
    assert [c.bytes_per_device for c in cs] == [64 * F32] * 3  # gathered output; operands
    assert [c.group_size for c in cs] == [8, 2, 4]
    assert cs[2].num_groups == 4  # four source->target pairs


def test_lone_start_falls_back_to_the_output_part_of_its_tuple():
    text = _module(
        "ROOT %ag-start = (f32[8]{0}, f32[64]{0}) all-gather-start(%p0), "
        "replica_groups=[1,8]<=[8], dimensions={0}"
    )
    (c,) = hlo.collectives_from_text(text)
    assert c.bytes_per_device == 64 * F32


def test_tuple_shaped_combined_all_reduce_sums_elements_once():
    text = _module(
        "%ar = (f32[64]{0}, bf16[64]{0}, /*index=2*/f32[3,5]{1,0}) all-reduce(%p0, %p1, %p0), "
        "replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add",
        "ROOT %gte = f32[64]{0} get-tuple-element(%ar), index=0",
    )
    (c,) = hlo.collectives_from_text(text)
    assert c.dtype == "mixed"
    assert c.bytes_per_device == 64 * 4 + 64 * 2 + 15 * 4


def test_reduce_scatter_bytes_are_the_input():
    text = _module(
        "ROOT %rs = f32[8]{0} reduce-scatter(%p0), replica_groups=mesh['d'=8] {'d'}, "
        "dimensions={0}, to_apply=%add"
    )
    (c,) = hlo.collectives_from_text(text)
    assert (c.op, c.bytes_per_device, c.group_size) == ("reduce-scatter", 64 * F32, 8)


def test_all_to_all_tuple_form():
    slices = ", ".join(["f32[8]{0}"] * 8)
    text = _module(
        f"%a2a = ({slices}) all-to-all(%p0, %p0, %p0, %p0, %p0, %p0, %p0, %p0), "
        "replica_groups={{0,1,2,3,4,5,6,7}}",
        "ROOT %g = f32[8]{0} get-tuple-element(%a2a), index=0",
    )
    (c,) = hlo.collectives_from_text(text)
    assert (c.op, c.bytes_per_device) == ("all-to-all", 64 * F32)


CPU_RS_EXTRA = (
    "%cvt (q: bf16[64]) -> f32[64] {\n  %q = bf16[64]{0} parameter(0)\n"
    "  ROOT %c = f32[64]{0} convert(%q)\n}\n\n"
    "%slice (r: f32[64], i: s32[]) -> bf16[8] {\n  %r = f32[64]{0} parameter(0)\n"
    "  %i = s32[] parameter(1)\n  %ds = f32[8]{0} dynamic-slice(%r, %i), dynamic_slice_sizes={8}\n"
    "  ROOT %c2 = bf16[8]{0} convert(%ds)\n}\n\n"
)


def test_cpu_upcast_and_all_reduce_dynamic_slice_are_recognised_and_normalised():
    text = _module(
        "%up = f32[64]{0} fusion(%p1), kind=kLoop, calls=%cvt",
        "%ar = f32[64]{0} all-reduce(%up), replica_groups=[1,8]<=[8], to_apply=%add",
        "%pid = s32[] parameter(2)",
        "ROOT %out = bf16[8]{0} fusion(%ar, %pid), kind=kLoop, calls=%slice",
        extra=CPU_RS_EXTRA,
    )
    (c,) = hlo.collectives_from_text(text)
    assert (c.op, c.dtype, c.upcast_from, c.scattered) == ("all-reduce", "f32", "bf16", True)
    (n,) = hlo.normalize([c])
    assert (n.op, n.dtype, n.bytes_per_device) == ("reduce-scatter", "bf16", 64 * 2)


def test_all_reduce_used_whole_is_not_scattered():
    text = _module(
        "%ar = f32[64]{0} all-reduce(%p0), replica_groups=[1,8]<=[8], to_apply=%add",
        "%pid = s32[] parameter(2)",
        # a dynamic-slice that keeps half, not 1/8: a different computation, not a reduce-scatter
        "ROOT %ds = f32[32]{0} dynamic-slice(%ar, %pid), dynamic_slice_sizes={32}",
    )
    (c,) = hlo.collectives_from_text(text)
    assert not c.scattered and c.upcast_from is None


def test_tpu_style_fused_all_reduce_scatter():
    extra = (
        "%all-reduce-scatter (x: f32[64], i: s32[]) -> f32[8] {\n"
        "  %x = f32[64]{0} parameter(0)\n  %i = s32[] parameter(1)\n"
        "  %ar = f32[64]{0} all-reduce(%x), replica_groups=[1,8]<=[8], to_apply=%add\n"
        "  ROOT %ds = f32[8]{0} dynamic-slice(%ar, %i), dynamic_slice_sizes={8}\n}\n\n"
    )
    text = _module(
        "%pid = s32[] parameter(2)",
        "ROOT %f = f32[8]{0} fusion(%p0, %pid), kind=kCustom, calls=%all-reduce-scatter",
        extra=extra,
    )
    (c,) = hlo.collectives_from_text(text)
    assert c.scattered and c.computation == "all-reduce-scatter"
    assert hlo.normalize([c])[0].op == "reduce-scatter"


def test_census_and_summary_fold_identical_collectives():
    line = "%ar{i} = f32[64]{{0}} all-reduce(%p0), replica_groups=[1,8]<=[8], to_apply=%add"
    text = _module(*(line.format(i=i) for i in range(3)), "ROOT %r = f32[64]{0} copy(%ar0)")
    rows = hlo.census(hlo.collectives_from_text(text))
    assert rows == [hlo.CensusRow("all-reduce", "f32", 256.0, 8, 3)]
    assert hlo.summarize(hlo.collectives_from_text(text)) == {"all-reduce": hlo.OpTotals(3, 768.0)}
    assert "all-reduce" in hlo.format_census(rows)


# --- real compiled programs -------------------------------------------------------------------


def _mesh(n: int):
    return jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])


def _census(fn, n: int, x, out_spec=None):
    out_spec = P("x") if out_spec is None else out_spec
    f = jax.jit(jax.shard_map(fn, mesh=_mesh(n), in_specs=P("x"), out_specs=out_spec))
    compiled = f.lower(x).compile()
    return hlo.collectives_of(compiled), compiled.as_text()


@pytest.mark.parametrize("n", [4, 8])
def test_hand_written_ring_is_2n_minus_2_permutes_of_d_over_n(n):
    d_elems = 64  # per device
    cs, _ = _census(lambda a: C.ring_all_reduce(a, "x"), n, jnp.ones(n * d_elems))
    assert [c.op for c in cs] == ["collective-permute"] * (2 * (n - 1))
    assert {c.bytes_per_device for c in cs} == {d_elems * F32 / n}
    # The cost model's ring all-reduce moves the same bytes per rank.
    _, wire = comm.schedule("all-reduce", "ring", n, d_elems * F32)
    assert sum(c.bytes_per_device for c in cs) == pytest.approx(wire)


def test_tree_and_recursive_doubling_step_counts_match_the_model():
    n, d = 8, 16
    tree, _ = _census(lambda a: C.tree_all_reduce(a, "x"), n, jnp.ones(n * d))
    rd, _ = _census(lambda a: C.recursive_doubling_all_reduce(a, "x"), n, jnp.ones(n * d))
    steps_tree, wire_tree = comm.schedule("all-reduce", "tree", n, d * F32)
    steps_rd, wire_rd = comm.schedule("all-reduce", "recursive_doubling", n, d * F32)
    assert len(tree) == steps_tree == 6 and len(rd) == steps_rd == 3
    assert sum(c.bytes_per_device for c in tree) == wire_tree
    assert sum(c.bytes_per_device for c in rd) == wire_rd


def test_builtins_compile_to_one_collective_each_with_defined_bytes():
    n, d = 8, 64

    def body(a):
        return (
            jax.lax.psum(a, "x")[None],
            jax.lax.all_gather(a, "x", tiled=True)[None],
            jax.lax.psum_scatter(a, "x", tiled=True)[None],
            jax.lax.all_to_all(a, "x", 0, 0, tiled=True)[None],
            jax.lax.ppermute(a, "x", [(i, (i + 1) % n) for i in range(n)])[None],
        )

    cs, text = _census(body, n, jnp.ones(n * d), out_spec=(P("x"),) * 5)
    by_op = {c.op: c for c in cs}
    assert sorted(by_op) == sorted(
        ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"]
    )
    assert len(cs) == 5
    assert by_op["all-reduce"].bytes_per_device == d * F32  # operand
    assert by_op["all-gather"].bytes_per_device == n * d * F32  # gathered output
    assert by_op["reduce-scatter"].bytes_per_device == d * F32  # input
    assert by_op["all-to-all"].bytes_per_device == d * F32
    assert by_op["collective-permute"].bytes_per_device == d * F32
    assert all(c.group_size == n for c in cs)
    assert "ENTRY" in text  # the real text the parser read


@pytest.mark.parametrize("axis, size, groups", [("a", 2, 4), ("b", 4, 2)])
def test_group_size_on_one_axis_of_a_2d_mesh(axis, size, groups):
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    f = jax.jit(
        jax.shard_map(
            lambda a: jax.lax.psum(a, axis)[None, None],
            mesh=mesh,
            in_specs=P(("a", "b")),
            out_specs=P("a", "b"),
        )
    )
    (c,) = hlo.collectives_of(f.lower(jnp.ones(64)).compile())
    assert (c.group_size, c.num_groups) == (size, groups)


def test_cpu_fsdp_gradient_normalises_to_a_bf16_reduce_scatter():
    """Auto-sharded gradient of an FSDP weight: CPU prints f32 all-reduce + dynamic-slice."""
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    shard = NamedSharding(mesh, P("d", None))

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    w, x = jnp.ones((64, 32), jnp.bfloat16), jnp.ones((16, 64), jnp.bfloat16)
    grad = jax.jit(jax.grad(loss), in_shardings=(shard, shard), out_shardings=shard)
    raw = hlo.collectives_of(grad.lower(w, x).compile())
    rows = hlo.census(hlo.normalize(raw))
    weight_bytes_bf16 = 64 * 32 * 2
    assert hlo.CensusRow("reduce-scatter", "bf16", weight_bytes_bf16, 8, 1) in rows
    assert hlo.CensusRow("all-gather", "bf16", weight_bytes_bf16, 8, 1) in rows
    assert all(c.dtype == "f32" for c in raw)  # what XLA:CPU really printed


def test_mesh_groups_with_device_ids_in_a_real_instruction():
    """The attribute form jax 0.10 prints for a 2-D mesh whose device order is transposed."""
    text = (
        "HloModule m, num_partitions=8\n\nENTRY %main (p: f32[]) -> f32[] {\n"
        "  %p = f32[] parameter(0)\n"
        "  ROOT %ar = f32[] all-reduce(%p), channel_id=1, "
        "replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) "
        "{'axis_0'}, use_global_device_ids=true, to_apply=%add\n}\n"
    )
    (c,) = hlo.collectives_from_text(text)
    assert (c.op, c.group_size, c.num_groups, c.bytes_per_device) == ("all-reduce", 4, 2, 4)


def test_combined_all_reduce_with_some_elements_sliced_splits_on_normalise():
    """XLA combines a scalar (loss) with a gradient into one tuple all-reduce; only the gradient
    is then cut to 1/4 by a dynamic-slice: normalise yields an all-reduce of 4 B and a
    reduce-scatter of the gradient's 256 B."""
    text = (
        "HloModule m, num_partitions=4\n\nENTRY %main (a: f32[], b: f32[64]) -> f32[16] {\n"
        "  %a = f32[] parameter(0)\n  %b = f32[64]{0} parameter(1)\n"
        "  %ar = (f32[], f32[64]{0}) all-reduce(%a, %b), channel_id=1, "
        "replica_groups={{0,1,2,3}}, to_apply=%add\n"
        "  %g0 = f32[] get-tuple-element(%ar), index=0\n"
        "  %g1 = f32[64]{0} get-tuple-element(%ar), index=1\n"
        "  %off = s32[] parameter(2)\n"
        "  ROOT %ds = f32[16]{0} dynamic-slice(%g1, %off), dynamic_slice_sizes={16}\n}\n"
    )
    (c,) = hlo.collectives_from_text(text)
    assert c.scattered_elements == (False, True) and not c.scattered
    totals = hlo.summarize(hlo.normalize([c]))
    assert (totals["all-reduce"].count, totals["all-reduce"].total_bytes) == (1, 4)
    assert (totals["reduce-scatter"].count, totals["reduce-scatter"].total_bytes) == (1, 256)


def test_a_loops_collectives_count_once_per_trip():
    """A collective in a scan's body runs once per trip (nested: the product of the trip
    counts); the census counts executions, the unrolled program's figure."""
    n, d = 4, 8
    pairs = [(i, (i + 1) % n) for i in range(n)]

    def scanned(a):
        def inner(c, _):
            return jax.lax.ppermute(c, "x", pairs) * 2.0, None

        def outer(c, _):
            c = jax.lax.pcast(jax.lax.psum(c, "x"), ("x",), to="varying")  # once per trip
            return jax.lax.scan(inner, c, None, length=5)[0], None

        return jax.lax.scan(outer, a, None, length=3)[0]

    def unrolled(a):
        for _ in range(3):
            a = jax.lax.psum(a, "x")
            for _ in range(5):
                a = jax.lax.ppermute(a, "x", pairs) * 2.0
        return a

    got, _ = _census(scanned, n, jnp.ones(n * d))
    want, _ = _census(unrolled, n, jnp.ones(n * d))
    assert {c.op: c.trips for c in got} == {"all-reduce": 3, "collective-permute": 15}
    assert not any(c.unknown_trips for c in got)
    assert (
        hlo.summarize(got)
        == hlo.summarize(want)
        == {
            "all-reduce": hlo.OpTotals(3, 3 * d * F32),
            "collective-permute": hlo.OpTotals(15, 15 * d * F32),
        }
    )
    assert hlo.census(got) == hlo.census(want)


def test_a_loop_of_unknown_length_counts_once_and_says_so():
    def body(a):
        def step(c):
            return c[0] + 1, jax.lax.pcast(jax.lax.psum(c[1], "x"), ("x",), to="varying")

        return jax.lax.while_loop(lambda c: c[1][0] < 100.0, step, (0, a))[1]

    (c,), _ = _census(body, 4, jnp.ones(16))
    assert (c.op, c.trips, c.unknown_trips) == ("all-reduce", 1, True)
