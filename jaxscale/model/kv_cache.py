"""The contiguous KV cache and the cached forward pass: prefill and decode on the model's pieces.

The cache holds every layer's keys and values, [L, B, S, G, K] (S = max_len slots per row, G kv
heads: GQA-aware). Slot s of a row holds the token at position s, so the key positions are just
arange(S): a query at position t sees slots 0..t, and slots beyond t (empty, or left over from a
padded prompt) are masked by the causal rule alone, the rule of `pieces.attend` that training
uses. Attention reads the slots in blocks, up to the last position any row holds (`Layout`):
the slots past it are never read, so a step's cost follows the live tokens, not S. Each step
writes its new keys and values at their positions before attending, so a slot is always
rewritten before it becomes visible.

`forward` is the one cached pass: tokens [B, T] at positions [B, T] (T = the prompt for a
prefill, a chunk of it for chunked prefill, 1 for a decode step). It returns logits [B, T, V]
float32 and the updated cache. It is the model's trunk (`pieces.trunk`) with the cache's layout,
contiguous or paged, as the `cache` piece, so any pieces run cached: an MoE model's, a
strategy's. (Capacity-based MoE routing depends on how many tokens a call holds, so a
token-at-a-time decode equals the uncached forward where no token is dropped: dropless, or a
capacity large enough.)

An int8 cache (`dtype="int8"`) stores each token's key and value of each kv head as int8 with one
float32 scale (symmetric: max |x| over head_dim / 127), {"k", "v", "k_scale", "v_scale"}: a
token costs G x (K + 4) bytes per layer for keys, against G x 2K in bf16 (seed 002 ch. 9's "2x
requests", less the scales). Attention reads the int8 blocks and multiplies by the scales.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxscale.config import ModelConfig
from jaxscale.model import blockwise, pieces
from jaxscale.model.pieces import DENSE

# [L, B, S, G, K]: under tensor parallelism each device holds its kv heads' keys and values,
# the ones its query heads read, so attention needs no collective; rows split like the batch.
CACHE_AXES = ("layers", "batch", None, "kv_heads", "head_dim")


KV_DTYPES = ("int8",)  # quantized storage (besides any float dtype): per token-and-head scales


def _zeros(shape, cfg: ModelConfig, dtype) -> dict:
    """Zeroed {"k", "v"} of `shape` [..., G, K] in `dtype` (None: the compute dtype); int8 adds
    their scales {"k_scale", "v_scale"} [..., G] float32."""
    dt = jnp.dtype(cfg.compute_dtype if dtype is None else dtype)
    if dt == jnp.int8:
        scales = {f"{n}_scale": jnp.zeros(shape[:-1], jnp.float32) for n in ("k", "v")}
        return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt), **scales}
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"KV cache dtype {dt}: a float dtype or one of {KV_DTYPES}")
    return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)}


def bytes_per_token(cfg: ModelConfig, dtype=None) -> int:
    """Bytes one token's keys and values take in every layer, scales included."""
    z = _zeros((cfg.n_layers, 1, cfg.n_kv_heads, cfg.head_dim), cfg, dtype)
    return sum(x.size * x.dtype.itemsize for x in z.values())


def init_cache(
    cfg: ModelConfig, batch: int, max_len: int | None = None, dtype=None, sharder=None
) -> dict:
    """Zeroed keys and values {"k", "v"}: [L, B, S, G, K] in the compute dtype, or `dtype`
    (int8: with scales [L, B, S, G]), laid out by `sharder`'s rules when given: kv heads over
    the tensor axis."""
    S = cfg.max_seq if max_len is None else max_len
    if not 1 <= S <= cfg.max_seq:
        raise ValueError(f"cache length {S} must be in [1, max_seq={cfg.max_seq}]")
    cache = _zeros((cfg.n_layers, batch, S, cfg.n_kv_heads, cfg.head_dim), cfg, dtype)
    if sharder is not None:
        cache = {k: sharder.constrain(v, CACHE_AXES[: v.ndim]) for k, v in cache.items()}
    return cache


def init_paged(cfg: ModelConfig, n_pages: int, page_size: int, dtype=None) -> dict:
    """A zeroed page pool {"k", "v"}: [L, n_pages, page_size, G, K] (int8: with scales
    [L, n_pages, page_size, G]). A paged cache is the pool plus a block table [B, N] of page ids
    (row b's positions t live in page block_table[b, t // page_size] at offset
    t % page_size); `paged(pool, table)` joins them."""
    if n_pages < 1 or page_size < 1:
        raise ValueError(f"need n_pages >= 1 and page_size >= 1, got {n_pages}, {page_size}")
    shape = (cfg.n_layers, n_pages, page_size, cfg.n_kv_heads, cfg.head_dim)
    return _zeros(shape, cfg, dtype)


def quantize(x_GK):
    """Symmetric int8 per vector of the last axis: (q int8, scale float32 [...]) with
    scale = max |x| / 127 and q = round(x / scale); x ~ q x scale within scale / 2. A zero
    vector gets scale 0 and q 0."""
    x = x_GK.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x), axis=-1) / 127.0
    q = jnp.round(x / jnp.where(scale > 0, scale, 1.0)[..., None])
    return q.astype(jnp.int8), scale


def _stored(cache, kn_BTGK, vn_BTGK) -> dict:
    """What a write puts in the cache: the new keys and values in its dtype, or int8 and their
    scales."""
    if "k_scale" not in cache:
        return {"k": kn_BTGK.astype(cache["k"].dtype), "v": vn_BTGK.astype(cache["v"].dtype)}
    (kq, ks), (vq, vs) = quantize(kn_BTGK), quantize(vn_BTGK)
    return {"k": kq, "v": vq, "k_scale": ks, "v_scale": vs}


def _loaded(one, cache):
    """(keys, values) of a block: `one` reads the block of an array of the cache; int8 is
    multiplied by its scales."""
    kv = []
    for n in ("k", "v"):
        x = one(cache[n])
        if f"{n}_scale" in cache:
            x = x.astype(jnp.float32) * one(cache[f"{n}_scale"])[..., None]
        kv.append(x)
    return tuple(kv)


def paged(pool: dict, block_table_BN) -> dict:
    """The cache `forward` takes for a page pool and a block table."""
    return {**pool, "block_table": jnp.asarray(block_table_BN, jnp.int32)}


BLOCK = 128  # key slots per iteration of the cached attention loop


@dataclass(frozen=True)
class Layout:
    """A KV cache's layout (`Pieces.cache`): where slot s (the token at position s) of a row lives
    in every layer's keys and values {"k", "v"}, [L, ...], which the layer scan carries and each
    layer updates in place.

    write(cache, layer, k_BTGK, v_BTGK, positions_BT) -> cache   the new keys and values
    read(cache, layer, start) -> (k [B, block, G, K], v)         slots [start, start + block)
    slots                                                        S, slots per row
    """

    write: Callable
    read: Callable
    slots: int
    block: int

    def attend(self, q_BTHK, cache, layer, positions_BT):
        """Causal attention of queries at their positions [B, T] over the cache's live slots only:
        a loop over blocks of `block` slots up to the last position a real query holds (slots
        past it are never read), each block attended and merged by log-sum-exp
        (model/blockwise.py, as ring attention merges its blocks). A position >= S (a padding
        row's) sees every live slot and sets no bound."""
        S, blk = self.slots, self.block
        live = jnp.max(jnp.where(positions_BT < S, positions_BT, 0)) + 1

        def body(j, acc):
            # the last block may start early so it stays inside the S slots; the slots it shares
            # with the block before were counted there, so they get a position no query reaches
            start = jnp.minimum(j * blk, S - blk)
            k_BbGK, v_BbGK = self.read(cache, layer, start)
            slots_b = start + jnp.arange(blk)
            k_positions_b = jnp.where(slots_b >= j * blk, slots_b, jnp.iinfo(jnp.int32).max)
            dt = q_BTHK.dtype
            part = blockwise.block_attend(
                q_BTHK, k_BbGK.astype(dt), v_BbGK.astype(dt), positions_BT, k_positions_b
            )
            return blockwise.merge(acc, part)

        out_BTHK, _ = jax.lax.fori_loop(0, (live + blk - 1) // blk, body, blockwise.empty(q_BTHK))
        return out_BTHK.astype(q_BTHK.dtype)


def contiguous(S: int, block: int = BLOCK) -> Layout:
    """The contiguous layout of S slots per row: keys and values [L, B, S, G, K], slot s of a row
    at position s."""
    blk = min(block, S)

    def write(cache, layer, kn_BTGK, vn_BTGK, positions_BT):
        rows_B1 = jnp.arange(positions_BT.shape[0])[:, None]
        # a scatter into the carried cache: in place (a position >= S, padding, is dropped)
        new = _stored(cache, kn_BTGK, vn_BTGK)
        return {n: cache[n].at[layer, rows_B1, positions_BT].set(x) for n, x in new.items()}

    def read(cache, layer, start):
        def one(x_LBS___):  # keys or values [L, B, S, G, K], or their scales [L, B, S, G]
            size = (1, x_LBS___.shape[1], blk, *x_LBS___.shape[3:])
            at = (layer, 0, start) + (0,) * (x_LBS___.ndim - 3)
            return jax.lax.dynamic_slice(x_LBS___, at, size)[0]

        return _loaded(one, cache)

    return Layout(write, read, S, blk)


def paged_layout(block_table_BN, page_size: int, block: int = BLOCK) -> Layout:
    """The paged layout of a block table [B, N]: keys and values are page pools
    [L, n_pages, page_size, G, K]; row b's position t lives in page table[b, t // page_size] at
    offset t % page_size. A block is a run of whole pages of the row's table: the same keys in
    the same order as the contiguous layout."""
    ps, N = page_size, block_table_BN.shape[1]
    n_pages = max(1, min(block // ps, N))

    def write(cache, layer, kn_BTGK, vn_BTGK, positions_BT):
        idx_BT = jnp.minimum(positions_BT // ps, N - 1)
        page_BT = jnp.take_along_axis(block_table_BN, idx_BT, axis=1)
        # a position beyond the row's table (a padding token's) writes to page 0, never read
        page_BT = jnp.where(positions_BT < N * ps, page_BT, 0)
        slot_BT = positions_BT % ps
        new = _stored(cache, kn_BTGK, vn_BTGK)
        return {n: cache[n].at[layer, page_BT, slot_BT].set(x) for n, x in new.items()}

    def read(cache, layer, start):
        pages_Bn = jax.lax.dynamic_slice_in_dim(block_table_BN, start // ps, n_pages, axis=1)

        def one(pool_LPs__):  # a pool [L, n_pages, page_size, G, K], or its scales [..., G]
            # one gather of (layer, page) pairs: `pool[layer][pages]` made XLA:CPU slice the
            # layer's whole pool out first, each block -- a step's time grew with the pool
            x_Bns__ = pool_LPs__[layer, pages_Bn]
            B, n, s = x_Bns__.shape[:3]
            return x_Bns__.reshape(B, n * s, *x_Bns__.shape[3:])

        return _loaded(one, cache)

    return Layout(write, read, N * ps, n_pages * ps)


def forward(params, tokens_BT, positions_BT, cache: dict, cfg: ModelConfig, pc=DENSE, block=BLOCK):
    """Logits [B, T, V] float32 of tokens at positions (each inside the cache), and the cache
    (contiguous, or paged: the same keys) with their keys and values written: the model's trunk
    with the cache's layout as its `cache` piece. Attention reads the live slots only, `block`
    slots at a time."""
    table = cache.get("block_table")
    if table is None:
        layout = contiguous(cache["k"].shape[2], block)
    else:
        layout = paged_layout(table, cache["k"].shape[2], block)
    pc = pc.replace(cache=layout)
    kv = {n: x for n, x in cache.items() if n != "block_table"}  # keys, values (and scales)
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
