"""Seed 002 ch6 demonstrations (tp_linear.py, tp_mlp.py) and a per-layer census of one
tensor-parallel block (the model's block with parallel/tp.py's pieces).

Both scripts (ML Systems Infrastructure Tutorial, ch6 "Tensor Parallelism from Scratch") in SPMD
form on a 1-D mesh whose one axis is `tensor`. Unlike the seed, every check compares with a dense
product of the very weights the parallel layers hold: the seed's tp_linear compares with a weight it
rebuilt from the shards themselves, and tp_mlp's reference crashes (defect 2, docs/seed-notes.md
"tp_mlp.py's correctness check crashes"). Full weights are drawn once and then split, so no
`w2 /= tp_size` rescaling is needed or wanted.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.analysis import hlo
from jaxscale.config import ModelConfig
from jaxscale.mesh import build_mesh
from jaxscale.model import pieces
from jaxscale.model.transformer import layer_param_layout
from jaxscale.parallel import tp as tensor_parallel
from jaxscale.parallel.tp import check_tp_layout
from jaxscale.sharding import Sharder

AXIS = "tensor"
SEED_TOLERANCE = 1e-5  # the seed's "Correct: diff < 1e-5"


def tensor_mesh(tp: int):
    """A mesh with one `tensor` axis over the first `tp` devices (the seed's --tp-size)."""
    if not 1 <= tp <= jax.device_count():
        raise ValueError(f"--tp-size {tp} needs 1..{jax.device_count()} devices")
    return build_mesh(f"tp={tp}", devices=jax.devices()[:tp])


def _normal(seed: int, shape, fan_in: int | None = None):
    scale = 1.0 if fan_in is None else fan_in**-0.5
    return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _split_check(name: str, dim: int, tp: int) -> None:
    if dim % tp:
        raise ValueError(f"{name}={dim} is not divisible by the tensor-parallel size {tp}")


@dataclass(frozen=True)
class LinearCheck:
    name: str
    local_weight_shape: tuple[int, ...]
    full_weight_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    max_abs_diff: float  # against x @ W_full on one device

    @property
    def correct(self) -> bool:
        return self.max_abs_diff < SEED_TOLERANCE


def column_parallel(mesh, batch=4, d_in=8, d_out=8, seed=42, input_seed=123) -> LinearCheck:
    """Y = X [W_0 | ... | W_t-1] = [X W_0 | ... | X W_t-1]: no communication at all. The local
    outputs are laid side by side by the out_specs (that concatenation is the check, not a step
    a column-parallel layer needs)."""
    tp = mesh.shape[AXIS]
    _split_check("out_features", d_out, tp)
    w_IO, x_BI = _normal(seed, (d_in, d_out), d_in), _normal(input_seed, (batch, d_in))
    f = jax.shard_map(
        lambda x, w: x @ w,
        mesh=mesh,
        in_specs=(jax.P(), jax.P(None, AXIS)),
        out_specs=jax.P(None, AXIS),
    )
    y_BO = jax.jit(f)(x_BI, w_IO)
    diff = float(jnp.max(jnp.abs(y_BO - x_BI @ w_IO)))
    return LinearCheck("column", (d_in, d_out // tp), (d_in, d_out), tuple(y_BO.shape), diff)


def row_parallel(mesh, batch=4, d_in=8, d_out=8, seed=42, input_seed=123) -> LinearCheck:
    """Y = sum_i X_i W_i: each device holds a slice of the input features and of W's rows; one
    all-reduce (psum) of the [B, out] partial products."""
    tp = mesh.shape[AXIS]
    _split_check("in_features", d_in, tp)
    w_IO, x_BI = _normal(seed, (d_in, d_out), d_in), _normal(input_seed, (batch, d_in))
    f = jax.shard_map(
        lambda x, w: jax.lax.psum(x @ w, AXIS),  # one all-reduce over 'tensor'
        mesh=mesh,
        in_specs=(jax.P(None, AXIS), jax.P(AXIS, None)),
        out_specs=jax.P(),
    )
    y_BO = jax.jit(f)(x_BI, w_IO)
    diff = float(jnp.max(jnp.abs(y_BO - x_BI @ w_IO)))
    return LinearCheck("row", (d_in // tp, d_out), (d_in, d_out), tuple(y_BO.shape), diff)


@dataclass(frozen=True)
class BiasCheck:
    rank0_only: bool  # seed 004's placement (§7 RowParallelLinear) instead of every rank
    max_abs_diff_per_rank: tuple[float, ...]  # each device's output against x @ W + b
    ranks_identical: bool  # bit-identical outputs on every device

    @property
    def correct(self) -> bool:
        return max(self.max_abs_diff_per_rank) < SEED_TOLERANCE


def row_parallel_bias(mesh, rank0_only=False, batch=4, d_in=8, d_out=8, seed=42) -> BiasCheck:
    """RowParallelLinear with a bias: replicated and added after the all-reduce on EVERY device
    (then all devices hold x @ W + b). `rank0_only` reproduces seed 004, which keeps the bias on
    rank 0 alone: the other ranks end without it and the replicas diverge (defect 18,
    docs/seed-notes.md "Seed 004's RowParallelLinear adds its bias on rank 0 only")."""
    tp = mesh.shape[AXIS]
    _split_check("in_features", d_in, tp)
    w_IO, x_BI = _normal(seed, (d_in, d_out), d_in), _normal(seed + 1, (batch, d_in))
    b_O = _normal(seed + 2, (d_out,))

    def local(x, w, b):
        y = jax.lax.psum(x @ w, AXIS)  # one all-reduce over 'tensor'
        if rank0_only:
            b = jnp.where(jax.lax.axis_index(AXIS) == 0, b, 0.0)
        return (y + b)[None]  # stacked per device

    f = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(jax.P(None, AXIS), jax.P(AXIS, None), jax.P()),
        out_specs=jax.P(AXIS),
    )
    y_tBO = jax.jit(f)(x_BI, w_IO, b_O)
    want_BO = x_BI @ w_IO + b_O
    diffs = tuple(float(jnp.max(jnp.abs(y_BO - want_BO))) for y_BO in y_tBO)
    same = bool(np.all(np.asarray(y_tBO) == np.asarray(y_tBO)[:1]))
    return BiasCheck(rank0_only, diffs, same)


@dataclass(frozen=True)
class MLPCheck:
    hidden: int
    intermediate: int
    x_shape: tuple[int, ...]
    max_abs_diff: float  # against gelu(x @ W1) @ W2 on one device, the same weights
    ranks_identical: bool  # every device ends with the same output (after the all-reduce)
    allreduces: int  # in the compiled forward
    allreduce_bytes: float  # bytes per device of each, from the compiled HLO
    forward_ms: float | None  # mean over the timed calls; None when not timed

    @property
    def correct(self) -> bool:
        return self.max_abs_diff < SEED_TOLERANCE


def tp_mlp(
    mesh, hidden=64, x_shape=(4, 8, 64), seed=100, input_seed=42, warmup=0, iterations=0
) -> MLPCheck:
    """Megatron MLP: column-parallel W1 [H, 4H/t], GeLU, row-parallel W2 [4H/t, H], one psum."""
    tp = mesh.shape[AXIS]
    inter = 4 * hidden
    _split_check("intermediate size (4 x hidden)", inter, tp)
    w1_HF = _normal(seed, (hidden, inter), hidden)
    w2_FH = _normal(seed + 1, (inter, hidden), inter)
    x = _normal(input_seed, x_shape)

    def local(x, w1, w2):
        y = jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, AXIS)  # one all-reduce over 'tensor' (g)
        return y[None]  # stacked per device, to check that every rank holds the same output

    f = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(jax.P(), jax.P(None, AXIS), jax.P(AXIS, None)),
        out_specs=jax.P(AXIS),
    )
    compiled = jax.jit(f).lower(x, w1_HF, w2_FH).compile()
    y_tHB = compiled(x, w1_HF, w2_FH)
    dense = jax.nn.gelu(x @ w1_HF) @ w2_FH
    found = [c for c in hlo.collectives_of(compiled) if c.op == "all-reduce"]
    forward_ms = None
    if iterations > 0:
        for _ in range(warmup):
            jax.block_until_ready(compiled(x, w1_HF, w2_FH))
        start = time.perf_counter()
        for _ in range(iterations):
            jax.block_until_ready(compiled(x, w1_HF, w2_FH))
        forward_ms = (time.perf_counter() - start) / iterations * 1e3
    return MLPCheck(
        hidden=hidden,
        intermediate=inter,
        x_shape=tuple(x_shape),
        max_abs_diff=float(jnp.max(jnp.abs(y_tHB - dense[None]))),
        ranks_identical=bool(np.all(np.asarray(y_tHB) == np.asarray(y_tHB)[:1])),
        allreduces=len(found),
        allreduce_bytes=found[0].bytes_per_device if found else 0.0,
        forward_ms=forward_ms,
    )


def layer_census(cfg: ModelConfig, mesh, mode: str, grads: bool, batch=4, seq=16) -> Counter:
    """Collectives of ONE compiled tensor-parallel block over `tensor` that move at least one
    [B, T, D] activation (norm-gradient and loss reductions are smaller and left out), by op."""
    tp = mesh.shape[AXIS]
    check_tp_layout(cfg, tp, mode=mode, seq_len=seq)
    sharder = Sharder(mesh)
    layout = layer_param_layout(cfg)
    layer = {k: jax.ShapeDtypeStruct(shape, jnp.float32) for k, (shape, _) in layout.items()}
    layer_specs = {k: sharder.spec(logical) for k, (_, logical) in layout.items()}
    x_spec = jax.P(None, AXIS, None) if mode == "sequence" else jax.P()
    positions_T = jnp.arange(seq)
    pc = tensor_parallel.tensor_pieces(pieces.DENSE, cfg, mode, AXIS)

    def block(x, p):
        return pieces.block(x, p, positions_T, cfg, pc)[0]

    def loss(x, p):
        # squared, so the compiler cannot sum before the last collective (a plain sum would let
        # it reduce first and send one scalar) nor fold a transposed gather of constant ones
        total = jnp.sum(jnp.square(block(x, p)))
        return jax.lax.psum(total, AXIS) if mode == "sequence" else total  # one scalar

    if grads:  # return the loss too, or the last forward collective would be dead code
        body = jax.value_and_grad(loss, argnums=(0, 1))
        out_specs = (jax.P(), (x_spec, layer_specs))
    else:
        body, out_specs = block, x_spec
    f = jax.shard_map(body, mesh=mesh, in_specs=(x_spec, layer_specs), out_specs=out_specs)
    x = jax.ShapeDtypeStruct((batch, seq, cfg.d_model), jnp.float32)
    compiled = jax.jit(f).lower(x, layer).compile()
    activation_bytes = batch * seq * cfg.d_model * 4
    return Counter(
        c.op
        for c in hlo.normalize(hlo.collectives_of(compiled))
        if c.group_size == tp and c.bytes_per_device >= activation_bytes
    )


def census_model(hidden: int, seq: int) -> ModelConfig:
    """The layer experiment 06 counts: 8 heads (MHA) and d_ff = 4 x hidden, the seed's MLP."""
    return ModelConfig(d_model=hidden, n_heads=8, n_kv_heads=8, d_ff=4 * hidden, max_seq=seq)


def check_demo_sizes(tp: int, hidden: int, seq: int) -> None:
    """Every split experiment 06 makes, checked before anything runs (ValueError names it)."""
    tensor_mesh(tp)
    _split_check("the seed's 8 linear features (and 8 heads)", 8, tp)
    check_tp_layout(census_model(hidden, seq), tp, mode="sequence", seq_len=seq)
