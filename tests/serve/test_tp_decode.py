"""Tensor-parallel decode on the mesh: heads and MLP over `tensor`, the KV cache split by kv
heads, rows over `data`: the same tokens as one device, with the all-reduces in the program."""

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
from jaxscale.serve import generate as gen
from jaxscale.serve import sampling
from jaxscale.sharding import REPLICATED_RULES, Sharder

CFG = ModelConfig(n_layers=2, n_heads=8, n_kv_heads=4, max_seq=48)


@functools.cache
def _params():  # on first use, not at collection (every xdist worker collects)
    return ms.init_params(CFG, 0)


PROMPTS = [[100, 101, 32, 61], [35, 32, 116, 104, 101, 110]]
SAMPLING = [sampling.SamplingParams(0.0), sampling.SamplingParams(1.0, seed=4)]


@pytest.mark.slow
@pytest.mark.first_line
def test_tensor_parallel_decode_gives_the_single_device_tokens():
    want = gen.generate(_params(), PROMPTS, CFG, 16, SAMPLING)
    mesh = build_mesh("dp=2,tp=4", devices=jax.devices()[:8])
    got = gen.generate(_params(), PROMPTS, CFG, 16, SAMPLING, mesh=mesh)
    assert got.row(0) == want.row(0) and got.row(1) == want.row(1)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)


@pytest.mark.slow
@pytest.mark.first_line
def test_the_kv_cache_is_split_by_kv_heads_and_attention_all_reduces():
    mesh = build_mesh("tp=4", devices=jax.devices()[:4])
    sharder = Sharder(mesh, REPLICATED_RULES)
    args = (
        jnp.zeros((1, 4), jnp.int32),
        jnp.array([4]),
        sampling.as_arrays(SAMPLING[:1]),
        jnp.array([8]),
    )
    with jax.set_mesh(mesh):
        params = jax.device_put(_params(), ms.param_shardings(CFG, sharder))
        cache = jax.jit(lambda: ms_cache(sharder))()
        _, report = compile_with_report(gen.generate_batch, params, *args, CFG, 8, None, sharder)
    assert cache["k"].sharding.spec[3] == "tensor"  # kv heads over the tensor axis
    assert "all-reduce" in report.collective_totals()  # row-parallel out-proj and down-proj


def ms_cache(sharder):
    from jaxscale.model import kv_cache

    return kv_cache.init_cache(CFG, 1, 12, sharder=sharder)


def _serve(mesh, ecfg, requests, max_new: int):
    """(tokens, log-probabilities by request, engine) of the engine on `mesh` (None: one
    device) serving `requests` (prompt, sampling) at once, queued and chunked."""
    from jaxscale.serve.engine import Engine
    from jaxscale.serve.scheduler import Request

    eng = Engine(_params(), CFG, ecfg, mesh=mesh)
    reqs = [Request(str(i), p, max_new, s) for i, (p, s) in enumerate(requests)]
    return (*drain(eng, reqs), eng)


@pytest.mark.slow
@pytest.mark.first_line
@pytest.mark.parametrize("tp", [2, 4])
def test_the_engine_on_a_tensor_mesh_gives_the_one_device_tokens(tp):
    """The continuous-batching engine with its parameters over `tensor` and its page pool split
    by kv heads: queued, chunked, greedy and sampled requests get the one-device engine's tokens
    (and log-probabilities), and the step program all-reduces over `tensor`."""
    from jaxscale.serve import program
    from jaxscale.serve.engine import EngineConfig

    ecfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, page_size=8, n_pages=24)
    requests = list(zip(PROMPTS * 2, SAMPLING * 2, strict=True))

    def run(mesh):
        return _serve(mesh, ecfg, requests, 10)

    want, want_lp, _ = run(None)
    got, got_lp, eng = run(build_mesh(f"tp={tp}", devices=jax.devices()[:tp]))
    assert got == want
    for rid in want_lp:
        np.testing.assert_allclose(got_lp[rid], want_lp[rid], atol=1e-4)
    k = eng.pool["k"]
    assert k.sharding.shard_shape(k.shape)[3] == CFG.n_kv_heads // tp  # kv heads split
    with jax.set_mesh(eng.mesh):  # the decode program ([2, 1]) as the engine runs it
        zeros = jnp.zeros((eng.b_max,), jnp.int32)
        args = (eng.params, eng.pool, eng.padding(2, 1), zeros, zeros)
        _, report = compile_with_report(program.run, *args, CFG)
    ops = report.collective_totals()
    assert ops["all-reduce"].count >= 2 * CFG.n_layers  # attention out and MLP down, per layer


@pytest.mark.slow  # three engines compiled; the fast suite keeps the int8 engine on one device
@pytest.mark.first_line
def test_an_int8_pool_on_a_tensor_mesh_gives_the_one_device_int8_tokens():
    """An int8 page pool split by kv heads (values [L, P, ps, G, K] and scales [L, P, ps, G]
    both over `tensor`): the one-device int8 engine's tokens, and its log-probabilities up to a
    rounding-boundary flip (`assert_int8_rounding`: far closer to them than to the float
    pool's)."""
    import dataclasses

    from jaxscale.serve.engine import EngineConfig
    from tests.model.test_kv_cache import assert_int8_rounding

    ecfg = EngineConfig(
        max_num_seqs=2, max_num_batched_tokens=8, page_size=8, n_pages=24, kv_dtype="int8"
    )
    requests = list(zip(PROMPTS, SAMPLING, strict=True))

    def run(mesh, ecfg=ecfg):
        return _serve(mesh, ecfg, requests, 6)

    want, want_lp, _ = run(None)
    got, got_lp, eng = run(build_mesh("tp=2", devices=jax.devices()[:2]))
    assert got == want
    full, full_lp, _ = run(None, dataclasses.replace(ecfg, kv_dtype=None))
    # compared where the float pool sampled the same tokens (a sample may differ after)
    same = {}
    for i, (f, w) in enumerate(zip(full, want, strict=True)):
        same[str(i)] = next((j for j, (a, b) in enumerate(zip(f, w, strict=True)) if a != b), 6)
    assert sum(same.values()) >= 4
    assert_int8_rounding(
        *([x for r, n in same.items() for x in lp[r][:n]] for lp in (got_lp, want_lp, full_lp))
    )
    for name in ("k", "k_scale"):
        x = eng.pool[name]
        assert x.sharding.shard_shape(x.shape)[3] == CFG.n_kv_heads // 2, name


def test_after_warm_up_the_engine_on_a_tensor_mesh_compiles_nothing():
    """warmup() compiles every program a step runs: on tp=2 serving queued, chunked requests
    then traces none (before: the sampled tokens fed back came typed on the mesh and the
    warm-up's zeros not, a new program per step shape: 6 in 10 steps, 8 s instead of 0.05)."""
    from jaxscale.serve.engine import Engine, EngineConfig
    from jaxscale.serve.scheduler import Request

    traced = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _, **__: (
            traced.append(event) if event == "/jax/core/compile/jaxpr_trace_duration" else None
        )
    )
    ecfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, page_size=8, n_pages=24)
    eng = Engine(_params(), CFG, ecfg, mesh=build_mesh("tp=2", devices=jax.devices()[:2]))
    assert eng.warmup() > 0
    before = len(traced)
    eng.run([Request(str(i), p, 6) for i, p in enumerate(PROMPTS * 2)])
    assert len(traced) == before, traced[before:]


def test_bench_serve_layouts_census_matches_two_all_reduces_per_layer():
    """bench serve --layouts: the tp=2 engine's decode ([2, 1]) and prefill ([1, 8]) programs
    all-reduce 2 x L x B x T x D f32 bytes per device in the layer loop (Megatron's attention
    and MLP outputs), and the one-device engine's nothing."""
    from jaxscale.bench import serve_layouts
    from jaxscale.serve.engine import Engine, EngineConfig

    ecfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, page_size=8, n_pages=24)
    tp = Engine(_params(), CFG, ecfg, mesh=build_mesh("tp=2", devices=jax.devices()[:2]))
    for B, T in ((2, 1), (1, 8)):
        got = serve_layouts.census(tp, B, T)
        want = 2 * CFG.n_layers * B * T * CFG.d_model * 4
        assert got["layers"] == want == serve_layouts.predicted_layer_bytes(CFG, "tp=2", B, T)
    one = serve_layouts.census(Engine(_params(), CFG, ecfg), 2, 1)
    assert one == {"layers": 0.0, "other": {}}
