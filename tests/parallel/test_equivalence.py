"""The equivalence check catches broken strategies; data replicas stay identical.

The matrix itself (every strategy x mesh vs the reference) is tests/test_verify.py. Here the same
check is shown to fail for a deliberately broken strategy -- data parallelism with its gradient
all-reduce dropped -- and to pass for the same strategy written correctly.
"""

import chex
import jax
import numpy as np
import pytest

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import build_mesh
from jaxscale.parallel import auto
from jaxscale.sharding import Sharder
from jaxscale.tolerances import ATOL, RTOL
from jaxscale.train import data

CFG = ModelConfig()
TCFG = TrainConfig(steps=10, global_batch=16, seq_len=32, warmup_steps=2, lr=1e-3)
DATASET = data.MarkovData()


def assert_equivalent(got, want, rtol=RTOL, atol=ATOL):
    """The one check every strategy must pass."""
    chex.assert_trees_all_close(jax.device_get(got), jax.device_get(want), rtol=rtol, atol=atol)


def _batch(step: int):
    return DATASET.rows(TCFG.seed, step, range(TCFG.global_batch), TCFG.seq_len)


@pytest.fixture(scope="module")
def reference():
    params = auto.init_state(CFG, TCFG)["params"]
    grads = jax.jit(lambda p, b: auto.loss_and_grads(p, b, CFG))(params, _batch(0))
    return {"params": params, "loss_grads": grads}


def _manual_dp_grads(mesh, reduce: bool):
    """Data parallelism written by hand; `reduce=False` drops the gradient all-reduce."""

    def local(params, batch):
        loss, grads = jax.value_and_grad(auto.loss_fn)(params, batch, CFG)
        if reduce:  # one all-reduce (mean) over 'data' of the loss and every gradient leaf
            loss, grads = jax.lax.pmean((loss, grads), "data")
        return loss, grads

    # check_vma=False: the classic pmap style, where nothing reduces unless we say so.
    f = jax.shard_map(
        local, mesh=mesh, in_specs=(jax.P(), jax.P("data")), out_specs=jax.P(), check_vma=False
    )
    return jax.jit(f)


@pytest.mark.smoke
def test_equivalence_check_catches_a_dropped_gradient_reduction(reference):
    mesh = build_mesh("dp=8")
    batch = jax.device_put(_batch(0), jax.NamedSharding(mesh, jax.P("data")))
    params = reference["params"]
    # the hand-written strategy with its all-reduce passes the check ...
    assert_equivalent(_manual_dp_grads(mesh, reduce=True)(params, batch), reference["loss_grads"])
    # ... and the same strategy without it fails the very same check
    with pytest.raises(AssertionError):
        assert_equivalent(
            _manual_dp_grads(mesh, reduce=False)(params, batch), reference["loss_grads"]
        )


def test_params_identical_across_data_replicas_after_training():
    mesh = build_mesh("dp=2,tp=4")
    sharder = Sharder(mesh)
    with jax.set_mesh(mesh):
        state = auto.init_state(CFG, TCFG, sharder)
        step_fn = auto.jit_train_step(CFG, TCFG, sharder)
        for s in range(3):
            state, _ = step_fn(state, jax.device_put(_batch(s), auto.batch_sharding(sharder)))
    for leaf in jax.tree.leaves(state["params"]):
        by_index: dict = {}
        for shard in leaf.addressable_shards:
            by_index.setdefault(str(shard.index), []).append(np.asarray(shard.data))
        for copies in by_index.values():  # the replicas over 'data' hold the same bits
            for other in copies[1:]:
                np.testing.assert_array_equal(copies[0], other)
