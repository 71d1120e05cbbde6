"""How context parallelism deals a sequence's tokens to the devices of the `context` axis.

zigzag (balanced for causal attention): the sequence is cut into 2c chunks of T/(2c) tokens and
device i holds chunks i and 2c-1-i, one early and one late; contiguous (the unbalanced
baseline): c chunks, device i holds chunk i. Positions are the tokens' true positions, in the
order the device holds them (i may be a traced axis index).
"""

from __future__ import annotations

import jax.numpy as jnp

AXIS = "context"
SPLITS = ("zigzag", "contiguous")


def n_chunks(split: str) -> int:
    """Chunks per device: 2 for zigzag, 1 for contiguous."""
    return 2 if split == "zigzag" else 1


def chunk_ids(i, c: int, split: str) -> list:
    """The sequence chunks device i of c holds (i may be a traced axis index)."""
    return [i, 2 * c - 1 - i] if split == "zigzag" else [i]


def device_positions(i, c: int, T: int, split: str):
    """The positions of device i's tokens [T/c], in the order it holds them."""
    s = T // (c * n_chunks(split))
    return jnp.concatenate([cid * s + jnp.arange(s) for cid in chunk_ids(i, c, split)])


def all_positions(c: int, T: int, split: str):
    """Every device's positions in device order [T]: the order the all-gather and the
    all-to-all lay the sequence out in."""
    return jnp.concatenate([device_positions(j, c, T, split) for j in range(c)])
