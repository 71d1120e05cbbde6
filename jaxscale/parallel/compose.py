"""One composer for every strategy: a mesh plus a choice per mesh axis -> one `Built` step.

    build(Strategy.parse("manual:zero3+tp", "fsdp=4,tp=2"), cfg, tcfg)

The strategy (parallel/strategy.py) is parsed once and resolved here against the devices. The
auto path is `jaxscale.parallel.auto` with shardings from `jaxscale.sharding.RULES`. The manual
path (parallel/manual.py) is one `jax.shard_map` over the whole mesh, composed from the axis
modules through one interface: `pieces(pc, comp)` (what the axis substitutes in the model) and
`predict_comm(shape, comp)` (the collectives it costs), with `comp` the resolved composition
(`common.Composition`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import jax
import numpy as np
from jax.sharding import NamedSharding

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import build_mesh
from jaxscale.model import pieces
from jaxscale.model import state as model_state
from jaxscale.parallel import auto, buckets, common, manual, zero
from jaxscale.parallel.strategy import Strategy, check, check_axes, check_model
from jaxscale.sharding import Sharder

__all__ = ["Built", "Strategy", "build", "check", "check_axes", "check_model", "step_shape"]

_WAYS = ("data", "fsdp", "tensor", "pipe", "expert", "context")


@dataclass(frozen=True)
class Built:
    """A strategy ready to run: the strategy resolved on its mesh, its layouts and its jitted
    functions."""

    strategy: Strategy  # its mesh resolved against the devices
    mesh: jax.sharding.Mesh
    init: Callable  # () -> state in this layout
    step: Callable  # jitted (state, batch [B, T+1]) -> (state, {loss, grad_norm, lr[, grads]})
    loss_and_grads: Callable  # jitted (params, batch) -> (mean loss, mean grads in grad layout)
    loss: Callable  # jitted (params, batch) -> mean loss (the forward only)
    terms: Callable | None  # jitted (params, batch) -> the loss's terms (pieces.loss_terms)
    state_shardings: dict
    grad_shardings: dict  # the layout gradients have when the optimizer sees them
    batch_sharding: NamedSharding
    abstract_state: dict
    predict_comm: Callable  # (cfg, batch, seq_len) -> ({op: bytes per device} | None, why not)
    comp: common.Composition | None = None  # the manual path's composition

    @property
    def label(self) -> str:
        return self.strategy.label()

    @property
    def plan(self):
        """The pipeline schedule's static program (manual, pipe axis), or None."""
        return self.comp.plan if self.comp else None

    def size(self, axis: str) -> int:
        return self.strategy.mesh.size(axis)

    @property
    def data_ways(self) -> int:  # devices the batch is split over (data x fsdp x expert)
        return self.size("data") * self.size("fsdp") * self.size("expert")

    @property
    def tensor_ways(self) -> int:
        return self.size("tensor")

    @property
    def zero_stage(self) -> int:
        if self.strategy.path == "auto":  # GSPMD with the rules table: fsdp shards everything
            return 3 if self.size("fsdp") > 1 else 0
        return self.strategy.zero

    @property
    def zero_ways(self) -> int:  # devices params / grads / optimizer state are split over
        if self.strategy.path == "auto":
            return self.size("fsdp")
        return self.size("data") * self.size("fsdp") if self.zero_stage else 1

    def abstract_args(self, batch: int, seq_len: int):
        state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            self.abstract_state,
            self.state_shardings,
        )
        tokens = jax.ShapeDtypeStruct((batch, seq_len + 1), np.int32, sharding=self.batch_sharding)
        return state, tokens

    def put(self, batch):
        return jax.device_put(batch, self.batch_sharding)


def build(
    strategy: Strategy,
    cfg: ModelConfig,
    tcfg: TrainConfig,
    *,
    with_grads: bool = False,
    devices=None,
) -> Built:
    """`devices` (default: all) may be abstract TPU devices for AOT compilation."""
    devices = list(jax.devices() if devices is None else devices)
    strategy = replace(strategy, mesh=check(strategy, tcfg, len(devices)))
    mesh = build_mesh(strategy.mesh, devices=devices)
    ways = {a: strategy.mesh.size(a) for a in _WAYS}
    try:
        check_model(strategy, cfg, ways)
        buckets.check(strategy, ways, cfg, tcfg)
        _check_offload(strategy, tcfg, devices)
        _check_remat_offload(cfg, devices)
        if strategy.path == "auto":
            return _auto(strategy, mesh, ways, cfg, tcfg, with_grads)
        m = manual.compose(strategy, mesh, ways, cfg, tcfg)
        return Built(
            strategy,
            mesh,
            **manual.functions(m, mesh, strategy, with_grads),
            predict_comm=lambda cfg_, batch, seq_len: manual.predict(
                m, step_shape, cfg_, batch, seq_len
            ),
            comp=m.comp,
        )
    except ValueError as e:  # a model dimension that does not split over this mesh
        raise ValueError(f"--mesh {strategy.mesh} ({strategy.label()}): {e}") from None


def _check_offload(strategy: Strategy, tcfg: TrainConfig, devices) -> None:
    """--offload opt_state: the auto path's state shardings carry the memory kind (the manual
    path's shard_map state does not), on a backend that has host memory."""
    if tcfg.offload == "none":
        return
    if strategy.path != "auto":
        raise ValueError(
            f"--offload {tcfg.offload} is the auto path's (its state shardings carry the memory "
            "kind): use --strategy auto"
        )
    kinds = {m.kind for m in devices[0].addressable_memories()}
    if auto.HOST not in kinds:
        raise ValueError(
            f"--offload {tcfg.offload}: {devices[0].platform} devices have no {auto.HOST} memory "
            f"(their memory kinds: {', '.join(sorted(kinds))})"
        )


def _check_remat_offload(cfg: ModelConfig, devices) -> None:
    """--remat offload needs a compiler that moves the kept block inputs to host memory: XLA:CPU
    drops the copies (its step keeps them on the device), so there it would silently be block."""
    if cfg.remat == "offload" and devices[0].platform == "cpu":
        raise ValueError(
            "--remat offload: XLA:CPU keeps saved activations in device memory (it drops the host "
            "copies), so on CPU devices it would be --remat block; it needs a TPU or GPU"
        )


def _auto(strategy, mesh, ways, cfg, tcfg, with_grads) -> Built:
    sharder = Sharder(mesh)
    state_sh = auto.state_shardings(cfg, tcfg, sharder)
    batch_sh = auto.batch_sharding(sharder)
    plain = all(ways[a] == 1 for a in ("fsdp", "tensor", "expert", "context"))
    why = "GSPMD chooses its own collectives here; the manual row states the schedule"

    def predict(cfg_, batch, seq_len):  # auto DP: GSPMD's all-reduce is the textbook one
        if not plain:
            return None, why
        shape = step_shape(cfg_, batch // ways["data"], seq_len)
        return zero.predict_comm(shape, common.Composition(cfg_, ways)), None

    def terms(params, batch_BT1):
        return pieces.loss_terms(params, batch_BT1, cfg, auto.auto_pieces(sharder))[1]

    return Built(
        strategy,
        mesh,
        init=lambda: auto.init_state(cfg, tcfg, sharder),
        step=auto.jit_train_step(cfg, tcfg, sharder, with_grads=with_grads),
        loss_and_grads=jax.jit(
            lambda p, b: auto.loss_and_grads(p, b, cfg, sharder, tcfg.grad_accum),
            in_shardings=(state_sh["params"], batch_sh),
        ),
        loss=jax.jit(
            lambda p, b: auto.loss_fn(p, b, cfg, sharder),
            in_shardings=(state_sh["params"], batch_sh),
        ),
        terms=jax.jit(terms, in_shardings=(state_sh["params"], batch_sh)),
        state_shardings=state_sh,
        grad_shardings=state_sh["params"],
        batch_sharding=batch_sh,
        abstract_state=jax.eval_shape(lambda: auto.init_state(cfg, tcfg)),
        predict_comm=predict,
    )


def step_shape(
    cfg: ModelConfig, rows_local: int, seq_len: int = 0, t: int = 1, ep: int = 1
) -> common.StepShape:
    """Matrices vs norm scales (by their logical axes), with the shapes the predictions need, for
    `rows_local` rows of `seq_len` tokens per data shard. Matrix counts are one device's share on
    `t` tensor and `ep` expert devices (before ZeRO)."""
    shapes = jax.tree.leaves(model_state.abstract_params(cfg))
    names = jax.tree.leaves(model_state.logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    norm = [s.size for s, nm in zip(shapes, names, strict=True) if "norm" in nm]
    tensor_split = {"heads", "kv_heads", "mlp", "vocab"}

    def local(size, nm):
        return size / (t if tensor_split & set(nm) else 1) / (ep if "expert" in nm else 1)

    matrix = [
        (local(s.size, nm), "expert" in nm)
        for s, nm in zip(shapes, names, strict=True)
        if "norm" not in nm
    ]
    return common.StepShape(
        matrix_params=sum(m for m, _ in matrix),
        norm_params=sum(norm),
        matrix_leaves=len(matrix),
        n_layers=cfg.n_layers,
        rows_local=rows_local,
        seq_len=seq_len,
        d_model=cfg.d_model,
        qkv_width=(cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim,
        d_ff=cfg.d_ff,
        shared_matrix_params=sum(m for m, e in matrix if not e),
        act_bytes=np.dtype(cfg.compute_dtype).itemsize,
    )
