"""One composer for every strategy: a mesh plus a choice per mesh axis -> one `Built` step.

    Strategy.parse("manual:zero3+tp", "fsdp=4,tp=2")   ZeRO-3 over fsdp, Megatron TP over tensor
    Strategy.parse("auto", "dp=2,fsdp=2,tp=2")        jit + the rules table (GSPMD's collectives)

The auto path is `jaxscale.parallel.auto` with shardings from `jaxscale.sharding.RULES`. The manual
path is one `jax.shard_map` over the whole mesh, composed in a fixed order as picotron composes
`apply_tensor_parallel -> PipelineParallel -> DataParallel`: the tensor axis substitutes model
pieces (parallel/tp.py), then the data axes wrap the loss in their gradient reduction and
optimizer update (parallel/zero.py, DP being stage 0). Every axis module has the same small
interface -- `pieces` (what it substitutes in the model), its part of the step, and
`predict_comm` (the collectives it costs) -- and the predictions of the axes are summed here.

A mesh axis of size > 1 that nothing uses is refused with a message naming the axis and what
would use it, so a mesh never silently replicates work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import MeshSpec, build_mesh, parse_mesh
from jaxscale.model import pieces
from jaxscale.model import state as model_state
from jaxscale.parallel import auto, common, ep, optim, pp, tp, zero
from jaxscale.sharding import REPLICATED_RULES, ZERO_RULES, Sharder

# manual strategy names: data part (ZeRO stage) and tensor part (tp mode)
_DATA = {"dp": 0, "zero0": 0, "zero1": 1, "zero2": 2, "zero3": 3}
_TENSOR = {"tp": "megatron", "tp_sp": "sequence", "tp_gather": "gather_output"}
_TENSOR_NAME = {mode: name for name, mode in _TENSOR.items()}
_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")  # manual, pipe axis (parallel/pp/)
_EXPERT = "ep"  # manual, expert axis (parallel/ep.py): optional, the axis has one use


@dataclass(frozen=True)
class Strategy:
    """A mesh and what each of its axes does."""

    mesh: str  # "dp=2,fsdp=2,tp=2" (-1 fills the remaining devices)
    path: str = "auto"  # "auto": jit + the rules table; "manual": shard_map, explicit collectives
    zero: int = 0  # manual, data axes: 0 = DP, 1/2/3 = ZeRO stage
    tensor: str | None = None  # manual, tensor axis: megatron | sequence | gather_output
    dp_form: str = "explicit"  # manual DP: parallel/dp.py ("extra_pmean" is the classic bug)
    schedule: str | None = None  # manual, pipe axis: gpipe | 1f1b | interleaved | zb-h1
    microbatches: int = 1  # pipeline microbatches M per data shard (the gradient accumulation)
    virtual_stages: int = 1  # v, model chunks per pipe device (interleaved)

    @classmethod
    def parse(
        cls, text: str, mesh: str, microbatches: int = 1, virtual_stages: int = 1
    ) -> Strategy:
        """'auto', or 'manual:' + data part (dp, zero1..3), tensor part (tp, tp_sp, tp_gather)
        and pipeline schedule (gpipe, 1f1b, interleaved, zb-h1) joined by '+':
        'manual:zero3+tp', 'manual:tp_sp', 'manual:dp+1f1b'."""
        path, _, rest = text.strip().partition(":")
        if path == "auto" and not rest:
            return cls(mesh)
        if path != "manual" or not rest:
            raise ValueError(
                f"--strategy: unknown strategy {text!r}; write 'auto' or 'manual:' followed by "
                f"{'/'.join(_DATA)} and/or {'/'.join(_TENSOR)}, e.g. manual:zero3+tp"
            )
        zero, tensor, schedule = 0, None, None
        for part in rest.split("+"):
            if part in _DATA:
                zero = _DATA[part]
            elif part in _TENSOR:
                tensor = _TENSOR[part]
            elif part in _SCHEDULES:
                schedule = part
            elif part == _EXPERT:
                pass
            else:
                raise ValueError(
                    f"--strategy: unknown part {part!r} in {text!r}; data: "
                    f"{', '.join(_DATA)}; tensor: {', '.join(_TENSOR)}; "
                    f"pipeline: {', '.join(_SCHEDULES)}; experts: ep"
                )
        return cls(
            mesh,
            "manual",
            zero,
            tensor,
            schedule=schedule,
            microbatches=microbatches,
            virtual_stages=virtual_stages,
        )

    def name(self, spec: MeshSpec) -> str:
        """'dp_fsdp_tp' (auto: the mesh's axes), 'zero3+tp_sp' (manual: the choices)."""
        if self.path == "auto":
            short = {"data": "dp", "fsdp": "fsdp", "expert": "ep", "tensor": "tp"}
            return "_".join(short[a] for a, n in spec.axes if n != 1 and a in short) or "single"
        parts = []
        if self.zero or spec.size("data") != 1 or spec.size("fsdp") != 1:
            parts.append(f"zero{self.zero}" if self.zero else "dp")
        if spec.size("expert") > 1:
            parts.append(_EXPERT)
        if self.tensor:
            parts.append(_TENSOR_NAME[self.tensor])
        if self.schedule:
            v = f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
            parts.append(f"{self.schedule}(M={self.microbatches}{v})")
        return "+".join(parts) or "single"

    def label(self) -> str:
        return f"{self.path}:{self.name(parse_mesh(self.mesh))}"


def check_axes(strategy: Strategy, spec: MeshSpec) -> None:
    """Refuse a mesh axis nothing uses, and a choice whose axis the mesh lacks."""
    pipe = spec.size("pipe")
    if pipe > 1 and not strategy.schedule:
        raise ValueError(
            f"pp={pipe} needs a pipeline schedule: --strategy manual:dp+1f1b "
            f"(or {', '.join(_SCHEDULES)}, with --microbatches)"
        )
    if strategy.path == "auto":
        if strategy.zero or strategy.tensor or strategy.dp_form != "explicit" or strategy.schedule:
            raise ValueError(
                "per-axis choices (ZeRO stage, tensor mode, DP form) are manual; "
                "the auto path takes its layout from the mesh and the rules"
            )
        return
    if strategy.path != "manual":
        raise ValueError(f"unknown path {strategy.path!r}; choose 'auto' or 'manual'")
    label = f"manual:{strategy.name(spec)}"
    t = spec.size("tensor")
    if t > 1 and strategy.tensor is None:
        raise ValueError(
            f"tp={t} is unused by {label}: name a tensor mode, e.g. {label}+tp "
            "(or +tp_sp, +tp_gather)"
        )
    if t == 1 and strategy.tensor is not None:
        raise ValueError(f"{label} needs a tensor axis: add tp=N to the mesh")
    if strategy.zero and spec.size("data") * spec.size("fsdp") == 1:
        raise ValueError(
            f"zero{strategy.zero} shards over the data axes, but mesh {spec} has "
            "none (add dp=N or fsdp=N)"
        )
    if strategy.zero not in zero.STAGES:
        raise ValueError(f"unknown ZeRO stage {strategy.zero}; choose from {sorted(zero.STAGES)}")
    if strategy.dp_form != "explicit" and (
        strategy.zero or t > 1 or pipe > 1 or spec.size("expert") > 1
    ):
        raise ValueError("DP forms other than 'explicit' are for plain DP (no ZeRO, no tensor)")
    if strategy.schedule:
        if pipe == 1:
            raise ValueError(f"{label} needs a pipe axis: add pp=N to the mesh")
        if strategy.schedule not in _SCHEDULES:
            raise ValueError(
                f"unknown pipeline schedule {strategy.schedule!r}; choose from "
                f"{', '.join(_SCHEDULES)}"
            )
        interleaved = strategy.schedule == "interleaved"
        if strategy.microbatches < 1 or strategy.virtual_stages < 1:
            raise ValueError("--microbatches and --virtual-stages must be >= 1")
        if interleaved != (strategy.virtual_stages > 1):
            raise ValueError(
                "--virtual-stages > 1 is the interleaved schedule's (and it needs at least 2)"
            )
        if interleaved and strategy.microbatches % pipe:
            raise ValueError(
                f"the interleaved schedule needs --microbatches divisible by pp={pipe}"
            )


@dataclass(frozen=True)
class Built:
    """A strategy ready to run: its mesh, layouts, group sizes and jitted functions."""

    strategy: Strategy
    label: str
    mesh: jax.sharding.Mesh
    data_ways: int  # devices the batch is split over (data x fsdp x expert)
    zero_ways: int  # devices params / grads / optimizer state are split over (per the stage)
    tensor_ways: int
    zero_stage: int
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
    plan: pp.Plan | None = None  # the pipeline schedule's static program (manual, pipe axis)

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


def check(strategy: Strategy, tcfg: TrainConfig, n_devices: int) -> MeshSpec:
    """The checks that need no model: the mesh against the devices, every axis used, the batch
    split over the data shards. Returns the resolved mesh spec."""
    try:
        spec = parse_mesh(strategy.mesh).resolve(n_devices)
        check_axes(strategy, spec)
    except ValueError as e:
        raise ValueError(f"--mesh {strategy.mesh}: {e}") from None
    data_ways = spec.size("data") * spec.size("fsdp") * spec.size("expert")
    if strategy.schedule:
        if tcfg.grad_accum != 1:
            raise ValueError(
                f"--grad-accum {tcfg.grad_accum}: under a pipeline the microbatches "
                "are the gradient accumulation; use --microbatches"
            )
        rows = tcfg.global_batch // data_ways
        if tcfg.global_batch % data_ways or rows % strategy.microbatches:
            raise ValueError(
                f"--global-batch {tcfg.global_batch} does not divide over the "
                f"{data_ways} data-parallel shards of {spec} in --microbatches "
                f"{strategy.microbatches}"
            )
        return spec
    micro = tcfg.global_batch // tcfg.grad_accum
    if tcfg.global_batch % tcfg.grad_accum or micro % data_ways:
        raise ValueError(
            f"--global-batch {tcfg.global_batch} does not divide over the "
            f"{data_ways} data-parallel shards of {spec} in --grad-accum "
            f"{tcfg.grad_accum} microbatch(es) (of {micro} sequences)"
        )
    return spec


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
    spec = check(strategy, tcfg, len(devices))
    mesh = build_mesh(spec, devices=devices)
    ways = {a: spec.size(a) for a in ("data", "fsdp", "tensor", "pipe", "expert")}
    label = f"{strategy.path}:{strategy.name(spec)}"
    build_fn = _auto if strategy.path == "auto" else _manual
    try:
        check_model(strategy, cfg, ways)
        return build_fn(strategy, label, mesh, ways, cfg, tcfg, with_grads)
    except ValueError as e:  # a model dimension that does not split over this mesh
        raise ValueError(f"--mesh {strategy.mesh} ({label}): {e}") from None


def check_model(strategy: Strategy, cfg: ModelConfig, ways: dict) -> None:
    """The checks that need the model: experts against the expert axis and the composition."""
    if ways["expert"] > 1:
        ep.check(cfg, ways["expert"])

    if cfg.n_experts and strategy.tensor == "gather_output":
        raise ValueError(
            "tp_gather is seed 004's dense-MLP composition; an MoE model's experts "
            "split F as megatron does: use manual:tp"
        )


def _auto(strategy, label, mesh, ways, cfg, tcfg, with_grads) -> Built:
    sharder = Sharder(mesh)
    state_sh = auto.state_shardings(cfg, tcfg, sharder)
    batch_sh = auto.batch_sharding(sharder)
    plain = ways["fsdp"] == 1 and ways["tensor"] == 1 and ways["expert"] == 1
    why = "GSPMD chooses its own collectives here; the manual row states the schedule"

    def predict(cfg_, batch, seq_len):  # auto DP: GSPMD's all-reduce is the textbook one
        if not plain:
            return None, why
        shape = step_shape(cfg_, batch // ways["data"] * seq_len)
        return zero.predict_comm(shape, n=ways["data"], stage=0), None

    def terms(params, batch_BT1):
        return pieces.loss_terms(params, batch_BT1, cfg, auto.auto_pieces(sharder))[1]

    return Built(
        strategy,
        label,
        mesh,
        data_ways=ways["data"] * ways["fsdp"] * ways["expert"],
        zero_ways=ways["fsdp"],
        tensor_ways=ways["tensor"],
        zero_stage=3 if ways["fsdp"] > 1 else 0,
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


def _manual(strategy, label, mesh, ways, cfg, tcfg, with_grads) -> Built:
    stage, mode = strategy.zero, strategy.tensor
    if strategy.schedule:
        pp.check_layers(cfg, ways["pipe"], strategy.virtual_stages)
    axes = common.data_axes(mesh)  # the ZeRO group; the batch is also split over `expert`
    n, t, n_ep = ways["data"] * ways["fsdp"], ways["tensor"], ways["expert"]
    batch_axes = (*axes, ep.AXIS) if n_ep > 1 else axes
    if mode:
        tp.check_tp_layout(cfg, t, mode=mode, seq_len=tcfg.seq_len)
    dp_specs = common.param_specs(cfg, Sharder(mesh, REPLICATED_RULES))
    z_specs = common.param_specs(cfg, Sharder(mesh, ZERO_RULES))
    tx = optim.make_optimizer(tcfg, cfg)
    state_specs = {
        "step": P(),
        "params": z_specs if stage == 3 else dp_specs,
        "opt_state": optim.opt_layout(tx, cfg, dp_specs if stage == 0 else z_specs, P()),
    }
    batch_spec = P(batch_axes if batch_axes else None, None)
    grad_specs = dp_specs if stage in (0, 1) else z_specs  # the layout the update sees

    # the composition: tensor axis (model pieces), experts (their all-to-alls), then the data
    # axes (ZeRO-3's gathers)
    pc = pieces.DENSE
    if mode:
        pc = tp.pieces(pc, cfg, mode)
    if n_ep > 1:
        pc = ep.pieces(pc)
    pc = zero.pieces(pc, stage, z_specs, axes)

    # this data shard's rows (the mean over the expert axis's shards); TP's collectives inside
    local_loss = ep.local_loss(lambda params, rows: pieces.loss(params, rows, cfg, pc), n_ep)

    def local_terms(params, batch_BT1):  # the loss's terms, averaged over every batch shard
        terms = pieces.loss_terms(params, batch_BT1, cfg, pc)[1]
        return jax.lax.pmean(terms, batch_axes) if batch_axes else terms

    plan = None
    if strategy.schedule:  # the pipe axis: a schedule replaces the microbatch loop
        plan = pp.make_plan(
            ways["pipe"], strategy.microbatches, strategy.schedule, strategy.virtual_stages
        )

    def local_grads(params, batch_BT1, unreduced):  # this shard's mean loss and gradient
        if plan is None:
            return common.accumulate(
                local_loss, params, batch_BT1, tcfg.grad_accum, axes, unreduced
            )
        return pp.accumulate(
            params,
            batch_BT1,
            plan=plan,
            cfg=cfg,
            pc=pc,
            data_axes=axes,
            unreduced=unreduced,
            zero_specs=z_specs,
            expert_ways=n_ep,
        )

    def loss_and_grads(params, batch_BT1):  # the data axes' reduction around the local loss
        return zero.loss_and_grads(
            local_loss,
            params,
            batch_BT1,
            stage=stage,
            zero_specs=z_specs,
            axes=axes,
            n=n,
            dp_form=strategy.dp_form,
            local=local_grads,
        )

    schedule = optim.lr_schedule(tcfg)
    metric_specs = {"loss": P(), "grad_norm": P(), "lr": P()}
    if with_grads:
        metric_specs["grads"] = grad_specs

    def body(state, batch_BT1):
        params = state["params"]
        loss, grads = loss_and_grads(params, batch_BT1)
        g_norm = jnp.sqrt(common.global_sq_norm(grads, grad_specs))  # psums of per-leaf sums
        clipped = optim.clip_by_global_norm(grads, g_norm, tcfg.grad_clip)
        new_params, opt_state = zero.update(
            stage, tx, clipped, state["opt_state"], params, z_specs, axes
        )
        metrics = {"loss": loss, "grad_norm": g_norm, "lr": schedule(state["step"])}
        if with_grads:
            metrics["grads"] = grads
        return {"step": state["step"] + 1, "params": new_params, "opt_state": opt_state}, metrics

    def shard(fn, in_specs, out_specs):
        if strategy.virtual_stages > 1:  # interleaved: each device's chunks are circular
            return pp.circular_shard_map(fn, mesh, in_specs, out_specs, strategy.virtual_stages)
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)

    pspecs = state_specs["params"]

    def init():
        params = model_state.init_params(cfg, tcfg.seed)
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    forward_plan = plan and pp.forward_plan(plan)

    def mean_loss(params, batch_BT1):  # the forward only; one all-reduce of the scalar
        if plan is None:
            return jax.lax.pmean(local_loss(params, batch_BT1), axes)
        loss, _ = pp.accumulate(
            params,
            batch_BT1,
            plan=forward_plan,
            cfg=cfg,
            pc=pc,
            data_axes=axes,
            unreduced=True,
            expert_ways=n_ep,
        )
        return jax.lax.pmean(loss, axes) if axes else loss

    def predict(cfg_, batch, seq_len):
        if plan is not None:
            return None, (
                "a pipeline's other collectives sit in the schedule's conditionals, "
                "where the census counts each branch once; its transfers are "
                "compared with their formula instead"
            )
        rows = batch // (n * n_ep)
        shape = step_shape(cfg_, rows * seq_len, t=t, ep=n_ep)
        any_split = (stage in (2, 3) and n > 1) or t > 1 or n_ep > 1
        return common.add_comm(
            zero.predict_comm(shape, n=n, stage=stage),
            tp.predict_comm(shape, t=t, mode=mode, norm_grads_elsewhere=stage == 3 and n > 1),
            ep.predict_comm(shape, cfg_, ep=n_ep, rows_local=rows, seq_len=seq_len, t=t),
            common.norm_comm(shape, any_split),
        ), None

    return Built(
        strategy,
        label,
        mesh,
        data_ways=n * n_ep,
        zero_ways=n if stage else 1,
        tensor_ways=t,
        zero_stage=stage,
        plan=plan,
        init=jax.jit(init, out_shardings=common.named_shardings(mesh, state_specs)),
        step=jax.jit(
            shard(body, (state_specs, batch_spec), (state_specs, metric_specs)), donate_argnums=0
        ),
        loss_and_grads=jax.jit(shard(loss_and_grads, (pspecs, batch_spec), (P(), grad_specs))),
        loss=jax.jit(shard(mean_loss, (pspecs, batch_spec), P())),
        terms=None if plan else jax.jit(shard(local_terms, (pspecs, batch_spec), P())),
        state_shardings=common.named_shardings(mesh, state_specs),
        grad_shardings=common.named_shardings(mesh, grad_specs),
        batch_sharding=NamedSharding(mesh, batch_spec),
        abstract_state=jax.eval_shape(init),
        predict_comm=predict,
    )


def step_shape(cfg: ModelConfig, tokens_local: int, t: int = 1, ep: int = 1) -> common.StepShape:
    """Matrices vs norm scales (by their logical axes), with the shapes the predictions need.
    Matrix counts are one device's share on `t` tensor and `ep` expert devices (before ZeRO)."""
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
        tokens_local=tokens_local,
        d_model=cfg.d_model,
        qkv_width=(cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim,
        d_ff=cfg.d_ff,
        shared_matrix_params=sum(m for m, e in matrix if not e),
    )
