"""Shared pieces of the manual strategies (jax.shard_map with explicit collectives): specs of the
layouts, one leaf's gather / reduce-scatter / slice along its sharded dimension, local gradient
accumulation, the global gradient norm across shards, and the step's shapes the predictions use.

Sharded shapes in docstrings follow the scaling-book notation: [B_data, T, D] is a batch split over
the data axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale.config import ModelConfig
from jaxscale.model import state as model_state
from jaxscale.sharding import DATA_AXES, Sharder

F32 = 4  # bytes


def named_shardings(mesh, specs):
    """NamedShardings on `mesh` for a tree of PartitionSpecs."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)


def data_axes(mesh) -> tuple[str, ...]:
    return tuple(a for a in DATA_AXES if a in mesh.shape)


def param_specs(cfg: ModelConfig, sharder: Sharder):
    """PartitionSpec tree of the parameters under `sharder`'s rules (checks divisibility)."""
    return jax.tree.map(lambda s: s.spec, model_state.param_shardings(cfg, sharder))


# --- one leaf's sharded dimension ------------------------------------------------------------


def sharded_dim(spec: P, axes: tuple[str, ...]) -> int | None:
    """The dimension of `spec` split over `axes` (the ZeRO group), or None if none is."""
    for dim, entry in enumerate(spec):
        names = entry if isinstance(entry, tuple) else (entry,)
        if entry is not None and set(names) & set(axes):
            return dim
    return None


def gather_leaf(x, spec: P, axes, to: str = "varying"):
    """All-gather the shards of one leaf over `axes` (tiled: the full dim comes back).

    `to="invarying"` types the result as replicated over `axes` (true after an optimizer
    update, so out_specs may say P()); the default keeps it varying, whose transpose under
    autodiff is the reduce-scatter ZeRO-3 relies on."""
    dim = sharded_dim(spec, axes)
    return x if dim is None else jax.lax.all_gather(x, axes, axis=dim, tiled=True, to=to)


def scatter_leaf(x, spec: P, axes):
    """Reduce-scatter a full, unreduced leaf: sum over `axes`, keep this device's slice."""
    dim = sharded_dim(spec, axes)
    if dim is None:
        return jax.lax.psum(x, axes)  # an unsharded leaf (norm scales): plain all-reduce
    return jax.lax.psum_scatter(x, axes, scatter_dimension=dim, tiled=True)


def slice_leaf(x, spec: P, axes):
    """This device's slice of a full (replicated) leaf, along the dim split over `axes`."""
    dim = sharded_dim(spec, axes)
    if dim is None:
        return x
    n = 1
    for a in axes:
        n *= jax.lax.axis_size(a)
    size = x.shape[dim] // n
    return jax.lax.dynamic_slice_in_dim(x, linear_index(axes) * size, size, axis=dim)


def linear_index(axes):
    """Row-major index of this device in the group `axes` (matches all_gather's tile order)."""
    idx = 0
    for a in axes:
        idx = idx * jax.lax.axis_size(a) + jax.lax.axis_index(a)
    return idx


# --- gradients ---------------------------------------------------------------------------------


def accumulate(loss_fn, params, batch_BT1, grad_accum: int, axes, unreduced: bool, reduced_keys=()):
    """Mean loss and gradient over this shard's rows [B_data, T+1], summed over `grad_accum`
    microbatches (rows m, m+M, ... form microbatch m) and divided once; no collective of its own.

    `unreduced`: differentiate with respect to a *varying* copy of the (replicated) params, so
    autodiff inserts no all-reduce and each shard keeps its own gradient until the caller's one
    reduction per step (DP's explicit form, parallel/dp.py). Sharded params (ZeRO-3) are varying
    already; their gradients come back reduce-scattered by the transpose of their all-gathers.
    `reduced_keys`: top-level params left invariant because the model casts them itself, so
    their gradients come back all-reduced (gradient buckets, parallel/buckets.py)."""
    if unreduced:
        params = {
            k: v
            if k in reduced_keys
            else jax.tree.map(lambda p: jax.lax.pcast(p, axes, to="varying"), v)
            for k, v in params.items()
        }
    if grad_accum == 1:
        return jax.value_and_grad(loss_fn)(params, batch_BT1)
    B = batch_BT1.shape[0]
    micro_MBT1 = batch_BT1.reshape(B // grad_accum, grad_accum, -1).swapaxes(0, 1)

    def body(carry, micro_BT1):
        return jax.tree.map(jnp.add, carry, jax.value_and_grad(loss_fn)(params, micro_BT1)), None

    # the carry must be typed varying like the per-shard values added to it (check_vma)
    loss0 = jax.lax.pcast(jnp.zeros((), jnp.float32), axes, to="varying")
    (loss, grads), _ = jax.lax.scan(body, (loss0, jax.tree.map(jnp.zeros_like, params)), micro_MBT1)
    return loss / grad_accum, jax.tree.map(lambda g: g / grad_accum, grads)


def global_sq_norm(grads, specs):
    """Sum of squares of the whole (unsharded) gradient: local sums, then one psum per leaf over
    the axes that leaf is split over (replicated leaves are counted once)."""
    total = jnp.zeros((), jnp.float32)
    for g, spec in zip(
        jax.tree.leaves(grads), jax.tree.leaves(specs, is_leaf=_is_spec), strict=True
    ):
        sq = jnp.sum(jnp.square(g.astype(jnp.float32)))
        axes = spec_axes(spec)
        total = total + (jax.lax.psum(sq, axes) if axes else sq)
    return total


def spec_axes(spec: P) -> tuple[str, ...]:
    out = []
    for entry in spec:
        if entry is not None:
            out.extend(entry if isinstance(entry, tuple) else (entry,))
    return tuple(out)


def _is_spec(x) -> bool:
    return isinstance(x, P)


# --- the step's shapes, for the predictions each axis module makes ----------------------------


@dataclass(frozen=True)
class StepShape:
    """What the collective predictions need (pure numbers). The byte convention is the census's
    (jaxscale/analysis/hlo.py): all-reduce counts its operand, all-gather its output (the gathered
    buffer), reduce-scatter its input. Counts are not predicted: XLA combines independent
    collectives into tuple-shaped ones, which changes the count but not the bytes."""

    matrix_params: float  # M: this device's share of the matrices (tensor and expert splits)
    norm_params: int  # Nn: norm scales (replicated by every strategy)
    matrix_leaves: int
    n_layers: int
    rows_local: int  # B_local: one data shard's rows
    seq_len: int  # T
    d_model: int
    qkv_width: int  # (H + 2G) * K: the fused QKV output (gather_output mode)
    d_ff: int
    shared_matrix_params: float = 0.0  # M's non-expert part (replicated over the expert axis)
    act_bytes: int = F32  # bytes of one activation value (the compute dtype's)

    @property
    def tokens_local(self) -> int:  # B_local * T
        return self.rows_local * self.seq_len


@dataclass(frozen=True, eq=False)
class Composition:
    """A manual strategy resolved on its mesh: what every axis module reads. Each axis module --
    zero.py (the data axes), tp.py, ep.py, cp/, pp/ -- has the same interface:

        pieces(pc, comp) -> Pieces            what it substitutes in the model (or pc as it is)
        predict_comm(shape, comp) -> dict     {op: bytes} its collectives cost per step

    and the composer (compose.py) chains the first and sums the second."""

    cfg: ModelConfig
    ways: dict  # mesh axis -> size, for data, fsdp, tensor, pipe, expert, context
    stage: int = 0  # ZeRO stage over the data axes (0: DP)
    mode: str | None = None  # tensor mode: megatron | sequence | gather_output
    data_axes: tuple = ()  # the ZeRO group's mesh axes
    zero_specs: dict | None = None  # the ZeRO layout's PartitionSpecs (ZERO_RULES)
    plan: object = None  # the pipe axis's schedule (pp.Plan)
    cp_form: str | None = None  # context form: ring | gather | ulysses
    cp_split: str = "zigzag"  # how the sequence's chunks are dealt: zigzag | contiguous
    grad_buckets: int = 0  # DP's layer gradients all-reduced in N buckets (buckets.py)

    @property
    def n(self) -> int:  # the ZeRO group: data x fsdp
        return self.ways["data"] * self.ways["fsdp"]

    @property
    def t(self) -> int:
        return self.ways["tensor"]

    @property
    def ep(self) -> int:
        return self.ways["expert"]

    @property
    def cp(self) -> int:
        return self.ways.get("context", 1)


def add_comm(*parts: dict) -> dict:
    """Sum {op: bytes} predictions of several axes."""
    out: dict[str, float] = {}
    for part in parts:
        for op, b in part.items():
            out[op] = out.get(op, 0.0) + b
    return out


def norm_comm(shape: StepShape, any_split: bool) -> dict:
    """The gradient norm: one f32 all-reduce per leaf split over some axis."""
    return {"all-reduce": F32 * shape.matrix_leaves} if any_split else {}
