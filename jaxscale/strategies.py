"""One handle on any strategy, auto or manual: its mesh, compiled step, state layout and the
abstract inputs the compiler needs. Used by `jaxscale verify`, the bench and the tests."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import NamedSharding

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import build_mesh, parse_mesh
from jaxscale.sharding import Sharder
from jaxscale.train import step as train_step


@dataclass(frozen=True)
class Case:
    path: str  # "auto" (jit + rules) or "manual" (shard_map, explicit collectives)
    strategy: str
    mesh: str
    stage: int = 0  # manual: ZeRO stage
    tp_mode: str | None = None  # manual: megatron | sequence | gather_output
    compute_dtype: str = "float32"
    dp_variant: str = "explicit"  # manual DP: "extra_pmean" is the deliberate bug (see dp.py)

    @property
    def label(self) -> str:
        dtype = "" if self.compute_dtype == "float32" else f" [{self.compute_dtype}]"
        return f"{self.path}:{self.strategy}{dtype}"


@dataclass(frozen=True)
class Built:
    case: Case
    mesh: jax.sharding.Mesh
    init: object  # () -> state
    step: object  # jitted (state, batch) -> (state, metrics)
    state_shardings: dict
    grad_shardings: dict  # the layout gradients have when the optimizer sees them
    batch_sharding: NamedSharding
    abstract_state: dict

    @property
    def group_sizes(self) -> tuple[int, int, int]:
        """(batch-splitting data group, ZeRO group, tensor) sizes."""
        shape = dict(self.mesh.shape)
        data, fsdp, tensor = shape.get("data", 1), shape.get("fsdp", 1), shape.get("tensor", 1)
        if self.case.path == "auto":  # the rules shard params over fsdp only (ZeRO-3 if > 1)
            return data * fsdp, fsdp, tensor
        return data * fsdp, data * fsdp, tensor

    @property
    def zero_stage(self) -> int:
        if self.case.path == "auto":
            return 3 if self.group_sizes[1] > 1 else 0
        return self.case.stage

    def abstract_args(self, batch: int, seq_len: int):
        state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            self.abstract_state,
            self.state_shardings,
        )
        return state, jax.ShapeDtypeStruct((batch, seq_len + 1), np.int32,
                                           sharding=self.batch_sharding)  # fmt: skip

    def put(self, batch):
        return jax.device_put(batch, self.batch_sharding)


def build(case: Case, cfg: ModelConfig, tcfg: TrainConfig, with_grads: bool = False,
          devices=None) -> Built:  # fmt: skip
    """`devices` (default: all) may be abstract TPU devices for AOT compilation."""
    cfg = cfg.replace(compute_dtype=case.compute_dtype)
    devices = list(jax.devices() if devices is None else devices)
    mesh = build_mesh(parse_mesh(case.mesh).resolve(len(devices)), devices=devices)
    if case.path == "auto":
        sharder = Sharder(mesh)
        state_sh = train_step.state_shardings(cfg, tcfg, sharder)
        return Built(
            case, mesh,
            init=lambda: train_step.init_state(cfg, tcfg, sharder),
            step=train_step.jit_train_step(cfg, tcfg, sharder, with_grads=with_grads),
            state_shardings=state_sh,
            grad_shardings=state_sh["params"],
            batch_sharding=train_step.batch_sharding(sharder),
            abstract_state=jax.eval_shape(lambda: train_step.init_state(cfg, tcfg)),
        )  # fmt: skip
    if case.path != "manual":
        raise ValueError(f"unknown path {case.path!r}; choose 'auto' or 'manual'")
    from jaxscale.parallel import manual

    built = manual.build(cfg, tcfg, mesh, stage=case.stage, tp_mode=case.tp_mode,
                         dp_variant=case.dp_variant, with_grads=with_grads)  # fmt: skip
    return Built(
        case, mesh,
        init=built.init,
        step=built.step,
        state_shardings=built.shardings(built.state_specs),
        grad_shardings=built.shardings(built.grad_specs),
        batch_sharding=NamedSharding(mesh, built.batch_spec),
        abstract_state=jax.eval_shape(built.init),
    )  # fmt: skip
