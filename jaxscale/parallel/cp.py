"""The context axis by hand: context parallelism, the sequence split over `context`, in three
forms, each as substitute model pieces with every collective written out and named.

With c devices on `context` the batch's rows stay whole on every context device and each one
takes its own chunks of the sequence (`window`): the sequence is cut into 2c chunks of s =
T/(2c) tokens and device i keeps chunks i and 2c-1-i (the zigzag split, balanced for causal
attention: every device has one early and one late chunk), or into c chunks of which device i
keeps chunk i (`contiguous`, the unbalanced baseline: the last device's queries see every key).
Each token keeps its true position, so RoPE and the causal mask (`attend` takes query and key
positions) see the sequence as it is. Everything outside attention is per token and needs no
collective; the loss is the mean over the axis (one all-reduce of the scalar), so autodiff sums
every parameter's gradient over it (one all-reduce of the gradients' bytes).

Attention, per layer, on local q [B, T/c, H, K], k and v [B, T/c, G, K]:

  ring     (`cp_ring`) each device keeps its queries; the K/V blocks travel c-1 hops around the
           ring by collective-permute (2(c-1) sends of [B, T/c, G, K] forward). Each arriving
           block meets the queries chunk by chunk: a fully masked chunk pair (every key after
           every query) is skipped by a conditional, not computed and discarded; the others
           merge into the running output by log-sum-exp rescaling (the online softmax). The
           backward is a ring of its own (a custom VJP, as picotron's): the forward keeps only
           q, k, v, the output and its log-sum-exp; the K/V blocks travel again and each
           pair's probabilities are recomputed from the log-sum-exp (the flash-attention
           backward), while dK/dV travel with their blocks and take one more hop home:
           2(c-1) sends of K/V and 2c of dK/dV (f32). No [T/c, T] score matrix is ever held;
           autodiff through the loop would keep every pair's probabilities (measured: 7x
           more temporaries at T = 8k on cp=8, docs/context.md).
  gather   (`cp_gather`, Llama 3's form) one all-gather of K and of V over the axis, the local
           queries against every key, masked by position; the backward's transposes are two
           reduce-scatters of dK and dV.
  ulysses  (`cp_ulysses`, DeepSpeed-Ulysses) all-to-all from sequence-sharded to
           head-sharded for q, k and v ([B, T/c, H, K] -> [B, T, H/c, K]), attention over the
           whole sequence on H/c heads, one all-to-all back: 4 forward, 4 backward. Heads and
           kv heads (per tensor shard) must divide by c.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from jaxscale.config import ModelConfig
from jaxscale.model.pieces import Pieces, attend
from jaxscale.parallel.common import F32, Composition, StepShape

AXIS = "context"
FORMS = ("ring", "gather", "ulysses")
SPLITS = ("zigzag", "contiguous")
NEG = jnp.finfo(jnp.float32).min  # the log-sum-exp of an empty set, kept finite


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


def check(cfg: ModelConfig, cp: int, form: str, split: str, seq_len: int, tp: int = 1) -> None:
    """Raise ValueError naming what does not divide, or a form the axis does not know."""
    if form not in FORMS:
        raise ValueError(f"unknown context-parallel form {form!r}; choose one of {FORMS}")
    if split not in SPLITS:
        raise ValueError(f"unknown context split {split!r}; choose one of {SPLITS}")
    chunks = cp * n_chunks(split)
    if seq_len % chunks:
        raise ValueError(
            f"sequence length {seq_len} is not divisible into the {chunks} chunks of the "
            f"{split} split over cp={cp}"
        )
    if form == "ulysses":
        heads, kv = cfg.n_heads // tp, cfg.n_kv_heads // tp
        for name, size in (("heads", heads), ("kv_heads", kv)):
            if size % cp:
                per = f" per tensor shard (tp={tp})" if tp > 1 else ""
                raise ValueError(
                    f"Ulysses splits the heads over cp={cp}, but {name}={size}{per} is not "
                    f"divisible by {cp} (heads {heads}, kv_heads {kv})"
                )


# --- the window: this device's tokens --------------------------------------------------------


def window(batch_BT1, *, c: int, split: str, axis: str = AXIS):
    """(inputs [B, T/c], targets [B, T/c], positions [T/c]) of this device's chunks of a
    [B, T+1] token window (no collective: the rows are whole on every context device)."""
    T = batch_BT1.shape[1] - 1
    s = T // (c * n_chunks(split))
    ids = chunk_ids(jax.lax.axis_index(axis), c, split)
    inputs = [jax.lax.dynamic_slice_in_dim(batch_BT1, cid * s, s, axis=1) for cid in ids]
    targets = [jax.lax.dynamic_slice_in_dim(batch_BT1, cid * s + 1, s, axis=1) for cid in ids]
    positions = device_positions(jax.lax.axis_index(axis), c, T, split)
    return jnp.concatenate(inputs, 1), jnp.concatenate(targets, 1), positions


def local_loss(loss_fn, c: int, axis: str = AXIS):
    """The loss as the mean over the context shards (one all-reduce of the scalar); every
    device holds the same number of tokens, so it is the mean over the whole sequence."""
    if c == 1:
        return loss_fn
    return lambda params, rows: jax.lax.psum(loss_fn(params, rows) / c, axis)


# --- ring attention --------------------------------------------------------------------------


def block_attend(q_BTHK, k_BSGK, v_BSGK, q_pos_T, k_pos_S):
    """Causal GQA attention of one query block on one key block, un-merged: (out [B, T, H, K]
    f32, normalised within the block; lse [B, T, H], its log-sum-exp of scores)."""
    B, T, H, K = q_BTHK.shape
    G = k_BSGK.shape[2]
    q_BTGRK = q_BTHK.reshape(B, T, G, H // G, K)
    scores_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BSGK).astype(jnp.float32)
    scores_BGRTS = scores_BGRTS * K**-0.5
    causal_TS = q_pos_T[:, None] >= k_pos_S[None, :]
    scores_BGRTS = jnp.where(causal_TS, scores_BGRTS, NEG)
    m_BGRT = jnp.max(scores_BGRTS, axis=-1)
    p_BGRTS = jnp.exp(scores_BGRTS - m_BGRT[..., None])
    l_BGRT = jnp.sum(p_BGRTS, axis=-1)
    probs_BGRTS = (p_BGRTS / l_BGRT[..., None]).astype(q_BTHK.dtype)
    out_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", probs_BGRTS, v_BSGK).astype(jnp.float32)
    lse_BTH = jnp.transpose(m_BGRT + jnp.log(l_BGRT), (0, 3, 1, 2)).reshape(B, T, H)
    return out_BTGRK.reshape(B, T, H, K), lse_BTH


def merge(acc, part):
    """Two partial attentions over disjoint keys as one: the log-sum-exp rescaling."""
    (o1, lse1), (o2, lse2) = acc, part
    lse = jnp.logaddexp(lse1, lse2)
    return o1 * jnp.exp(lse1 - lse)[..., None] + o2 * jnp.exp(lse2 - lse)[..., None], lse


def _empty(q_BTHK):
    """The merge's identity for one query chunk, typed like q (varying over q's axes)."""
    zero = (q_BTHK * 0).astype(jnp.float32)
    return zero, zero[..., 0] + NEG


def ring_perm(c: int) -> list[tuple[int, int]]:
    """The forward ring: device j sends to j+1, so after h hops device i holds i-h's block."""
    return [(j, (j + 1) % c) for j in range(c)]


def back_perm(c: int) -> list[tuple[int, int]]:
    """The backward ring runs the other way: device j sends to j-1, so after h hops device i
    holds i+h's block. At c = 2 both directions are one permutation, and the backward's one
    K/V hop is the forward's (the same send of the same blocks): the compiler sends it once."""
    return [(j, (j - 1) % c) for j in range(c)]


def ring_attend(q_BTHK, k_BTGK, v_BTGK, q_pos_T, k_pos_T, *, c: int, split: str, axis=AXIS):
    """Ring attention (module docstring) with its own ring backward. `k_pos_T` is this
    device's own positions, as `q_pos_T`; an arriving block's positions are computed from its
    source, not sent."""
    del k_pos_T
    return _ring(q_BTHK, k_BTGK, v_BTGK, q_pos_T, c, split, axis)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _ring(q, k, v, q_pos, c, split, axis):
    return _ring_forward(q, k, v, q_pos, c, split, axis)[0].astype(q.dtype)


def _ring_fwd(q, k, v, q_pos, c, split, axis):
    out, lse, _ = _ring_forward(q, k, v, q_pos, c, split, axis)
    return out.astype(q.dtype), (q, k, v, q_pos, out, lse)


def _ring_bwd(c, split, axis, res, dout):
    return (*_ring_backward(*res, dout, c, split, axis), None)


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attend_counted(q_BTHK, k_BTGK, v_BTGK, q_pos_T, *, c: int, split: str, axis=AXIS):
    """(ring attention [B, T/c, H, K], the chunk pairs this device computed): the forward as
    the pieces run it, with the count the balance table measures."""
    out, _, done = _ring_forward(q_BTHK, k_BTGK, v_BTGK, q_pos_T, c, split, axis)
    return out.astype(q_BTHK.dtype), done


def _masked(k_pos_S, q_pos_T):
    """A chunk pair whose first key comes after its last query: every score masked."""
    return k_pos_S[0] > q_pos_T[-1]


def _ring_forward(q_BTHK, k_BTGK, v_BTGK, q_pos_T, c: int, split: str, axis):
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

    def hop(carry, h):
        acc, done, k_BSGK, v_BSGK = carry
        # one collective-permute of K and one of V: every device's block to the next device
        k_BSGK = jax.lax.ppermute(k_BSGK, axis, ring_perm(c))
        v_BSGK = jax.lax.ppermute(v_BSGK, axis, ring_perm(c))
        acc, done = visit(acc, done, k_BSGK, v_BSGK, (i - h) % c)
        return (acc, done, k_BSGK, v_BSGK), None

    done0 = jax.lax.pcast(jnp.zeros((), jnp.int32), axis, to="varying")
    acc, done = visit([_empty(q) for q in qs], done0, k_BTGK, v_BTGK, i)
    (acc, done, _, _), _ = jax.lax.scan(hop, (acc, done, k_BTGK, v_BTGK), jnp.arange(1, c))
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


def _ring_backward(q_BTHK, k_BTGK, v_BTGK, q_pos_T, out_BTHK, lse_BTH, dout_BTHK, c, split, axis):
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

    def hop(carry, h):
        dq, blocks = carry
        # one collective-permute each of K, V, dK and dV to the previous device
        blocks = tuple(jax.lax.ppermute(x, axis, back_perm(c)) for x in blocks)
        dq, dk, dv = visit(dq, *blocks, (i + h) % c)
        return (dq, (blocks[0], blocks[1], dk, dv)), None

    zero_dk = (k_BTGK * 0).astype(f32)
    dq0 = [(q * 0).astype(f32) for q in qs]
    dq, dk, dv = visit(dq0, k_BTGK, v_BTGK, zero_dk, zero_dk, i)
    (dq, (_, _, dk, dv)), _ = jax.lax.scan(hop, (dq, (k_BTGK, v_BTGK, dk, dv)), jnp.arange(1, c))
    # the last hop: every block's dK and dV back to the device that owns the block
    dk, dv = (jax.lax.ppermute(x, axis, back_perm(c)) for x in (dk, dv))
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
            count += sum(int(k[b][0] <= q[a][-1]) for a in range(n) for b in range(n))
        out.append(count)
    return out


# --- all-gather and Ulysses ------------------------------------------------------------------


def gather_attend(q_BTHK, k_BTGK, v_BTGK, q_pos_T, k_pos_T, *, c: int, split: str, axis=AXIS):
    """All-gather CP: every device's K and V (one all-gather each, in device order; their
    transposes are the backward's reduce-scatters), the local queries against all of them."""
    del k_pos_T
    k_BSGK = jax.lax.all_gather(k_BTGK, axis, axis=1, tiled=True)
    v_BSGK = jax.lax.all_gather(v_BTGK, axis, axis=1, tiled=True)
    k_pos_S = all_positions(c, q_pos_T.shape[0] * c, split)
    return attend(q_BTHK, k_BSGK, v_BSGK, q_pos_T, k_pos_S)


def ulysses_attend(q_BTHK, k_BTGK, v_BTGK, q_pos_T, k_pos_T, *, c: int, split: str, axis=AXIS):
    """Ulysses: all-to-all q, k, v from [B, T/c, heads] to [B, T, heads/c] (3 all-to-alls),
    attention over the whole sequence on this device's heads, one all-to-all back."""
    del k_pos_T

    def to_heads(x):  # split the heads over the axis, gather the sequence in device order
        return jax.lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)

    pos_T = all_positions(c, q_pos_T.shape[0] * c, split)
    out = attend(to_heads(q_BTHK), to_heads(k_BTGK), to_heads(v_BTGK), pos_T, pos_T)
    return jax.lax.all_to_all(out, axis, split_axis=1, concat_axis=2, tiled=True)


_ATTEND = {"ring": ring_attend, "gather": gather_attend, "ulysses": ulysses_attend}


def pieces(pc: Pieces, comp: Composition) -> Pieces:
    """This device's chunks of the window and the form's attention (no context axis: `pc`)."""
    if comp.cp == 1:
        return pc
    return context_pieces(pc, comp.cp, comp.cp_form, comp.cp_split)


def context_pieces(pc: Pieces, c: int, form: str, split: str = "zigzag", axis=AXIS) -> Pieces:
    fn = _ATTEND[form]
    return pc.replace(
        window=lambda batch: window(batch, c=c, split=split, axis=axis),
        attend=lambda q, k, v, qp, kp: fn(q, k, v, qp, kp, c=c, split=split, axis=axis),
        # an MoE router's balance statistics are means over whole sequences: one all-reduce
        # each over the axis (every device holds the same number of each sequence's tokens)
        seq_mean=partial(jax.lax.pmean, axis_name=axis),
    )


# --- the prediction ----------------------------------------------------------------------------


def kv_block_bytes(shape: StepShape, comp: Composition) -> float:
    """One device's K (or V) of one layer: [B_l, T/c, G/t, K] in the compute dtype."""
    cfg = comp.cfg
    return shape.tokens_local * cfg.n_kv_heads // comp.t * cfg.head_dim * shape.act_bytes


def predict_comm(shape: StepShape, comp: Composition) -> dict:
    """{op: bytes per device} over the context axis for one step (`shape` holds the local
    sequence T/c). Per layer, KV = one K block (kv_block_bytes) in the compute dtype, KV32 the
    same in f32 (the ring backward's dK/dV accumulators), Q = the queries' [B_l, T/c, H/t, K].
    ring: 2(c-1) permutes of KV forward; backward 2(c-1) of KV (none at c = 2, where they are
    the forward's sends: `back_perm`) and 2c of KV32 (dK and dV travel with their blocks and
    take one more hop home); +2(c-1) KV with remat (the forward again). gather: an all-gather
    of K and of V (c x KV each; the census counts the output) and two reduce-scatters
    backward; +2 all-gathers with remat. Ulysses: 4 all-to-alls forward (q, k, v, out) and 4
    backward; +4 with remat. Plus the loss and the gradients' all-reduce over the axis (every
    parameter is replicated over it)."""
    c, cfg = comp.cp, comp.cfg
    if c == 1:
        return {}
    L, kv = shape.n_layers, kv_block_bytes(shape, comp)
    again = 1 if cfg.remat else 0
    out = {"all-reduce": F32 * (shape.matrix_params + shape.norm_params) + F32}
    if comp.cp_form == "ring":
        kv32 = kv * F32 / shape.act_bytes
        back_kv = 0 if c == 2 else 1  # c = 2: the backward's K/V hop is the forward's (back_perm)
        sends = 2 * (c - 1) * kv * (1 + back_kv + again) + 2 * c * kv32
        out["collective-permute"] = L * sends
    elif comp.cp_form == "gather":
        out["all-gather"] = L * 2 * c * kv * (1 + again)
        out["reduce-scatter"] = L * 2 * c * kv
    else:
        q = kv * cfg.n_heads // cfg.n_kv_heads
        out["all-to-all"] = L * (2 * q + 2 * kv) * (2 + again)
    return out
