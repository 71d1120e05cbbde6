"""The engine's one device program per shape (jaxscale/serve/engine.py schedules around it):
tokens through the paged cache, then each row's next token sampled on the device.

A row's input token may be one the previous step sampled and the host has not read yet: `src`
names it in `prev` (the previous step's sampled tokens, [2 x B_max]: its decode and prefill
programs', [B_max] each), so the engine launches step n + 1 before it reads step n's tokens
back.
"""

from __future__ import annotations

import contextlib
from functools import partial

import jax
import jax.numpy as jnp

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.serve import sampling

TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs; computed for every row, a [B, 20] top-k

# the page pool [L, n_pages, page_size, G, K] under tensor parallelism: each device holds its
# kv heads' pages, the ones its query heads read (attention needs no collective)
POOL_AXES = ("layers", None, None, "kv_heads", "head_dim")


@partial(jax.jit, static_argnames="cfg", donate_argnames="pool")
def run(params, pool, feed, prev_a, prev_b, cfg: ModelConfig):
    """One engine step on `feed` (host arrays: table [B, N], tokens, positions and src [B, T],
    last, index [B], settings, mask [B, V]): feed the tokens (tokens_BT, or prev[src_BT] where
    src_BT >= 0, prev = the previous step's two programs' tokens [B_max] each) at their
    positions through the paged cache, and sample each row's next token from the logits at its
    last real token among the tokens `mask` allows.

    Returns (pool, (tokens [B_max] (rows past B zero: the next step's `prev` half), the sampled
    tokens' log-probabilities [B], the top TOP_LOGPROBS (ids, log-probabilities) [B, 20]))."""
    prev_P = jnp.concatenate([prev_a, prev_b])
    src_BT = feed["src"]
    tokens_BT = jnp.where(src_BT >= 0, prev_P[jnp.maximum(src_BT, 0)], feed["tokens"])
    B = tokens_BT.shape[0]
    cache = kv_cache.paged(pool, feed["table"])
    logits_BTV, cache = kv_cache.forward(params, tokens_BT, feed["positions"], cache, cfg)
    logits_BV = logits_BTV[jnp.arange(B), feed["last"]]
    s = feed["settings"]
    keys_B = sampling.request_keys(s["seed"], feed["index"])
    tok_B = sampling.sample(
        logits_BV, keys_B, s["temperature"], s["top_k"], s["top_p"], feed["mask"]
    )
    logp_BV = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
    top_BK, top_ids_BK = jax.lax.top_k(logp_BV, min(TOP_LOGPROBS, logp_BV.shape[-1]))
    logp_B = jnp.take_along_axis(logp_BV, tok_B[:, None], axis=-1)[:, 0]
    tok_Bmax = jnp.zeros(prev_a.shape, jnp.int32).at[:B].set(tok_B)
    pool = {n: x for n, x in cache.items() if n != "block_table"}
    return pool, (tok_Bmax, logp_B, top_ids_BK, top_BK)


def place(params, pool, cfg: ModelConfig, mesh):
    """Parameters and pool laid out for tensor-parallel decode on `mesh` (a mesh whose only
    axis of size > 1 is `tensor`: a data axis would split the engine's rows, which replicas
    do, not one engine)."""
    from jaxscale.model import state as ms
    from jaxscale.sharding import REPLICATED_RULES, Sharder

    wide = {a: n for a, n in mesh.shape.items() if n > 1}
    if set(wide) - {"tensor"}:
        raise ValueError(
            f"the engine runs tensor-parallel decode (--mesh tp=N); the mesh {dict(mesh.shape)} "
            "has other axes"
        )
    tp = wide.get("tensor", 1)
    if cfg.n_kv_heads % tp:
        raise ValueError(f"tp={tp} must divide the model's {cfg.n_kv_heads} kv heads")
    if cfg.n_experts:
        raise ValueError("tensor-parallel decode of an MoE model is not implemented")
    sharder = Sharder(mesh, REPLICATED_RULES)
    with jax.set_mesh(mesh):
        params = jax.device_put(params, ms.param_shardings(cfg, sharder))
        # an int8 pool's scales [L, n_pages, page_size, G] split like its pages
        pool = {n: jax.device_put(x, sharder.named(POOL_AXES[: x.ndim])) for n, x in pool.items()}
    return params, pool


def on(mesh):
    """The mesh as the context of the step's dispatch, or nothing on one device."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)
