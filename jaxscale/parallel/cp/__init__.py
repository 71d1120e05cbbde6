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
           autodiff through the loop would keep every pair's probabilities (ring.py;
           measured in docs/context.md).
           Inside a pipeline schedule each send is an all-to-all over the context group
           instead (XLA:CPU pairs collective-permutes across the whole mesh, and a schedule's
           stages run different ones at once: ring.py).
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
from jaxscale.parallel.cp.ring import ring_attend, ring_attend_counted
from jaxscale.parallel.cp.split import (
    AXIS,
    SPLITS,
    all_positions,
    chunk_ids,
    device_positions,
    n_chunks,
)

FORMS = ("ring", "gather", "ulysses")
__all__ = [
    "ATTEND",
    "AXIS",
    "FORMS",
    "SPLITS",
    "all_positions",
    "check",
    "chunk_ids",
    "context_pieces",
    "device_positions",
    "gather_attend",
    "local_loss",
    "n_chunks",
    "pieces",
    "predict_comm",
    "ring_attend",
    "ring_attend_counted",
    "ulysses_attend",
    "window",
]


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


ATTEND = {"ring": ring_attend, "gather": gather_attend, "ulysses": ulysses_attend}  # form -> core


def pieces(pc: Pieces, comp: Composition) -> Pieces:
    """This device's chunks of the window and the form's attention (no context axis: `pc`)."""
    if comp.cp == 1:
        return pc
    # inside a pipeline schedule the ring runs in per-tick branches that only its pipe stage
    # takes: its hops must be collectives of the context group alone (ring.py, `hop`)
    grouped = comp.plan is not None
    return context_pieces(pc, comp.cp, comp.cp_form, comp.cp_split, grouped=grouped)


def context_pieces(
    pc: Pieces, c: int, form: str, split: str = "zigzag", axis=AXIS, grouped: bool = False
) -> Pieces:
    """`pc` with this device's window and the form's attention over `axis`; `grouped`: the
    ring's hops as all-to-alls over the context group (inside a pipeline schedule)."""
    fn = partial(ATTEND[form], grouped=True) if grouped and form == "ring" else ATTEND[form]
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
    again = 0 if cfg.remat == "none" else 1  # every policy recomputes the attention once
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
