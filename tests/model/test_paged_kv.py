"""The paged KV cache equals the contiguous one exactly, and the page allocator's bookkeeping."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.model import state as ms
from jaxscale.serve.pages import NULL_PAGE, OutOfPages, PageAllocator

CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=32)
PARAMS = ms.init_params(CFG, 0)


def test_paged_attention_equals_contiguous_exactly():
    """Two rows, pages of 4 scattered through the pool (row 1's pages in reverse order), a
    prompt crossing a page boundary, then decode steps crossing two more."""
    tokens_BT = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 14)), jnp.int32)
    ps, N = 4, 4  # 16 positions per row, as the contiguous cache's length
    table = np.array([[3, 7, 1, 5], [8, 6, 4, 2]], np.int32)
    caches = {
        "contiguous": kv_cache.init_cache(CFG, 2, N * ps),
        "paged": kv_cache.paged(kv_cache.init_paged(CFG, 9, ps), table),
    }
    prefill = jax.jit(kv_cache.prefill, static_argnames="cfg")  # one compile per layout
    decode = jax.jit(kv_cache.decode_step, static_argnames="cfg")
    out = {}
    for name, cache in caches.items():
        logits, cache = prefill(PARAMS, tokens_BT[:, :6], jnp.array([6, 6]), cache, cfg=CFG)
        steps = [logits]
        for t in range(6, 14):
            logits, cache = decode(PARAMS, tokens_BT[:, t], jnp.array([t, t]), cache, cfg=CFG)
            steps.append(logits)
        out[name] = np.asarray(jnp.stack(steps, 1))
    np.testing.assert_array_equal(out["paged"], out["contiguous"])


def test_allocator_hands_out_each_page_once_and_takes_them_back():
    a = PageAllocator(n_pages=5, page_size=4)
    assert a.n_free == 4 and a.pages_for(9) == 3
    first = a.allocate(3)
    assert NULL_PAGE not in first and len(set(first)) == 3
    with pytest.raises(OutOfPages):
        a.allocate(2)
    assert a.n_free == 1  # a refused request takes nothing
    a.share(first[:2])  # a second request reuses a 2-page prefix
    a.release(first)
    assert a.n_free == 2  # the shared pages still have an owner
    a.release(first[:2])
    assert a.n_free == 4
    with pytest.raises(ValueError, match="released more often"):
        a.release(first[:1])
    with pytest.raises(ValueError, match="is free"):
        a.share(first[:1])


def test_a_paged_step_gathers_pages_without_slicing_out_a_layers_pool():
    """The engine's compiled step (`serve.program.run`, the pool donated): the only instructions
    of the pool's size are the pool itself, carried and written in place. Gathering a row's pages
    out of `pool[layer]` made XLA:CPU slice the layer's whole pool first, in every block of the
    attention loop: the step took 36 ms with 4,096 pages against 4 ms with 49 (docs/
    performance.md). cost_analysis counts a fused gather's whole operand either way, so the
    program's instructions are the check. 4,093 pages: a size no other dimension has."""
    from jaxscale.serve import program
    from jaxscale.serve.engine import Engine, EngineConfig

    cfg, n_pages = CFG.replace(max_seq=128), 4093
    eng = Engine(PARAMS, cfg, EngineConfig(max_num_seqs=2, page_size=8, n_pages=n_pages))
    feed = eng.padding(2, 1)
    feed["positions"][:] = 63
    feed["table"][:, :8] = np.arange(1, 17).reshape(2, 8)
    prev = (jnp.zeros((eng.b_max,), jnp.int32),) * 2
    hlo = program.run.lower(PARAMS, eng.pool, feed, *prev, cfg).compile().as_text()
    ops = re.findall(rf"= \w+\[[\d,]*\b{n_pages}\b[\d,]*\]\S* ([\w-]+)\(", hlo)
    assert ops, "the pool is not in the program"
    # the writes update it in place (a scatter, or a dynamic-update-slice, each alone or in a
    # fusion of their own); no slice, copy or gather yields a pool or a layer's pool
    carried = {"parameter", "get-tuple-element", "tuple", "while", "fusion"}
    carried |= {"scatter", "dynamic-update-slice"}
    assert set(ops) <= carried, sorted(set(ops) - carried)
