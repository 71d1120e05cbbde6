"""Collectives built from point-to-point sends: `jax.lax.ppermute` inside `jax.shard_map`.

Seed 002 ch3 "Exercise 3: Ring All-Reduce" and ch4 "The Ring Algorithm" / "The Tree Algorithm" build
all-reduce from send/recv. Here every function runs *inside* a shard_map body on the local block of
one device along one mesh axis `axis` (N = the axis size); other mesh axes are untouched, so the
same code reduces over one axis of a 2-D mesh. Each one equals a `jax.lax` built-in:

    ring_all_reduce, tree_all_reduce, recursive_doubling_all_reduce  ==  psum(x, axis)
    ring_reduce_scatter   ==  psum_scatter(x, axis, scatter_dimension=0, tiled=True)
    ring_all_gather       ==  all_gather(x, axis, axis=0, tiled=True)
    all_to_all            ==  all_to_all(x, axis, 0, 0, tiled=True)
    broadcast / scatter / gather / reduce to a root: the torch.distributed semantics in SPMD form.

SPMD has no "only the root receives": every device returns an array of the same shape. For
`gather` and `reduce` the root holds the result and the other devices return zeros (torch leaves
them undefined); `broadcast` and `scatter` fill every device.

Cost, in steps x bytes per step (one ppermute is one step; D = bytes of x on one device):
ring all-reduce 2(N-1) x D/N; ring all-gather / reduce-scatter (N-1) x D/N of the *full* buffer;
tree reduce + broadcast 2*ceil(log2 N) x D; recursive doubling log2 N x D; linear scatter / gather
and all-to-all N-1 x D/N. `jaxscale.analysis.hlo` counts these steps in the compiled program.

Python loops unroll at trace time on purpose: each step is a separate collective-permute in the HLO,
so the census sees the schedule (N <= a few dozen; no `fori_loop`).
"""

import jax
import jax.numpy as jnp


def _size(axis: str) -> int:
    return jax.lax.axis_size(axis)


def _varying(x: jax.Array, axis: str) -> jax.Array:
    """Mark `x` as varying over `axis`, which ppermute needs under check_vma=True.

    A replicated (P()) input arrives invariant; `pcast` refuses a value that already varies,
    which is the common case, so that refusal means there is nothing to do.
    """
    try:
        return jax.lax.pcast(x, axis, to="varying")
    except ValueError:
        return x


def _shift(n: int, k: int) -> list[tuple[int, int]]:
    """Every device i sends to i + k (mod n): one step of a ring."""
    return [(i, (i + k) % n) for i in range(n)]


def _chunks(x: jax.Array, n: int, what: str) -> jax.Array:
    if x.ndim == 0 or x.shape[0] % n:
        raise ValueError(
            f"{what} splits axis 0 into {n} equal chunks, but the local block has shape "
            f"{tuple(x.shape)}; make axis 0 a multiple of {n}"
        )
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])


def _pick(chunks: jax.Array, k) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(chunks, k, axis=0, keepdims=False)


def _put(chunks: jax.Array, chunk: jax.Array, k) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(chunks, chunk, k, axis=0)


def _check_root(root: int, n: int) -> None:
    if not 0 <= root < n:
        raise ValueError(f"root {root} is not a device index on an axis of size {n}")


# --- ring -------------------------------------------------------------------------------------


def ring_reduce_scatter(x: jax.Array, axis: str) -> jax.Array:
    """Phase 1 of the ring: N-1 steps; device r ends with the sum of chunk r.

    At step s device r forwards its running sum of chunk (r-s-1) mod N to r+1 and adds its own
    copy of the chunk it receives, so each chunk's partial sum travels once round the ring.
    """
    n = _size(axis)
    chunks_ND = _chunks(_varying(x, axis), n, "ring_reduce_scatter")
    r = jax.lax.axis_index(axis)
    acc = _pick(chunks_ND, (r - 1) % n)
    for s in range(n - 1):
        received = jax.lax.ppermute(acc, axis, _shift(n, 1))  # one step: D/N bytes
        acc = received + _pick(chunks_ND, (r - s - 2) % n)
    return acc


def ring_all_gather(x: jax.Array, axis: str) -> jax.Array:
    """N-1 steps; every block travels round the ring once. Output: the N blocks in rank order."""
    n = _size(axis)
    x = _varying(x, axis)
    r = jax.lax.axis_index(axis)
    out_ND = _put(jnp.zeros((n,) + x.shape, x.dtype), x, r)
    block = x
    for s in range(n - 1):
        block = jax.lax.ppermute(block, axis, _shift(n, 1))  # block of rank r-s-1
        out_ND = _put(out_ND, block, (r - s - 1) % n)
    return out_ND.reshape((n * x.shape[0],) + x.shape[1:]) if x.ndim else out_ND


def ring_all_reduce(x: jax.Array, axis: str) -> jax.Array:
    """Reduce-scatter + all-gather: 2(N-1) steps of D/N bytes (seed 002 ch4, "The Ring Algorithm").

    Any shape: the block is flattened and zero-padded to a multiple of N, then restored.
    """
    n = _size(axis)
    flat = x.reshape(-1)
    pad = (-flat.shape[0]) % n
    flat = jnp.pad(flat, (0, pad)) if pad else flat
    summed = ring_all_gather(ring_reduce_scatter(flat, axis), axis)
    return summed[: flat.shape[0] - pad].reshape(x.shape)


# --- trees and recursive doubling -------------------------------------------------------------


def tree_reduce(x: jax.Array, axis: str, root: int = 0) -> jax.Array:
    """Binomial tree: ceil(log2 N) steps of the full buffer; the root holds the sum.

    Ranks are renumbered so the root is virtual rank 0. At distance d, virtual ranks with
    v mod 2d == d send to v - d. Devices a ppermute does not target receive zeros, so adding the
    received value everywhere only changes the receivers. Other devices return zeros.
    """
    n = _size(axis)
    _check_root(root, n)
    acc = _varying(x, axis)
    v = (jax.lax.axis_index(axis) - root) % n
    d = 1
    while d < n:
        perm = [((u + root) % n, (u - d + root) % n) for u in range(n) if u % (2 * d) == d]
        acc = acc + jax.lax.ppermute(acc, axis, perm)
        d *= 2
    return jnp.where(v == 0, acc, jnp.zeros_like(acc))


def tree_broadcast(x: jax.Array, axis: str, root: int = 0) -> jax.Array:
    """Binomial tree from the root: ceil(log2 N) steps; every device ends with the root's x.

    Distances go down (…, 4, 2, 1): a device receives from v - lowbit(v) before it forwards.
    """
    n = _size(axis)
    _check_root(root, n)
    acc = _varying(x, axis)
    v = (jax.lax.axis_index(axis) - root) % n
    d = 1
    while 2 * d < n:
        d *= 2
    while d >= 1:
        perm = [((u + root) % n, (u + d + root) % n) for u in range(0, n - d, 2 * d)]
        received = jax.lax.ppermute(acc, axis, perm)
        acc = jnp.where(v % (2 * d) == d, received, acc)
        d //= 2
    return acc


def tree_all_reduce(x: jax.Array, axis: str) -> jax.Array:
    """Reduce up a binomial tree, broadcast down: 2*ceil(log2 N) steps (seed 002 ch4)."""
    return tree_broadcast(tree_reduce(x, axis), axis)


def recursive_doubling_all_reduce(x: jax.Array, axis: str) -> jax.Array:
    """log2 N steps; at distance d every device swaps its partial sum with rank XOR d."""
    n = _size(axis)
    if n & (n - 1):
        raise ValueError(
            f"recursive doubling needs a power-of-two axis size; axis {axis!r} has {n} devices "
            "(use ring_all_reduce or tree_all_reduce)"
        )
    acc = _varying(x, axis)
    d = 1
    while d < n:
        acc = acc + jax.lax.ppermute(acc, axis, [(i, i ^ d) for i in range(n)])
        d *= 2
    return acc


# --- rooted collectives and all-to-all -------------------------------------------------------


def broadcast(x: jax.Array, axis: str, root: int = 0) -> jax.Array:
    """Every device gets the root's x (binomial tree)."""
    return tree_broadcast(x, axis, root)


def reduce(x: jax.Array, axis: str, root: int = 0) -> jax.Array:
    """The root gets the sum over the axis; the other devices return zeros."""
    return tree_reduce(x, axis, root)


def scatter(x: jax.Array, axis: str, root: int = 0) -> jax.Array:
    """Device j gets chunk j of the root's x (axis 0 split N ways): N-1 sends of D/N."""
    n = _size(axis)
    _check_root(root, n)
    chunks_ND = _chunks(_varying(x, axis), n, "scatter")
    r = jax.lax.axis_index(axis)
    out = jnp.where(r == root, chunks_ND[root], jnp.zeros_like(chunks_ND[root]))
    for j in range(n):
        if j != root:
            out = out + jax.lax.ppermute(chunks_ND[j], axis, [(root, j)])
    return out


def gather(x: jax.Array, axis: str, root: int = 0) -> jax.Array:
    """The root gets every device's x in rank order (N-1 sends to the root); others return zeros."""
    n = _size(axis)
    _check_root(root, n)
    x = _varying(x, axis)
    out_ND = jnp.zeros((n,) + x.shape, x.dtype).at[root].set(x)
    for j in range(n):
        if j != root:
            out_ND = out_ND.at[j].set(jax.lax.ppermute(x, axis, [(j, root)]))
    out = out_ND.reshape((n * x.shape[0],) + x.shape[1:]) if x.ndim else out_ND
    return jnp.where(jax.lax.axis_index(axis) == root, out, jnp.zeros_like(out))


def all_to_all(x: jax.Array, axis: str) -> jax.Array:
    """Block transpose: device i's block j goes to device j's slot i. N-1 shifted sends of D/N."""
    n = _size(axis)
    chunks_ND = _chunks(_varying(x, axis), n, "all_to_all")
    r = jax.lax.axis_index(axis)
    out_ND = _put(jnp.zeros_like(chunks_ND), _pick(chunks_ND, r), r)
    for k in range(1, n):
        received = jax.lax.ppermute(_pick(chunks_ND, (r + k) % n), axis, _shift(n, k))
        out_ND = _put(out_ND, received, (r - k) % n)
    return out_ND.reshape(x.shape)
