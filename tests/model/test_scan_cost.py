"""The layer scan (the default) against unrolled layers: the same FLOPs, and with remat the same
bytes within 5%, every loop trip counted (`analysis.loop_cost`). Without remat, what the scan
adds is its residual stacks' traffic (`analysis.loop_bytes`; docs/performance.md)."""

import re

import jax
import jax.numpy as jnp
import pytest

from jaxscale.analysis import aot
from jaxscale.analysis.loop_bytes import by_kind, slot_access
from jaxscale.analysis.loop_cost import loop_cost
from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model import state as ms

CFG = ModelConfig(d_model=256, n_layers=4, n_heads=8, n_kv_heads=8, d_ff=1024, remat="block")


def _compiled(cfg):
    params = ms.init_params(cfg, 0)
    batch = jnp.zeros((8, 129), jnp.int32)
    step = jax.jit(jax.value_and_grad(lambda p, b: pieces.loss(p, b, cfg)))
    return step.lower(params, batch).compile()


def _cost(cfg):
    return loop_cost(_compiled(cfg))


def test_the_scanned_remat_step_moves_the_unrolled_steps_bytes():
    scanned, unrolled = _cost(CFG), _cost(CFG.replace(unroll_layers=True))
    assert scanned["flops"] == pytest.approx(unrolled["flops"], rel=0.01)
    assert scanned["bytes accessed"] <= 1.05 * unrolled["bytes accessed"], (scanned, unrolled)


def test_without_remat_the_scans_extra_bytes_are_its_stacks_traffic():
    """The default (no remat) scanned step, its bytes split by what moves them: the groups add
    up to XLA's count with every trip (the split misses nothing), the compute alone is no more
    than the whole unrolled step, and the rest -- the residual stacks' fill, slot writes and slot
    reads -- is what the unrolled step does not have (docs/performance.md)."""
    cfg = CFG.replace(remat="none")
    scanned, unrolled = _compiled(cfg), _compiled(cfg.replace(unroll_layers=True))
    split, whole = by_kind(scanned), loop_cost(scanned)["bytes accessed"]
    assert sum(split.values()) == pytest.approx(whole, rel=0.005), (split, whole)
    flat, flat_whole = by_kind(unrolled), loop_cost(unrolled)["bytes accessed"]
    assert flat["stack writes"] + flat["stack reads"] < 0.01 * flat_whole  # no layer stacks
    assert split["compute"] <= flat_whole
    stacks = split["stack fill"] + split["stack writes"] + split["stack reads"]
    assert stacks >= 0.8 * (whole - flat_whole), split
    # why: no XLA:CPU matmul reads or writes a slot of a stack itself, so each slot is copied
    # into or out of a buffer of the matmul's own (the TPU test below shows the other way)
    layers = [loop for loop in slot_access(scanned) if loop["matmuls"]]  # forward, backward
    assert len(layers) == 2, layers  # (XLA:CPU's older emitters loop over a scatter, too)
    for loop in layers:
        assert loop["matmul reads"] == loop["matmul writes"] == 0, loop
        assert loop["reads apart"] + loop["writes apart"] > 0, loop


def test_the_scanned_mlp_keeps_its_two_matmul_outputs_and_recomputes_no_matmul():
    """SwiGLU's backward needs gate and up, each [B, T, F]; the activation and its terms are
    recomputed from them (pieces.mlp), so the scan stacks exactly two [L, B, T, F] residuals,
    and the unrolled step's matmul FLOPs are forward + backward, 3x the forward's (no matmul is
    recomputed)."""
    from jaxscale.analysis.matmuls import matmul_flops
    from jaxscale.model import counts

    cfg = CFG.replace(remat="none")
    scanned, unrolled = _compiled(cfg), _compiled(cfg.replace(unroll_layers=True))
    L, B, T, F = cfg.n_layers, 8, 128, cfg.d_ff
    stack = re.compile(rf"= f32\[{L},{B},{T},{F}\]\S* dynamic-update-slice\(")
    assert len(stack.findall(scanned.as_text())) == 2
    assert matmul_flops(unrolled.as_text()) == pytest.approx(counts.train_step_flops(cfg, B, T))


@pytest.mark.first_line  # one TPU compile of a tiny step (libtpu, no TPU needed), about 3 s
def test_on_a_tpu_the_matmuls_write_their_residuals_into_the_stacks():
    """The scanned step (no remat) compiled for a TPU v5e: XLA:TPU fuses the slot update into
    the matmul, so the forward's matmuls write the residuals they make (the MLP's gate and up
    at least) straight into their stacks, and the backward's write the weight gradients into
    theirs: the slot copies XLA:CPU makes (above) are that backend's, not the scan's. The
    4-layer step of docs/performance.md's table has the same matmul counts as this tiny one."""
    reason = aot.aot_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    cfg = CFG.replace(d_model=64, n_layers=2, d_ff=256, remat="none")
    devices = aot.target_devices("tpu:v5e:2x2")
    whole = NamedSharding(jax.sharding.Mesh(devices[:1], ("d",)), P())
    params = jax.eval_shape(lambda: ms.init_params(cfg, 0))
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=whole), params)
    batch = jax.ShapeDtypeStruct((4, 33), jnp.int32, sharding=whole)
    step = jax.jit(jax.value_and_grad(lambda p, b: pieces.loss(p, b, cfg)))
    compiled, _ = aot.compile_for_target("tpu:v5e:2x2", step, params, batch)
    forward, backward = [loop for loop in slot_access(compiled) if loop["matmuls"]]
    assert forward["matmul writes"] >= 2, forward
    # one gradient per layer weight: attention's four projections, the MLP's three
    assert backward["matmul writes"] >= 4, backward
