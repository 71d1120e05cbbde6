"""The engine's device program, one per step (jaxscale/serve/engine.py schedules around it):
tokens through the paged cache, then each row's next token sampled on the device. `run` feeds
one kind of rows (the one-token rows [B, 1], or the prefill chunks [B, T]); `run_mixed` feeds
both kinds, one after the other, in one program.

A row's input token may be one the previous step sampled and the host has not read yet: `src`
names it in `prev` (the previous step's sampled tokens, [2 x B_max]: its one-token rows' and its
prefill chunks', [B_max] each), so the engine launches step n + 1 before it reads step n's
tokens back.
"""

from __future__ import annotations

import contextlib
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.model import moe as moe_lib
from jaxscale.model.pieces import DENSE
from jaxscale.serve import sampling

TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs; computed for every row, a [B, 20] top-k

# the page pool [L, n_pages, page_size, G, K] under tensor parallelism: each device holds its
# kv heads' pages, the ones its query heads read (attention needs no collective)
POOL_AXES = ("layers", None, None, "kv_heads", "head_dim")


@partial(jax.jit, static_argnames="cfg", donate_argnames="pool")
def run(params, pool, feed, prev_a, prev_b, cfg: ModelConfig):
    """One engine step on `feed` (host arrays: table [B, N], tokens, positions and src [B, T],
    last, index [B], settings, mask [B, V]): feed the tokens (tokens_BT, or prev[src_BT] where
    src_BT >= 0, prev = the previous step's two parts' tokens [B_max] each) at their
    positions through the paged cache, and sample each row's next token from the logits at its
    last real token among the tokens `mask` allows.

    Returns (pool, (tokens [B_max] (rows past B zero: the next step's `prev` half), the sampled
    tokens' log-probabilities [B], the top TOP_LOGPROBS (ids, log-probabilities) [B, 20]))."""
    return _part(params, pool, feed, jnp.concatenate([prev_a, prev_b]), prev_a.shape[0], cfg)


@partial(jax.jit, static_argnames="cfg", donate_argnames="pool")
def run_mixed(params, pool, ones, chunks, prev_a, prev_b, cfg: ModelConfig):
    """A step with both kinds of rows in one program: the one-token rows (`ones`, [B1, 1]) and
    then the prefill chunks (`chunks`, [B2, T]) through the page pool, each as `run` feeds it;
    both take their placeholders from the previous step's `prev` (a request is in one part).

    Returns (pool, (the one-token rows' outputs, the chunks' outputs)), each as `run` returns
    it: their tokens [B_max] are the next step's two `prev` halves, in that order."""
    prev_P = jnp.concatenate([prev_a, prev_b])
    pool, out_a = _part(params, pool, ones, prev_P, prev_a.shape[0], cfg)
    pool, out_b = _part(params, pool, chunks, prev_P, prev_a.shape[0], cfg)
    return pool, (out_a, out_b)


def _part(params, pool, feed, prev_P, b_max: int, cfg: ModelConfig):
    """`run`'s work on one feed, traced into the program that calls it; prev_P: `prev`'s two
    halves joined [2 x B_max]."""
    src_BT = feed["src"]
    tokens_BT = jnp.where(src_BT >= 0, prev_P[jnp.maximum(src_BT, 0)], feed["tokens"])
    B = tokens_BT.shape[0]
    cache = kv_cache.paged(pool, feed["table"])
    pc = DENSE.replace(moe=expert_moe) if _ep() > 1 else DENSE
    logits_BTV, cache = kv_cache.forward(params, tokens_BT, feed["positions"], cache, cfg, pc)
    logits_BV = logits_BTV[jnp.arange(B), feed["last"]]
    s = feed["settings"]
    keys_B = sampling.request_keys(s["seed"], feed["index"])
    tok_B = sampling.sample(
        logits_BV, keys_B, s["temperature"], s["top_k"], s["top_p"], feed["mask"]
    )
    logp_BV = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
    top_BK, top_ids_BK = jax.lax.top_k(logp_BV, min(TOP_LOGPROBS, logp_BV.shape[-1]))
    logp_B = jnp.take_along_axis(logp_BV, tok_B[:, None], axis=-1)[:, 0]
    tok_Bmax = jnp.zeros((b_max,), jnp.int32).at[:B].set(tok_B)
    pool = {n: x for n, x in cache.items() if n != "block_table"}
    return pool, (tok_Bmax, logp_B, top_ids_BK, top_BK)


def _ep() -> int:
    """The context mesh's `expert` axis (1 without one)."""
    return dict(jax.sharding.get_abstract_mesh().shape).get("expert", 1)


def expert_moe(h_BTD, p, cfg: ModelConfig, pc):
    """An MoE layer over the `expert` axis, for decode (`Pieces.moe`): every device routes all
    of the step's tokens (the engine's rows are on every device), runs its E/ep experts on their
    slots, and combines their outputs; the combines are summed over the axis -- one all-reduce
    of [B, T, D] per MoE layer. Training's dispatch/combine all-to-alls split the rows over the
    axis first; a decode step's handful of rows is not worth splitting, and every device then
    holds the whole cache. In f32 the sum is the one-device combine exactly (each token's k
    terms, the other devices' zeros)."""
    ep = _ep()
    e_local = cfg.n_experts // ep

    def mine(buf_EBCD, p_local, cfg):  # this device's experts on their slots, zeros elsewhere
        start = jax.lax.axis_index("expert") * e_local
        buf = jax.lax.dynamic_slice_in_dim(buf_EBCD, start, e_local, 0)
        out = moe_lib.local_experts(buf, p_local, cfg)
        return jax.lax.dynamic_update_slice_in_dim(jnp.zeros_like(buf_EBCD), out, start, 0)

    def body(h_BTD, p_moe):
        y_BTD, aux = moe_lib.moe_mlp(h_BTD, p_moe, cfg, pc.replace(experts=mine))
        return jax.lax.psum(y_BTD, "expert"), aux  # all-reduce [B, T, D]

    p_moe = {k: p[k] for k in moe_lib.MOE_KEYS if k in p}
    specs = {k: P() if k == moe_lib.ROUTER else P("expert") for k in p_moe}
    return jax.shard_map(body, in_specs=(P(), specs), out_specs=(P(), P()))(h_BTD, p_moe)


def place(params, pool, cfg: ModelConfig, mesh):
    """Parameters and pool laid out for decode on `mesh`: tensor parallelism (`tensor`: heads
    and MLP split, the pool by kv heads) or, for an MoE model, expert parallelism (`expert`:
    each device holds E/ep experts, the rest replicated). A data axis would split the engine's
    rows, which replicas do, not one engine."""
    from jaxscale.model import state as ms
    from jaxscale.sharding import REPLICATED_RULES, Sharder

    wide = {a: n for a, n in mesh.shape.items() if n > 1}
    allowed = {"expert"} if cfg.n_experts else {"tensor"}
    if set(wide) - allowed or len(wide) > 1:
        kind = "expert-parallel (--mesh ep=N)" if cfg.n_experts else "tensor-parallel (--mesh tp=N)"
        raise ValueError(
            f"the engine runs {kind} decode of this model; the mesh {dict(mesh.shape)} has "
            "other axes"
        )
    tp, ep = wide.get("tensor", 1), wide.get("expert", 1)
    if cfg.n_kv_heads % tp:
        raise ValueError(f"tp={tp} must divide the model's {cfg.n_kv_heads} kv heads")
    if cfg.n_experts % ep:
        raise ValueError(f"ep={ep} must divide the model's {cfg.n_experts} experts")
    sharder = Sharder(mesh, REPLICATED_RULES)
    with jax.set_mesh(mesh):
        params = jax.device_put(params, ms.param_shardings(cfg, sharder))
        # an int8 pool's scales [L, n_pages, page_size, G] split like its pages
        pool = {n: jax.device_put(x, sharder.named(POOL_AXES[: x.ndim])) for n, x in pool.items()}
    return params, pool


def on(mesh):
    """The mesh as the context of the step's dispatch, or nothing on one device."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)
