"""Expert-parallel decode in the engine (`serve --mesh ep=N` on an MoE model): each device holds
E/ep experts, every device routes the step's tokens, and one all-reduce of [B, T, D] per MoE
layer sums the experts' outputs. The tokens are the one-device engine's."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engine_drive import drain

from jaxscale.analysis.compiled import compile_with_report
from jaxscale.config import ModelConfig
from jaxscale.mesh import build_mesh
from jaxscale.model import state as ms
from jaxscale.serve import sampling

# capacity-trained, served dropless (the engine's rule); two layers per group: one dense, one MoE
CFG = ModelConfig(
    n_layers=4, n_heads=4, n_kv_heads=2, max_seq=48, n_experts=8, top_k=2, moe_every=2
)
PROMPTS = [[100, 101, 32, 61], [35, 32, 116, 104, 101, 110]]
SAMPLING = [sampling.SamplingParams(0.0), sampling.SamplingParams(1.0, seed=4)]


@functools.cache
def _params():  # on first use, not at collection (every xdist worker collects)
    return ms.init_params(CFG, 0)


def _serve(mesh):
    from jaxscale.serve.engine import Engine, EngineConfig
    from jaxscale.serve.scheduler import Request

    ecfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, page_size=8, n_pages=24)
    eng = Engine(_params(), CFG, ecfg, mesh=mesh)
    reqs = [
        Request(str(i), p, 10, s)
        for i, (p, s) in enumerate(zip(PROMPTS * 2, SAMPLING * 2, strict=True))
    ]
    return (*drain(eng, reqs), eng)


@pytest.mark.slow  # two engines compiled; the fast suite keeps the refusals
@pytest.mark.first_line
def test_the_engine_on_an_expert_mesh_gives_the_one_device_tokens():
    """Queued, chunked, greedy and sampled requests on ep=4 get the one-device engine's tokens
    and log-probabilities; the experts' weights are split over `expert` (2 of 8 per device) and
    the decode program's all-reduces are one [B, 1, D] per MoE layer."""
    from jaxscale.serve import program

    want, want_lp, _ = _serve(None)
    got, got_lp, eng = _serve(build_mesh("ep=4", devices=jax.devices()[:4]))
    assert got == want
    for rid in want_lp:
        np.testing.assert_allclose(got_lp[rid], want_lp[rid], atol=1e-5)
    up = eng.params["blocks"]["we_up_EDF"]
    assert up.sharding.shard_shape(up.shape)[1] == CFG.n_experts // 4
    with jax.set_mesh(eng.mesh):  # the decode program ([2, 1]) as the engine runs it
        zeros = jnp.zeros((eng.b_max,), jnp.int32)
        args = (eng.params, eng.pool, eng.padding(2, 1), zeros, zeros)
        _, report = compile_with_report(program.run, *args, CFG.replace(moe_mode="dropless"))
    ops = report.collective_totals()
    moe_layers = CFG.n_layers // CFG.moe_every
    assert set(ops) == {"all-reduce"}, ops
    assert ops["all-reduce"].total_bytes == moe_layers * 2 * 1 * CFG.d_model * 4, ops


def test_an_expert_mesh_is_refused_for_a_dense_model_and_a_non_divisor():
    from jaxscale.model import kv_cache
    from jaxscale.serve import program
    from jaxscale.serve.replicas import replica_meshes

    mesh = build_mesh("ep=2", devices=jax.devices()[:2])
    dense = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=48)
    with pytest.raises(ValueError, match="tensor-parallel"):
        program.place({}, {}, dense, mesh)
    three = build_mesh("ep=3", devices=jax.devices()[:3])
    pool = kv_cache.init_paged(CFG, 4, 8)
    with pytest.raises(ValueError, match="ep=3 must divide the model's 8 experts"):
        program.place({}, pool, CFG, three)
    assert [dict(m.shape)["expert"] for m in replica_meshes("dp=2,ep=2", jax.devices())] == [2, 2]


@pytest.mark.slow  # an expert engine compiled twice
def test_bench_serve_layouts_census_matches_one_all_reduce_per_moe_layer():
    """bench serve --layouts' MoE row: the ep=4 engine's decode and prefill programs all-reduce
    one [B, T, D] f32 per MoE layer in the layer loop, its prediction."""
    from jaxscale.bench import serve_layouts
    from jaxscale.serve.engine import Engine, EngineConfig

    ecfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, page_size=8, n_pages=24)
    cfg = serve_layouts.moe_model(ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=48))
    mesh = build_mesh("ep=4", devices=jax.devices()[:4])
    eng = Engine(ms.init_params(cfg, 0), cfg, ecfg, mesh=mesh)
    for B, T in ((2, 1), (1, 8)):
        got = serve_layouts.census(eng, B, T)
        want = cfg.n_layers * B * T * cfg.d_model * 4
        assert got["layers"] == want == serve_layouts.predicted_layer_bytes(cfg, "ep=4", B, T)
