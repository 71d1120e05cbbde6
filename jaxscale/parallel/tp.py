"""The tensor axis by hand: Megatron tensor parallelism as substitute model pieces, with every
collective explicit and named (jaxscale/model/pieces.py runs the skeleton).

Everything here runs on LOCAL shards inside `jax.shard_map(..., check_vma=True)`, laid out as
`Sharder(mesh).spec(logical)` puts them: with t devices on the tensor axis, one layer holds
wq_DHK [D, H/t, K], wk_DGK/wv_DGK [D, G/t, K], wo_HKD [H/t, K, D], w_up_DF/w_gate_DF [D, F/t],
w_down_FD [F/t, D]; norms [D] are replicated; the embedding [V/t, D] (tp_vocab.py).
Device i owns heads [i*H/t, (i+1)*H/t), which keeps whole GQA groups together (H/t = G/t * R).

Three modes, forward collectives per layer (B_l = local batch rows):

  megatron       x [B_l, T, D] replicated over the axis. Column-parallel Q/K/V and up/gate, local
                 attention heads, row-parallel wo and w_down: 2 all-reduces of B_l*T*D values
                 (Megatron g). The backward's all-reduces of dx (Megatron f) come from autodiff:
                 `pcast(to="varying")` is the identity forward and its transpose is a psum.
  sequence       Megatron sequence parallelism: x [B_l, T/t, D] split along T; norms on the local
                 slice; all-gather along T before the column matmuls, reduce-scatter along T after
                 the row matmuls: 2 all-gathers + 2 reduce-scatters, the same bytes on a ring as 2
                 all-reduces, but activations and norm work are 1/t per device between blocks.
  gather_output  seed 004's ColumnParallelLinear(gather_output=True) composed correctly (defect 18,
                 docs/seed-notes.md "Seed 004's layer feeds a gathered column output..."): the fused
                 Q/K/V output and the MLP activation are all-gathered, and the row-parallel layers
                 (Megatron's input_is_parallel=False) keep their own slice before the psum. 2
                 all-gathers + 2 all-reduces, as seed 004's docstring counts; the gathers add
                 B_l*T*(H+2G)*K + B_l*T*F values that megatron never sends, and every device
                 computes the attention of all H heads (t x the attention FLOPs).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from jaxscale.config import ModelConfig
from jaxscale.model.pieces import Pieces, attend
from jaxscale.parallel.common import F32, Composition, StepShape
from jaxscale.parallel.tp_vocab import vocab_parallel_cross_entropy, vocab_parallel_embed

MODES = ("megatron", "sequence", "gather_output")


def check_tp_layout(cfg: ModelConfig, tp: int, *, mode: str = "megatron", seq_len=None) -> None:
    """Raise ValueError naming what does not divide by the tensor-parallel size `tp`."""
    if mode not in MODES:
        raise ValueError(f"unknown tensor-parallel mode {mode!r}; choose one of {MODES}")
    if tp < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {tp}")
    sizes = (
        ("heads (n_heads)", cfg.n_heads),
        ("kv_heads (n_kv_heads)", cfg.n_kv_heads),
        ("mlp (d_ff)", cfg.d_ff),
        ("vocab", cfg.vocab),
    )
    for name, size in sizes:
        if size % tp:
            raise ValueError(f"{name}={size} is not divisible by the tensor-parallel size {tp}")
    if mode == "sequence" and seq_len is not None and seq_len % tp:
        raise ValueError(
            f"sequence length {seq_len} is not divisible by the tensor-parallel size {tp} "
            "(sequence parallelism splits T)"
        )


def _f(x, axis: str):
    """Megatron f: identity forward, all-reduce of the gradient backward (transpose of pcast).
    One explicit f per block input, so Q, K and V (or up and gate) share one backward psum."""
    return jax.lax.pcast(x, axis, to="varying")


def _own_slice(x, axis: str, dim: int):
    """This device's 1/t of a gathered dimension (RowParallelLinear(input_is_parallel=False))."""
    n = x.shape[dim] // jax.lax.axis_size(axis)
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(axis) * n, n, axis=dim)


def _gathered_attend(q_BTHK, k_BTGK, v_BTGK, q_positions_T, k_positions_T, *, axis):
    """gather_output: every device attends over ALL heads, then keeps its own heads' output."""
    B, T, H_t, K = q_BTHK.shape
    G_t = k_BTGK.shape[2]
    qkv_BTNK = jnp.concatenate([q_BTHK, k_BTGK, v_BTGK], axis=2)
    # one all-gather of the fused QKV output over the axis: [B, T, t, H/t + 2G/t, K]
    qkv_BTtNK = jax.lax.all_gather(qkv_BTNK, axis, axis=2)
    q_BTHK = qkv_BTtNK[:, :, :, :H_t].reshape(B, T, -1, K)  # device-major = global head order
    k_BTGK = qkv_BTtNK[:, :, :, H_t : H_t + G_t].reshape(B, T, -1, K)
    v_BTGK = qkv_BTtNK[:, :, :, H_t + G_t :].reshape(B, T, -1, K)
    return _own_slice(attend(q_BTHK, k_BTGK, v_BTGK, q_positions_T, k_positions_T), axis, 2)


def _gathered_act(act_BTF, *, axis):
    """gather_output: one all-gather of the MLP activation over F, then the row layer keeps its
    own F/t slice (the seed's composition: correct, and t x the bytes megatron sends)."""
    return _own_slice(jax.lax.all_gather(act_BTF, axis, axis=2, tiled=True), axis, 2)


def pieces(pc: Pieces, comp: Composition) -> Pieces:
    """The model pieces on local shards of the tensor axis, in the composition's tensor mode
    (none: `pc` as it is)."""
    return pc if comp.mode is None else tensor_pieces(pc, comp.cfg, comp.mode)


def tensor_pieces(
    pc: Pieces, cfg: ModelConfig, mode: str = "megatron", axis: str = "tensor"
) -> Pieces:
    """The model pieces on local shards of `axis` in `mode` (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"unknown tensor-parallel mode {mode!r}; choose one of {MODES}")
    sequence = mode == "sequence"
    if sequence:
        # all-gather along T (sequence parallelism's g) and reduce-scatter along T (its g-bar)
        enter = partial(jax.lax.all_gather, axis_name=axis, axis=1, tiled=True)
        leave = partial(jax.lax.psum_scatter, axis_name=axis, scatter_dimension=1, tiled=True)
    else:
        enter = partial(_f, axis=axis)  # Megatron f (backward all-reduce)
        leave = partial(jax.lax.psum, axis_name=axis)  # one all-reduce (Megatron g)
    cdt = jnp.dtype(cfg.compute_dtype)

    def embed(top, tokens_BT, cfg, pc):
        return vocab_parallel_embed(
            top["embed_VD"], tokens_BT, axis, dtype=cdt, scatter_seq=sequence
        )

    # an MoE layer's routing statistics are computed alike on every device of the group (from
    # the entered activation, typed varying): one all-reduce makes them one value; F of every
    # expert is split like the dense MLP's, its partial output summed by `leave`
    pc = pc.replace(
        enter=enter,
        leave=leave,
        embed=embed,
        loss=partial(vocab_parallel_cross_entropy, axis=axis),
        stat=partial(jax.lax.pmean, axis_name=axis),
    )
    if mode == "gather_output":
        pc = pc.replace(
            attend=partial(_gathered_attend, axis=axis), mlp_act=partial(_gathered_act, axis=axis)
        )
    return pc


def predict_comm(shape: StepShape, comp: Composition) -> dict:
    """{op: bytes per device} over the tensor axis for one training step.

    ACT = B_local*T*D*4 bytes, ROW = B_local*T*4. megatron: AR of ACT x (4L + 2) [2 per layer
    forward (g), 2 backward (f), embedding, unembedding input] + 3 ROW (cross-entropy); norm
    scales' gradients need nothing (the block's input gradient is summed by f before the norm's
    backward). sequence: each ACT all-reduce becomes AG + RS of ACT; norms run on sequence
    shards, so their gradients are all-reduced over tensor (4Nn) -- in the data axes' op when
    ZeRO-3 reduces them (`norm_grads_elsewhere`). gather_output: megatron's, plus per layer AG of
    the fused QKV and of the MLP activation forward and RS of both backward."""
    t, mode = comp.t, comp.mode
    if t == 1:
        return {}
    norm_grads_elsewhere = comp.stage == 3 and comp.n > 1
    act = F32 * shape.tokens_local * shape.d_model
    n_act = 4 * shape.n_layers + 2
    out = {"all-reduce": 3 * F32 * shape.tokens_local}
    if mode == "sequence":
        out["all-gather"] = out["reduce-scatter"] = act * n_act
        if not norm_grads_elsewhere:
            out["all-reduce"] += F32 * shape.norm_params
    else:
        out["all-reduce"] += act * n_act
    if mode == "gather_output":
        width = shape.qkv_width + shape.d_ff
        out["all-gather"] = out["reduce-scatter"] = (
            F32 * shape.tokens_local * width * shape.n_layers
        )
    return out
