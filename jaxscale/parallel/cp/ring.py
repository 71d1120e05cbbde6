"""Ring attention over the `context` axis (the `cp_ring` form of jaxscale/parallel/cp/):
each device keeps its queries while the K/V blocks travel the ring, a fully masked chunk pair is
skipped by a conditional, partial results merge by log-sum-exp rescaling; the backward is a
ring of its own (a custom VJP) that recomputes each pair's probabilities from the log-sum-exp,
with dK/dV travelling beside their blocks (docs/context.md).

Each hop is one collective-permute, or, with `grouped` (the ring inside a pipeline schedule),
one all-to-all over the context group. XLA:CPU's runtime joins every collective-permute of the
program into one rendezvous of all the mesh's devices (a permute has no replica groups, and JAX
gives every collective the same channel id), pairing each device's next permute with every other
device's next one, whichever op that is. Where every device runs the same permutes in the same
order that is harmless; inside a schedule's per-tick branch, which only one pipe stage takes,
the ring's hops on one stage paired with the stage transfer, or another hop count, on the
others, and a stage received a K/V block as its input activation. An all-to-all names its replica
groups -- the devices of one context group, which share a pipe stage and so always take the same
branch -- and meets only them. It carries the block to the next device and zeros to the rest:
the permute's bytes at cp = 2, (c-1) times them at larger c.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from jaxscale.model.blockwise import block_attend, merge
from jaxscale.model.blockwise import empty as _empty
from jaxscale.parallel.cp.split import AXIS, device_positions, n_chunks


def ring_perm(c: int) -> list[tuple[int, int]]:
    """The forward ring: device j sends to j+1, so after h hops device i holds i-h's block."""
    return [(j, (j + 1) % c) for j in range(c)]


def back_perm(c: int) -> list[tuple[int, int]]:
    """The backward ring runs the other way: device j sends to j-1, so after h hops device i
    holds i+h's block. At c = 2 both directions are one permutation, and the backward's one
    K/V hop is the forward's (the same send of the same blocks): the compiler sends it once."""
    return [(j, (j - 1) % c) for j in range(c)]


def hop(x, axis, perm: list[tuple[int, int]], c: int, grouped: bool = False):
    """One hop of the ring: every device's `x` to its target in `perm` (a rotation of the c
    devices). A collective-permute; with `grouped`, an all-to-all over the context group
    (module docstring): slot k of a [c, ...] buffer goes to device k, this device's block in
    its target's slot and zeros in the others, and the block from this device's source is
    the source's slot of what arrives."""
    if not grouped:
        return jax.lax.ppermute(x, axis, perm)
    i = jax.lax.axis_index(axis)
    target = jnp.asarray([t for _, t in sorted(perm)])[i]
    source = jnp.asarray([s for s, _ in sorted(perm, key=lambda p: p[1])])[i]
    slots = jnp.arange(c).reshape(c, *(1,) * x.ndim)
    buf = jnp.where(slots == target, x[None], jnp.zeros((), x.dtype))
    got = jax.lax.all_to_all(buf, axis, split_axis=0, concat_axis=0, tiled=True)
    return jax.lax.dynamic_index_in_dim(got, source, keepdims=False)


def ring_attend(
    q_BTHK, k_BTGK, v_BTGK, q_pos_T, k_pos_T, *, c: int, split: str, axis=AXIS, grouped=False
):
    """Ring attention (module docstring) with its own ring backward. `k_pos_T` is this
    device's own positions, as `q_pos_T`; an arriving block's positions are computed from its
    source, not sent. `grouped`: every hop an all-to-all over the context group (`hop`), for
    a ring inside conditionals that other devices of the mesh do not take."""
    del k_pos_T
    return _ring(q_BTHK, k_BTGK, v_BTGK, q_pos_T, c, split, axis, grouped)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _ring(q, k, v, q_pos, c, split, axis, grouped):
    return _ring_forward(q, k, v, q_pos, c, split, axis, grouped)[0].astype(q.dtype)


def _ring_fwd(q, k, v, q_pos, c, split, axis, grouped):
    out, lse, _ = _ring_forward(q, k, v, q_pos, c, split, axis, grouped)
    return out.astype(q.dtype), (q, k, v, q_pos, out, lse)


def _ring_bwd(c, split, axis, grouped, res, dout):
    return (*_ring_backward(*res, dout, c, split, axis, grouped), None)


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attend_counted(q_BTHK, k_BTGK, v_BTGK, q_pos_T, *, c: int, split: str, axis=AXIS):
    """(ring attention [B, T/c, H, K], the chunk pairs this device computed): the forward as
    the pieces run it, with the count the balance table measures."""
    out, _, done = _ring_forward(q_BTHK, k_BTGK, v_BTGK, q_pos_T, c, split, axis)
    return out.astype(q_BTHK.dtype), done


def _masked(k_pos_S, q_pos_T):
    """A chunk pair whose first key comes after its last query: every score masked."""
    return k_pos_S[0] > q_pos_T[-1]


def _ring_forward(q_BTHK, k_BTGK, v_BTGK, q_pos_T, c: int, split: str, axis, grouped=False):
    """(out [B, T/c, H, K] f32, lse [B, T/c, H], chunk pairs computed): this device's own
    block, then c-1 hops as one `lax.scan` (one body to compile; the census counts its trips).
    A fully masked chunk pair is skipped by a conditional (its FLOPs never run)."""
    n = n_chunks(split)
    T = q_pos_T.shape[0] * c
    i = jax.lax.axis_index(axis)
    qs, q_pos = jnp.split(q_BTHK, n, axis=1), jnp.split(q_pos_T, n)

    def visit(acc, done, k_BSGK, v_BSGK, src):
        """Every chunk pair of the queries and the block from device `src`."""
        k_pos = jnp.split(device_positions(src, c, T, split), n)
        ks, vs = jnp.split(k_BSGK, n, axis=1), jnp.split(v_BSGK, n, axis=1)
        out = []
        for a in range(n):
            acc_a = acc[a]
            for b in range(n):
                acc_a, done = jax.lax.cond(
                    _masked(k_pos[b], q_pos[a]),
                    lambda acc_, done_, *_: (acc_, done_),
                    lambda acc_, done_, *xs: (merge(acc_, block_attend(*xs)), done_ + 1),
                    acc_a,
                    done,
                    qs[a],
                    ks[b],
                    vs[b],
                    q_pos[a],
                    k_pos[b],
                )
            out.append(acc_a)
        return out, done

    def step(carry, h):
        acc, done, k_BSGK, v_BSGK = carry
        # one hop of K and one of V (collective-permutes): every device's block to the next
        k_BSGK = hop(k_BSGK, axis, ring_perm(c), c, grouped)
        v_BSGK = hop(v_BSGK, axis, ring_perm(c), c, grouped)
        acc, done = visit(acc, done, k_BSGK, v_BSGK, (i - h) % c)
        return (acc, done, k_BSGK, v_BSGK), None

    done0 = jax.lax.pcast(jnp.zeros((), jnp.int32), axis, to="varying")
    acc, done = visit([_empty(q) for q in qs], done0, k_BTGK, v_BTGK, i)
    (acc, done, _, _), _ = jax.lax.scan(step, (acc, done, k_BTGK, v_BTGK), jnp.arange(1, c))
    out = jnp.concatenate([o for o, _ in acc], axis=1)
    return out, jnp.concatenate([lse for _, lse in acc], axis=1), done


def pair_grads(q_BTHK, k_BSGK, v_BSGK, q_pos_T, k_pos_S, dout_BTHK, lse_BTH, d_BTH):
    """(dq, dk, dv) of one chunk pair, from the pair's inputs and the merged output's
    log-sum-exp and D = rowsum(dout * out): the probabilities are recomputed exactly (the
    flash-attention backward), so nothing of size [T, S] was kept from the forward."""
    B, T, H, K = q_BTHK.shape
    G = k_BSGK.shape[2]
    f32 = jnp.float32
    q_BTGRK = q_BTHK.reshape(B, T, G, H // G, K).astype(f32)
    do_BTGRK = dout_BTHK.reshape(B, T, G, H // G, K)
    k_BSGK, v_BSGK = k_BSGK.astype(f32), v_BSGK.astype(f32)
    scores_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BSGK) * K**-0.5
    lse_BGRT = jnp.transpose(lse_BTH.reshape(B, T, G, H // G), (0, 2, 3, 1))
    d_BGRT = jnp.transpose(d_BTH.reshape(B, T, G, H // G), (0, 2, 3, 1))
    causal_TS = q_pos_T[:, None] >= k_pos_S[None, :]
    p_BGRTS = jnp.where(causal_TS, jnp.exp(scores_BGRTS - lse_BGRT[..., None]), 0.0)
    dv_BSGK = jnp.einsum("bgrts,btgrk->bsgk", p_BGRTS, do_BTGRK)
    dp_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", do_BTGRK, v_BSGK)
    ds_BGRTS = p_BGRTS * (dp_BGRTS - d_BGRT[..., None]) * K**-0.5
    dq_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", ds_BGRTS, k_BSGK)
    dk_BSGK = jnp.einsum("bgrts,btgrk->bsgk", ds_BGRTS, q_BTGRK)
    return dq_BTGRK.reshape(B, T, H, K), dk_BSGK, dv_BSGK


def _ring_backward(
    q_BTHK, k_BTGK, v_BTGK, q_pos_T, out_BTHK, lse_BTH, dout_BTHK, c, split, axis, grouped=False
):
    """The ring backward: the K/V blocks travel the ring again and their gradients dK/dV
    travel with them, each device adding its queries' share; one more hop takes every dK/dV
    home. Collectives: c-1 permutes of (K, V, dK, dV) and one of (dK, dV)."""
    n = n_chunks(split)
    T = q_pos_T.shape[0] * c
    i = jax.lax.axis_index(axis)
    f32 = jnp.float32
    dout_BTHK = dout_BTHK.astype(f32)
    d_BTH = jnp.sum(dout_BTHK * out_BTHK, axis=-1)
    qs, q_pos, dos = jnp.split(q_BTHK, n, 1), jnp.split(q_pos_T, n), jnp.split(dout_BTHK, n, 1)
    lses, ds = jnp.split(lse_BTH, n, 1), jnp.split(d_BTH, n, 1)

    def visit(dq, k_BSGK, v_BSGK, dk_BSGK, dv_BSGK, src):
        k_pos = jnp.split(device_positions(src, c, T, split), n)
        ks, vs = jnp.split(k_BSGK, n, 1), jnp.split(v_BSGK, n, 1)
        dks, dvs = jnp.split(dk_BSGK, n, 1), jnp.split(dv_BSGK, n, 1)
        dq = list(dq)
        for a in range(n):
            for b in range(n):

                def add(grads, *xs):
                    return tuple(g + d for g, d in zip(grads, pair_grads(*xs), strict=True))

                dq[a], dks[b], dvs[b] = jax.lax.cond(
                    _masked(k_pos[b], q_pos[a]),
                    lambda grads, *_: grads,
                    add,
                    (dq[a], dks[b], dvs[b]),
                    qs[a],
                    ks[b],
                    vs[b],
                    q_pos[a],
                    k_pos[b],
                    dos[a],
                    lses[a],
                    ds[a],
                )
        return dq, jnp.concatenate(dks, 1), jnp.concatenate(dvs, 1)

    def step(carry, h):
        dq, blocks = carry
        # one hop each of K, V, dK and dV (collective-permutes) to the previous device
        blocks = tuple(hop(x, axis, back_perm(c), c, grouped) for x in blocks)
        dq, dk, dv = visit(dq, *blocks, (i + h) % c)
        return (dq, (blocks[0], blocks[1], dk, dv)), None

    zero_dk = (k_BTGK * 0).astype(f32)
    dq0 = [(q * 0).astype(f32) for q in qs]
    dq, dk, dv = visit(dq0, k_BTGK, v_BTGK, zero_dk, zero_dk, i)
    (dq, (_, _, dk, dv)), _ = jax.lax.scan(step, (dq, (k_BTGK, v_BTGK, dk, dv)), jnp.arange(1, c))
    # the last hop: every block's dK and dV back to the device that owns the block
    dk, dv = (hop(x, axis, back_perm(c), c, grouped) for x in (dk, dv))
    dq = jnp.concatenate(dq, axis=1)
    return dq.astype(q_BTHK.dtype), dk.astype(k_BTGK.dtype), dv.astype(v_BTGK.dtype)


def executed_pairs(c: int, split: str) -> list[int]:
    """Chunk pairs (of s x s queries x keys) each device's ring computes: the skip rule of
    `ring_attend` applied to every device's positions, for the balance column."""
    n = n_chunks(split)
    T = 2 * c * n  # any multiple of the chunk count: the rule compares chunk bounds only
    out = []
    for i in range(c):
        q = device_positions(i, c, T, split).reshape(n, -1)
        count = 0
        for src in range(c):
            k = device_positions(src, c, T, split).reshape(n, -1)
            count += sum(not _masked(k[b], q[a]) for a in range(n) for b in range(n))
        out.append(count)
    return out
