"""The contiguous KV cache and the cached forward pass: prefill and decode on the model's pieces.

The cache holds every layer's keys and values, [L, B, S, G, K] (S = max_len slots per row, G kv
heads: GQA-aware). Slot s of a row holds the token at position s, so the key positions are just
arange(S): a query at position t sees slots 0..t, and slots beyond t (empty, or left over from a
padded prompt) are masked by the causal rule alone, the same `pieces.attend` that training uses.
Each step writes its new keys and values at their positions before attending, so a slot is
always rewritten before it becomes visible.

`forward` is the one cached pass: tokens [B, T] at positions [B, T] (T = the prompt for a
prefill, a chunk of it for chunked prefill, 1 for a decode step). It returns logits [B, T, V]
float32 and the updated cache. It is the model's trunk (`pieces.trunk`) with the cache's layout,
contiguous or paged, as the `cache` piece, so any pieces run cached: an MoE model's, a
strategy's. (Capacity-based MoE routing depends on how many tokens a call holds, so a
token-at-a-time decode equals the uncached forward where no token is dropped: dropless, or a
capacity large enough.)
"""

from __future__ import annotations

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


def contiguous(kv, kn_BTGK, vn_BTGK, positions_BT):
    """The contiguous layout (`Pieces.cache`): one layer's (k, v) [B, S, G, K], slot s of a row
    at position s. Writes the new keys and values at their positions: (kv, k, v)."""
    k_BSGK, v_BSGK = kv
    rows_B1 = jnp.arange(positions_BT.shape[0])[:, None]
    k_BSGK = k_BSGK.at[rows_B1, positions_BT].set(kn_BTGK.astype(k_BSGK.dtype))
    v_BSGK = v_BSGK.at[rows_B1, positions_BT].set(vn_BTGK.astype(v_BSGK.dtype))
    return (k_BSGK, v_BSGK), k_BSGK, v_BSGK


def paged_layout(block_table_BN):
    """The paged layout (`Pieces.cache`) of a block table [B, N]: one layer's (k, v) page pool
    [n_pages, page_size, G, K]; row b's position t lives in page table[b, t // page_size] at
    offset t % page_size. Reading gathers each row's N pages in order, [B, N x page_size, G, K]:
    the same keys in the same order as the contiguous layout."""

    def cache(kv, kn_BTGK, vn_BTGK, positions_BT):
        k_PsGK, v_PsGK = kv
        ps, N = k_PsGK.shape[1], block_table_BN.shape[1]
        idx_BT = jnp.minimum(positions_BT // ps, N - 1)
        page_BT = jnp.take_along_axis(block_table_BN, idx_BT, axis=1)
        # a position beyond the row's table (a padding token's) writes to page 0, never read
        page_BT = jnp.where(positions_BT < N * ps, page_BT, 0)
        slot_BT = positions_BT % ps
        k_PsGK = k_PsGK.at[page_BT, slot_BT].set(kn_BTGK.astype(k_PsGK.dtype))
        v_PsGK = v_PsGK.at[page_BT, slot_BT].set(vn_BTGK.astype(v_PsGK.dtype))
        B, (G, K) = block_table_BN.shape[0], k_PsGK.shape[2:]
        k_BSGK = k_PsGK[block_table_BN].reshape(B, N * ps, G, K)
        v_BSGK = v_PsGK[block_table_BN].reshape(B, N * ps, G, K)
        return (k_PsGK, v_PsGK), k_BSGK, v_BSGK

    return cache


def forward(params, tokens_BT, positions_BT, cache: dict, cfg: ModelConfig, pc=DENSE):
    """Logits [B, T, V] float32 of tokens at positions (each inside the cache), and the cache
    (contiguous, or paged: the same keys) with their keys and values written: the model's trunk
    with the cache's layout as its `cache` piece."""
    table = cache.get("block_table")
    layout = contiguous if table is None else paged_layout(table)
    pc = pc.replace(cache=layout)
    kv = {"k": cache["k"], "v": cache["v"]}
    top, x_BTD, _, kv = pieces.trunk(params, tokens_BT, positions_BT, cfg, pc, kv)
    logits_BTV = pc.head(top, x_BTD, cfg, pc).astype(jnp.float32)
    return logits_BTV, {**cache, **kv}


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
