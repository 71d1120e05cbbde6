"""The teaching forms of data parallelism (jaxscale/lessons/data_parallel.py): the two correct
forms equal one device, the extra pmean is exactly N x the gradient, and bucketing reduces one
array per bucket instead of one per leaf."""

import chex
import jax
import pytest
from jax.sharding import PartitionSpec as P

from jaxscale.analysis import hlo
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.lessons import data_parallel as dp
from jaxscale.mesh import build_mesh
from jaxscale.model import pieces
from jaxscale.parallel import auto
from jaxscale.tolerances import ATOL, RTOL
from jaxscale.train import data

CFG = ModelConfig(n_layers=1)
N = 8


def local_loss(params, batch_BT1):
    return pieces.loss(params, batch_BT1, CFG)


@pytest.fixture(scope="module")
def setup():
    mesh = build_mesh(f"dp={N}")
    batch = data.MarkovData().rows(0, 0, range(16), 16)
    params = auto.init_state(CFG, TrainConfig(global_batch=16, seq_len=16))["params"]
    ref = jax.jit(lambda p, b: auto.loss_and_grads(p, b, CFG))(params, batch)
    return mesh, params, jax.device_put(batch, jax.NamedSharding(mesh, P("data"))), ref


def _dp(mesh, variant):
    f = jax.shard_map(
        lambda p, b: dp.dp_loss_and_grads(local_loss, p, b, ("data",), variant),
        mesh=mesh,
        in_specs=(P(), P("data")),
        out_specs=P(),
    )
    return jax.jit(f)


def test_extra_pmean_gives_exactly_n_times_the_gradient(setup):
    mesh, params, batch, (ref_loss, ref_grads) = setup
    loss, grads = _dp(mesh, "extra_pmean")(params, batch)
    chex.assert_trees_all_close(loss, ref_loss, rtol=RTOL, atol=ATOL)  # the loss is fine ...
    scaled = jax.tree.map(lambda g: g * N, ref_grads)
    chex.assert_trees_all_close(grads, scaled, rtol=RTOL, atol=N * ATOL)  # ... grads are N x
    for variant in ("explicit", "mean_in_loss"):
        chex.assert_trees_all_close(
            _dp(mesh, variant)(params, batch), (ref_loss, ref_grads), rtol=RTOL, atol=ATOL
        )


def test_bucketing_turns_per_leaf_reductions_into_one_per_bucket(setup):
    """Seed ch. 5's bucketing exercise, read from the census. XLA's all-reduce combiner already
    merges independent all-reduces into one tuple-shaped op (the compiler's own bucketing), so
    what differs is the number of arrays reduced: one per leaf, or one per bucket."""
    mesh, params, _, _ = setup
    leaves = jax.tree.leaves(params)
    bucket_bytes = 64 * 1024

    def per_leaf(g):
        return dp.per_leaf_psum(g, "data")

    def bucketed(g):
        return dp.bucketed_psum(g, "data", bucket_bytes)[0]

    results, counts = {}, {}
    for name, fn in (("per_leaf", per_leaf), ("bucketed", bucketed)):
        f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))
        compiled = f.lower(params).compile()
        reduces = [c for c in hlo.collectives_of(compiled) if c.op == "all-reduce"]
        counts[name] = sum(len(c.shapes) for c in reduces)  # arrays reduced, tuple elements too
        results[name] = f(params)
    chex.assert_trees_all_close(results["bucketed"], results["per_leaf"], rtol=0, atol=0)
    # greedy buckets of <= 64 KiB over the leaves in order, computed independently here
    n_buckets, size = 0, None
    for x in leaves:
        nbytes = x.size * 4
        if size is None or size + nbytes > bucket_bytes:
            n_buckets, size = n_buckets + 1, 0
        size += nbytes
    assert counts["per_leaf"] == len(leaves)
    assert counts["bucketed"] == n_buckets < len(leaves)
