"""The contiguous KV cache and the cached forward pass: prefill and decode on the model's pieces.

The cache holds every layer's keys and values, [L, B, S, G, K] (S = max_len slots per row, G kv
heads: GQA-aware). Slot s of a row holds the token at position s, so the key positions are just
arange(S): a query at position t sees slots 0..t, and slots beyond t (empty, or left over from a
padded prompt) are masked by the causal rule alone, the same `pieces.attend` that training uses.
Each step writes its new keys and values at their positions before attending, so a slot is
always rewritten before it becomes visible.

`forward` is the one cached pass: tokens [B, T] at positions [B, T] (T = the prompt for a
prefill, a chunk of it for chunked prefill, 1 for a decode step). It returns logits [B, T, V]
float32 and the updated cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model.pieces import DENSE

# [L, B, S, G, K]: under tensor parallelism each device holds its kv heads' keys and values,
# the ones its query heads read, so attention needs no collective; rows split like the batch.
CACHE_AXES = ("layers", "batch", None, "kv_heads", "head_dim")


def init_cache(
    cfg: ModelConfig, batch: int, max_len: int | None = None, dtype=None, sharder=None
) -> dict:
    """Zeroed keys and values {"k", "v"}: [L, B, S, G, K] in the compute dtype (laid out by
    `sharder`'s rules when given: kv heads over the tensor axis)."""
    S = cfg.max_seq if max_len is None else max_len
    if not 1 <= S <= cfg.max_seq:
        raise ValueError(f"cache length {S} must be in [1, max_seq={cfg.max_seq}]")
    shape = (cfg.n_layers, batch, S, cfg.n_kv_heads, cfg.head_dim)
    dt = jnp.dtype(cfg.compute_dtype if dtype is None else dtype)
    cache = {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)}
    if sharder is not None:
        cache = {k: sharder.constrain(v, CACHE_AXES) for k, v in cache.items()}
    return cache


def _check(cfg: ModelConfig) -> None:
    if cfg.n_experts:
        raise ValueError(
            "the KV-cache forward covers dense models; an MoE model's cached "
            "decode is not implemented yet"
        )


def init_paged(cfg: ModelConfig, n_pages: int, page_size: int, dtype=None) -> dict:
    """A zeroed page pool {"k", "v"}: [L, n_pages, page_size, G, K]. A paged cache is the pool
    plus a block table [B, N] of page ids (row b's positions t live in page
    block_table[b, t // page_size] at offset t % page_size); `paged(pool, table)` joins them."""
    if n_pages < 1 or page_size < 1:
        raise ValueError(f"need n_pages >= 1 and page_size >= 1, got {n_pages}, {page_size}")
    shape = (cfg.n_layers, n_pages, page_size, cfg.n_kv_heads, cfg.head_dim)
    dt = jnp.dtype(cfg.compute_dtype if dtype is None else dtype)
    return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)}


def paged(pool: dict, block_table_BN) -> dict:
    """The cache `forward` takes for a page pool and a block table."""
    return {**pool, "block_table": jnp.asarray(block_table_BN, jnp.int32)}


def _write_read(cache: dict):
    """(write, read) for one layer's arrays of this cache's layout. write(k, v, kn, vn, pos)
    stores the new keys/values at their positions; read(k, v) gives [B, S, G, K] in position
    order, S = the cache length (contiguous) or N x page_size (paged: one gather of the row's
    pages, so both layouts attend over the same values in the same order)."""
    if "block_table" not in cache:

        def write(k_BSGK, v_BSGK, kn_BTGK, vn_BTGK, positions_BT):
            rows_B1 = jnp.arange(positions_BT.shape[0])[:, None]
            return (
                k_BSGK.at[rows_B1, positions_BT].set(kn_BTGK.astype(k_BSGK.dtype)),
                v_BSGK.at[rows_B1, positions_BT].set(vn_BTGK.astype(v_BSGK.dtype)),
            )

        return write, lambda k, v: (k, v)

    table_BN = cache["block_table"]

    def write_paged(k_PsGK, v_PsGK, kn_BTGK, vn_BTGK, positions_BT):
        ps, N = k_PsGK.shape[1], table_BN.shape[1]
        page_BT = jnp.take_along_axis(table_BN, jnp.minimum(positions_BT // ps, N - 1), axis=1)
        # a position beyond the row's table (a padding token's) writes to page 0, never read
        page_BT = jnp.where(positions_BT < N * ps, page_BT, 0)
        slot_BT = positions_BT % ps
        return (
            k_PsGK.at[page_BT, slot_BT].set(kn_BTGK.astype(k_PsGK.dtype)),
            v_PsGK.at[page_BT, slot_BT].set(vn_BTGK.astype(v_PsGK.dtype)),
        )

    def read_paged(k_PsGK, v_PsGK):
        B, N = table_BN.shape
        ps, G, K = k_PsGK.shape[1:]
        return (
            k_PsGK[table_BN].reshape(B, N * ps, G, K),
            v_PsGK[table_BN].reshape(B, N * ps, G, K),
        )

    return write_paged, read_paged


def _layer(x_BTD, p, k, v, positions_BT, cfg: ModelConfig, write, read):
    """One block with its cache: write this step's K/V at their positions, attend over the
    cache, then the MLP. Returns (x, k, v)."""
    h_BTD = pieces.rms_norm(x_BTD, p["attn_norm_D"], cfg.norm_eps)
    q_BTHK, kn_BTGK, vn_BTGK = pieces.qkv(h_BTD, p, positions_BT, cfg, DENSE)
    k, v = write(k, v, kn_BTGK, vn_BTGK, positions_BT)
    k_BSGK, v_BSGK = read(k, v)
    out_BTHK = pieces.attend(
        q_BTHK,
        k_BSGK.astype(q_BTHK.dtype),
        v_BSGK.astype(q_BTHK.dtype),
        positions_BT,
        jnp.arange(k_BSGK.shape[1]),
    )
    x_BTD = x_BTD + pieces.out_proj(out_BTHK, p)
    h_BTD = pieces.rms_norm(x_BTD, p["mlp_norm_D"], cfg.norm_eps)
    return x_BTD + pieces.mlp(h_BTD, p, cfg, DENSE), k, v


def forward(params, tokens_BT, positions_BT, cache: dict, cfg: ModelConfig):
    """Logits [B, T, V] float32 of tokens at positions (each inside the cache), and the cache
    (contiguous, or paged: the same keys) with their keys and values written."""
    _check(cfg)
    top, layers = pieces.split_params(params)
    x_BTD = pieces.embed(top, tokens_BT, cfg, DENSE)
    write, read = _write_read(cache)

    def body(x_BTD, xs):
        p, k, v = xs
        x_BTD, k, v = _layer(x_BTD, p, k, v, positions_BT, cfg, write, read)
        return x_BTD, (k, v)

    unroll = cfg.n_layers if cfg.unroll_layers else 1  # unrolled: one fused program, no loop
    x_BTD, (k, v) = jax.lax.scan(body, x_BTD, (layers, cache["k"], cache["v"]), unroll=unroll)
    logits_BTV = pieces.head(top, x_BTD, cfg, DENSE).astype(jnp.float32)
    return logits_BTV, {**cache, "k": k, "v": v}


def prefill(params, tokens_BT, lengths_B, cache: dict, cfg: ModelConfig, start_B=None):
    """Prompts [B, T], right-padded, of `lengths_B` tokens, written from position `start_B`
    (default 0; a later chunk of a chunked prefill starts where the last one ended). Returns
    (logits [B, V] at each row's last prompt token, cache)."""
    B, T = tokens_BT.shape
    start_B = jnp.zeros((B,), jnp.int32) if start_B is None else start_B
    positions_BT = start_B[:, None] + jnp.arange(T)[None, :]
    logits_BTV, cache = forward(params, tokens_BT, positions_BT, cache, cfg)
    last_B = jnp.clip(lengths_B - 1, 0, T - 1)
    return logits_BTV[jnp.arange(B), last_B], cache


def decode_step(params, tokens_B, positions_B, cache: dict, cfg: ModelConfig):
    """One new token per row at its position: (logits [B, V], cache)."""
    logits_B1V, cache = forward(params, tokens_B[:, None], positions_B[:, None], cache, cfg)
    return logits_B1V[:, 0], cache
