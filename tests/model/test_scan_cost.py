"""The layer scan (the default) against unrolled layers: the same FLOPs, and with remat the same
bytes within 5%, every loop trip counted (`analysis.loop_cost`). What the scan adds without
remat is measured in docs/performance.md."""

import jax
import jax.numpy as jnp
import pytest

from jaxscale.analysis.loop_cost import loop_cost
from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model import state as ms

CFG = ModelConfig(d_model=256, n_layers=4, n_heads=8, n_kv_heads=8, d_ff=1024, remat="block")


def _cost(cfg):
    params = ms.init_params(cfg, 0)
    batch = jnp.zeros((8, 129), jnp.int32)
    step = jax.jit(jax.value_and_grad(lambda p, b: pieces.loss(p, b, cfg)))
    return loop_cost(step.lower(params, batch).compile())


def test_the_scanned_remat_step_moves_the_unrolled_steps_bytes():
    scanned, unrolled = _cost(CFG), _cost(CFG.replace(unroll_layers=True))
    assert scanned["flops"] == pytest.approx(unrolled["flops"], rel=0.01)
    assert scanned["bytes accessed"] <= 1.05 * unrolled["bytes accessed"], (scanned, unrolled)
