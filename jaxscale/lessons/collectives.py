"""Seed 002 ch3 demonstrations: the collective cheatsheet, distributed and weighted means,
gradient sync, distributed argmax and a vocab-parallel softmax
(its collective_cheatsheet.py and distributed_mean.py, and the "Try It Yourself" exercises).

Each cheatsheet operation runs twice, with the `jax.lax` built-in and with the ppermute version
from `jaxscale.parallel.collectives`; both must give the seed's AFTER rows.
"""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxscale.lessons.ranks import AXIS
from jaxscale.parallel import collectives as C

CHEATSHEET_OPS = (
    "broadcast",
    "scatter",
    "gather",
    "all_gather",
    "reduce",
    "all_reduce",
    "reduce_scatter",
)


def cheatsheet_before(op: str, world_size: int) -> np.ndarray:
    """The seed's data per rank ([W, ...]; rows of non-root ranks are zeros where the seed's are).

    reduce_scatter: the seed uses [1, 2, 3, 4] x (r + 1), which only works for W <= 4
    (demo_reduce_scatter);
    here the vector is [1 .. W] x (r + 1), the same for W = 4.
    """
    w, r = world_size, np.arange(world_size, dtype=np.float32)
    if op == "broadcast":
        return np.where(r[:, None] == 0, [42.0, 43.0, 44.0], 0.0).astype(np.float32)
    if op == "scatter":  # rank 0 holds [[0, 1], [10, 11], …]
        rows = np.stack([10 * r, 10 * r + 1], axis=1)
        return np.where(r[:, None, None] == 0, rows[None], 0.0).astype(np.float32)
    if op == "gather":
        return np.stack([100 * r, 100 * r + 1], axis=1)
    if op in ("all_gather", "reduce"):
        return (r + 1)[:, None]
    if op == "all_reduce":
        return np.stack([r + 1, 2 * (r + 1)], axis=1)
    if op == "reduce_scatter":
        return (np.arange(1, w + 1, dtype=np.float32)[None] * (r + 1)[:, None]).astype(np.float32)
    raise ValueError(f"unknown operation {op!r}; choose from {', '.join(CHEATSHEET_OPS)}")


def _op(op: str, impl: str):
    lax_ops = {
        "broadcast": lambda x: jax.lax.all_gather(x, AXIS)[0],
        "scatter": lambda x: jax.lax.all_gather(x, AXIS)[0][jax.lax.axis_index(AXIS)],
        "gather": lambda x: jax.lax.all_gather(x, AXIS),
        "all_gather": lambda x: jax.lax.all_gather(x, AXIS, tiled=True),
        "reduce": lambda x: jax.lax.psum(x, AXIS),
        "all_reduce": lambda x: jax.lax.psum(x, AXIS),
        "reduce_scatter": lambda x: jax.lax.psum_scatter(x, AXIS, tiled=True),
    }
    ppermute_ops = {
        "broadcast": lambda x: C.broadcast(x, AXIS),
        "scatter": lambda x: C.scatter(x, AXIS)[0],
        "gather": lambda x: C.gather(x[None], AXIS),
        "all_gather": lambda x: C.ring_all_gather(x, AXIS),
        "reduce": lambda x: C.reduce(x, AXIS),
        "all_reduce": lambda x: C.ring_all_reduce(x, AXIS),
        "reduce_scatter": lambda x: C.ring_reduce_scatter(x, AXIS),
    }
    table = {"lax": lax_ops, "ppermute": ppermute_ops}
    if impl not in table:
        raise ValueError(f"impl must be 'lax' or 'ppermute', got {impl!r}")
    return table[impl][op]


def cheatsheet_after(mesh, op: str, impl: str = "lax") -> np.ndarray:
    """AFTER rows of one cheatsheet operation (root 0). SPMD: every rank returns a value; for
    gather/reduce the built-in gives everyone the result, the ppermute version zeros off-root."""
    before = cheatsheet_before(op, mesh.shape[AXIS])
    fn = _op(op, impl)
    f = jax.jit(
        jax.shard_map(lambda x: fn(x[0])[None], mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
    )
    return np.asarray(f(before))


# --- means ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Means:
    local_means: np.ndarray  # [W]
    local_sizes: np.ndarray  # [W]
    global_mean: float  # from collectives
    reference: float  # numpy over the concatenated valid data


def distributed_mean(mesh, data_size: int = 100, seed: int = 42, weighted: bool = False) -> Means:
    """Demo 1 (equal sizes: psum(x) / W) and Demo 2 (weighted: psum(sum) / psum(count)).

    Data: normal(fold_in(seed, r)) + r per rank (the seed's torch.randn + rank). Weighted sizes are
    the seed's [d, d, d, d // 2] generalised to any W: every rank d, the last d // 2 (the seed's
    list has four entries and fails for W > 4). Unequal shards are padded to d and masked.
    """
    if data_size < 2:
        raise ValueError(f"data size must be at least 2, got {data_size}")
    w = mesh.shape[AXIS]
    sizes = np.full(w, data_size)
    if weighted:
        sizes[-1] = data_size // 2
    data = np.stack(
        [
            np.asarray(jax.random.normal(jax.random.fold_in(jax.random.key(seed), r), (data_size,)))
            + r
            for r in range(w)
        ]
    ).astype(np.float32)
    mask = np.arange(data_size)[None, :] < sizes[:, None]

    def body(x, valid):
        x, valid = x[0], valid[0]
        local_sum = jnp.sum(jnp.where(valid, x, 0.0))
        count = jnp.sum(valid).astype(jnp.float32)
        if weighted:
            mean = jax.lax.psum(local_sum, AXIS) / jax.lax.psum(count, AXIS)
        else:  # all_reduce(SUM) / world_size, then the mean of the vector, as the seed prints
            mean = jnp.mean(jax.lax.psum(x, AXIS) / w)
        return (local_sum / count)[None], mean[None]

    f = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS), P(AXIS)), out_specs=(P(AXIS), P(AXIS)))
    )
    local_means, means = f(data, mask)
    return Means(
        np.asarray(local_means), sizes, float(np.asarray(means)[0]), float(data[mask].mean())
    )


def mean_of_values(mesh, values_W) -> float:
    """Ex1: each rank holds one number; all_reduce(SUM) / W (the seed's 1..4 -> 2.5)."""
    w = mesh.shape[AXIS]
    f = jax.jit(
        jax.shard_map(
            lambda v: jax.lax.psum(v[0], AXIS) / w, mesh=mesh, in_specs=P(AXIS), out_specs=P()
        )
    )
    return float(f(jnp.asarray(values_W, jnp.float32)))


def gradient_sync(mesh, size: int = 10, seed: int = 123) -> tuple[np.ndarray, np.ndarray]:
    """Demo 3: per-rank fake gradients, before and after all_reduce(SUM) / W ([W, size] each)."""
    w = mesh.shape[AXIS]
    grads = np.stack(
        [
            np.asarray(jax.random.normal(jax.random.fold_in(jax.random.key(seed), r), (size,)))
            for r in range(w)
        ]
    )
    f = jax.jit(
        jax.shard_map(
            lambda g: jax.lax.psum(g, AXIS) / w, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)
        )
    )
    return grads, np.asarray(f(grads))


# --- argmax and softmax -----------------------------------------------------------------------


def distributed_argmax(mesh, values_WK) -> tuple[float, int]:
    """Ex2: the global maximum and the rank holding it, lowest rank on ties.

    pmax gives the value; pmin over (rank if mine equals it else W) names the owner.
    """
    w = mesh.shape[AXIS]

    def body(v_1K):
        local_max = jnp.max(v_1K)
        best = jax.lax.pmax(local_max, AXIS)
        r = jax.lax.axis_index(AXIS)
        owner = jax.lax.pmin(jnp.where(local_max == best, r, w), AXIS)
        return best, owner

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=(P(), P())))
    best, owner = f(jnp.asarray(values_WK))
    return float(best), int(owner)


def vocab_parallel_softmax(logits_BV, axis: str = AXIS) -> jax.Array:
    """Softmax over a vocab axis sharded across `axis` (call inside shard_map).

    m = pmax(local max) keeps exp() in range; s = psum(sum exp(x - m)); y = exp(x - m) / s.
    Two scalar-per-row collectives, no gather of the logits.
    """
    m_B1 = jax.lax.pmax(jnp.max(logits_BV, axis=-1, keepdims=True), axis)
    e_BV = jnp.exp(logits_BV - m_B1)
    return e_BV / jax.lax.psum(jnp.sum(e_BV, axis=-1, keepdims=True), axis)


def sharded_softmax(mesh, logits_BV) -> np.ndarray:
    """vocab_parallel_softmax on logits split along V over the mesh axis."""
    f = jax.jit(
        jax.shard_map(
            vocab_parallel_softmax, mesh=mesh, in_specs=P(None, AXIS), out_specs=P(None, AXIS)
        )
    )
    return np.asarray(f(jnp.asarray(logits_BV)))
