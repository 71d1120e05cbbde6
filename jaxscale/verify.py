"""The one case list and the one run-and-compare harness, used by `jaxscale verify`, the bench
and the tests.

A case is a strategy (mesh + per-axis choices) run under a training variant (compute dtype,
gradient accumulation, optimizer). `check` runs it for TRAJ_STEPS steps with real updates on the
same batches as the single-device reference and compares, each against its stated tolerance
(jaxscale/tolerances.py):

  loss     the first step's loss;
  grads    every leaf of the first step's (pre-clip) gradient;
  traj     the losses and pre-clip gradient norms of every step, and the final parameters.

bf16-compute cases are compared with the f32 reference within stated bands. The three checks are
reported separately, so a test can assert which one a known-bad strategy fails.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import jax
import numpy as np

from jaxscale import tolerances as tol
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.parallel import auto
from jaxscale.parallel.compose import Built, Strategy, build
from jaxscale.train import data

TRAJ_STEPS = 10
CFG = ModelConfig(n_heads=8, n_kv_heads=8)  # kv heads divide every tensor degree up to 8
TCFG = TrainConfig(steps=TRAJ_STEPS, global_batch=16, seq_len=32, warmup_steps=2, lr=1e-3)
SGD_LR = 0.1  # plain SGD needs a larger step than AdamW to train in TRAJ_STEPS steps


@dataclass(frozen=True)
class Case:
    strategy: Strategy
    compute_dtype: str = "float32"
    grad_accum: int = 1
    optimizer: str = "adamw"  # "sgd": plain SGD without clipping, so a gradient-scale bug shows
    bench: str = ""  # also a row of a bench suite: "meshes" (`make bench`), "experts", "context"
    n_layers: int | None = None  # a deeper model than CFG's (pipeline stages slice the layers)
    model: tuple = ()  # further ModelConfig changes, (field, value) pairs (experts: MOE)
    # bf16 compared with the same bf16 model on one device (BF16_SAME_*), where bf16 itself
    # moves a leaf further from f32 than the f32 band allows (an MoE router's gradient)
    bf16_reference: bool = False

    @property
    def mesh(self) -> str:
        return str(self.strategy.mesh)

    @property
    def n_devices(self) -> int:
        return self.strategy.mesh.n_devices

    @property
    def label(self) -> str:
        extra = "" if self.compute_dtype == "float32" else f" [{self.compute_dtype}]"
        extra += f" accum={self.grad_accum}" if self.grad_accum > 1 else ""
        extra += f" {self.optimizer}" if self.optimizer != "adamw" else ""
        extra += f" L={self.n_layers}" if self.n_layers else ""
        extra += "".join(_SHORT_MODEL[k](v) for k, v in self.model)
        extra += " vs bf16" if self.bf16_reference else ""
        return self.strategy.label() + extra

    def configs(self, cfg: ModelConfig, tcfg: TrainConfig) -> tuple[ModelConfig, TrainConfig]:
        tcfg = tcfg.replace(grad_accum=self.grad_accum, optimizer=self.optimizer)
        if self.optimizer == "sgd":  # no clipping either: the update is the gradient itself
            tcfg = tcfg.replace(grad_clip=0.0, lr=SGD_LR)
        cfg = cfg.replace(n_layers=self.n_layers) if self.n_layers else cfg
        return cfg.replace(compute_dtype=self.compute_dtype, **dict(self.model)), tcfg


def _case(text: str, mesh: str, bench: bool | str = False, grad_buckets=0, **variant) -> Case:
    suite = bench if isinstance(bench, str) else "meshes" if bench else ""
    strategy = dataclasses.replace(Strategy.parse(text, mesh), grad_buckets=grad_buckets)
    return Case(strategy, bench=suite, **variant)


# the MoE cases' model: 8 experts, top-2; capacity factor 2 gives C = 16 slots of a 32-token
# sequence's 64 assignments: nothing drops at the start (tests/model/test_moe.py checks the
# first batch)
MOE = (("n_experts", 8), ("top_k", 2), ("capacity_factor", 2.0))
_SHORT_MODEL = {
    "n_experts": lambda v: f" E={v}",
    "top_k": lambda v: f" k={v}",
    "capacity_factor": lambda v: f" cf={v:g}",
    "moe_mode": lambda v: f" {v}",
    "moe_every": lambda v: f" every={v}",
}


def _moe(text: str, mesh: str, bench: bool = False, **changes) -> Case:
    """An MoE case: MOE's model with `changes` to its config (model fields) or the variant."""
    model = {**dict(MOE), **{k: v for k, v in changes.items() if k in _SHORT_MODEL}}
    variant = {k: v for k, v in changes.items() if k not in _SHORT_MODEL}
    return Case(
        Strategy.parse(text, mesh),
        bench="experts" if bench else "",
        model=tuple(model.items()),
        **variant,
    )


def _pipe(text: str, mesh: str, m: int, layers: int = 8, v: int = 1, **variant) -> Case:
    """A pipeline case: M microbatches, a model of `layers` layers (divisible by the stages)."""
    strategy = Strategy.parse(text, mesh, microbatches=m, virtual_stages=v)
    return Case(strategy, n_layers=layers, **variant)


PIPE_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")

# Every strategy x mesh the lab checks. `bench=True`: also a row of a bench suite -- the dense
# cases `make bench`'s mesh table, the MoE cases `bench experts` (`bench_cases`).
CASES: tuple[Case, ...] = (
    _case("auto", "dp=8", True),
    _case("auto", "fsdp=8", True),
    _case("auto", "tp=8", True),
    _case("auto", "dp=2,tp=4", True),
    _case("auto", "dp=4,tp=2"),
    _case("auto", "fsdp=2,tp=4"),
    _case("auto", "fsdp=4,tp=2", True),
    _case("auto", "dp=2,fsdp=4"),
    _case("auto", "dp=4,fsdp=2"),
    _case("auto", "dp=2,fsdp=2,tp=2", True),
    _case("manual:dp", "dp=8", True),
    _case("manual:zero1", "dp=8", True),
    _case("manual:zero2", "dp=8", True),
    _case("manual:zero3", "fsdp=8", True),
    _case("manual:zero3", "dp=2,fsdp=4"),
    _case("manual:zero1", "dp=4,fsdp=2"),
    _case("manual:zero2", "dp=2,fsdp=4"),
    _case("manual:dp", "dp=2,fsdp=4"),
    _case("manual:dp", "dp=4,fsdp=2"),
    _case("manual:tp", "tp=8", True),
    _case("manual:tp_sp", "tp=8", True),
    _case("manual:tp_gather", "tp=8"),
    _case("manual:dp+tp", "dp=2,tp=4"),
    _case("manual:dp+tp", "dp=4,tp=2"),
    _case("manual:zero1+tp", "dp=4,tp=2"),
    _case("manual:zero2+tp", "dp=2,tp=4"),
    _case("manual:zero3+tp", "fsdp=4,tp=2", True),
    _case("manual:zero3+tp", "fsdp=2,tp=4"),
    _case("manual:zero3+tp_sp", "dp=2,fsdp=2,tp=2"),
    # DP's gradient all-reduce in buckets inside the backward (parallel/buckets.py)
    _case("manual:dp", "dp=8", grad_buckets=2, n_layers=4),
    _case("manual:dp+tp", "dp=2,tp=4", grad_buckets=4, n_layers=4),
    # gradient accumulation: one reduction per step, microbatch gradients averaged
    _case("manual:dp", "dp=8", grad_accum=2),
    _case("manual:zero3", "fsdp=8", grad_accum=2),
    _case("manual:zero2+tp", "dp=2,tp=4", grad_accum=2),
    # plain SGD: the update is the gradient itself, nothing normalises a scale error away
    _case("manual:zero3+tp", "fsdp=4,tp=2", optimizer="sgd"),
    _case("auto", "dp=2,fsdp=2,tp=2", compute_dtype="bfloat16"),
    _case("manual:zero3+tp", "fsdp=4,tp=2", compute_dtype="bfloat16"),
    # pipelines: every schedule on every pipelined mesh (8 layers; interleaved on pp=8: 16)
    *(
        case
        for sched in PIPE_SCHEDULES
        for case in (
            _pipe(
                f"manual:{sched}",
                "pp=8",
                8,
                layers=16 if sched == "interleaved" else 8,
                v=2 if sched == "interleaved" else 1,
            ),
            _pipe(f"manual:dp+{sched}", "pp=2,dp=4", 4, v=2 if sched == "interleaved" else 1),
            _pipe(f"manual:zero3+{sched}", "pp=4,fsdp=2", 4, v=2 if sched == "interleaved" else 1),
            _pipe(f"manual:tp+{sched}", "pp=2,tp=4", 4, v=2 if sched == "interleaved" else 1),
            _pipe(
                f"manual:zero1+tp+{sched}",
                "pp=2,dp=2,tp=2",
                4,
                v=2 if sched == "interleaved" else 1,
            ),
        )
    ),
    _pipe("manual:zero1+tp+1f1b", "pp=2,dp=2,tp=2", 4, compute_dtype="bfloat16"),
    # mixture of experts: expert parallelism (all-to-all), TP of experts, and the auto path
    _moe("manual:ep", "ep=8", True),
    _moe("manual:dp+ep", "ep=4,dp=2", True),
    _moe("manual:zero3+ep+tp", "ep=2,fsdp=2,tp=2"),
    _moe("manual:tp", "tp=8", True),
    _moe("auto", "ep=4,dp=2", True),
    _moe("auto", "ep=8"),
    _moe("auto", "ep=2,fsdp=2,tp=2"),
    _moe("manual:zero1+ep", "dp=2,ep=4", True),
    _moe("manual:zero2+ep+tp_sp", "dp=2,ep=2,tp=2"),
    _moe("manual:ep", "ep=8", moe_mode="dropless"),
    _moe("auto", "ep=4,dp=2", moe_mode="dropless"),
    _moe("manual:dp+ep", "ep=4,dp=2", capacity_factor=0.5),  # drops: the same tokens
    _moe("auto", "ep=8", capacity_factor=0.5),
    _moe("manual:tp", "tp=8", capacity_factor=0.5),
    _moe("manual:dp+ep", "ep=4,dp=2", n_experts=4, top_k=1, moe_every=2),  # top-1, every 2nd
    _moe("manual:ep", "ep=8", grad_accum=2),
    _moe("manual:dp+ep", "ep=4,dp=2", compute_dtype="bfloat16", bf16_reference=True),
    # MoE under the pipeline schedules: each stage adds its MoE layers' router losses
    _pipe("manual:dp+1f1b", "pp=2,dp=4", 4, layers=4, model=MOE),
    _pipe("manual:ep+gpipe", "pp=2,ep=4", 2, layers=4, model=MOE),
    _pipe("manual:ep+tp+zb-h1", "pp=2,ep=2,tp=2", 4, layers=4, model=MOE),
    _pipe("manual:ep+interleaved", "pp=2,ep=4", 2, layers=4, v=2, model=MOE),
    _pipe(
        "manual:dp+1f1b",
        "pp=2,dp=4",
        4,
        layers=4,
        model=tuple({**dict(MOE), "top_k": 1, "moe_every": 2}.items()),
    ),
    # context parallelism: each form alone, balanced (zigzag) and contiguous, with the data
    # axes, ZeRO, Megatron TP and sequence parallelism, the pipeline, and on 16 devices
    _case("manual:cp_ring", "cp=8", "context"),
    _case("manual:cp_gather", "cp=8", "context"),
    _case("manual:cp_ulysses", "cp=8", "context"),
    _case("manual:cp_ring_contig", "cp=8"),
    _case("manual:dp+cp_ring", "dp=2,cp=4"),
    _case("manual:dp+cp_gather", "dp=2,cp=4"),
    _case("manual:zero1+cp_ulysses", "dp=2,cp=4"),
    _case("manual:dp+cp_gather_contig", "dp=2,cp=4"),
    _case("manual:zero3+tp+cp_ring", "fsdp=2,cp=2,tp=2"),
    _case("manual:zero3+tp+cp_ulysses", "fsdp=2,cp=2,tp=2", "context"),
    _case("manual:zero2+tp_sp+cp_gather", "dp=2,cp=2,tp=2"),
    _case("manual:dp+cp_ring", "dp=2,cp=4", compute_dtype="bfloat16"),
    _case("manual:dp+cp_gather", "dp=2,cp=4", grad_accum=2),
    _pipe("manual:dp+cp_gather+1f1b", "pp=2,dp=2,cp=2", 4),
    _pipe("manual:dp+cp_ulysses+zb-h1", "pp=2,dp=2,cp=2", 4),
    # the ring inside a schedule: its hops are all-to-alls of the context group there
    # (parallel/cp/ring.py); cp=4 runs three hops per layer
    _pipe("manual:dp+cp_ring+gpipe", "pp=2,dp=2,cp=2", 4),
    _pipe("manual:dp+cp_ring+interleaved", "pp=2,dp=2,cp=2", 4, v=2),
    _pipe("manual:cp_ring+1f1b", "pp=2,cp=4", 4),
    _case("auto", "cp=8"),
    _case("auto", "dp=2,cp=4", "context"),
    _case("auto", "fsdp=2,cp=2,tp=2"),
    # MoE over the context axis (dropless: capacity ranks whole sequences), with EP and DP
    _moe("manual:dp+ep+cp_ring", "ep=2,cp=2,dp=2", moe_mode="dropless"),
    # four axes of size 2 on 16 simulated devices (`jaxscale verify` asks for 16)
    _pipe("manual:dp+tp+cp_gather+1f1b", "dp=2,pp=2,cp=2,tp=2", 4),
)


def bench_cases(suite: str) -> tuple[Case, ...]:
    """The rows of a bench suite, from the one list: "meshes" (dense) or "experts" (MoE)."""
    return tuple(c for c in CASES if c.bench == suite)


@dataclass(frozen=True)
class Trajectory:
    losses: np.ndarray
    grad_norms: np.ndarray  # pre-clip, per step
    params: dict  # after the last step
    grads0: dict | None = None  # the first step's gradient (steps compiled with_grads)
    # a bf16 reference's f32 twin's first gradient: what "vs bf16" measures errors against
    truth0: dict | None = None
    initial: dict | None = None  # the reference's initial state (host arrays), shared by the cases
    step_ms: tuple[float, ...] = ()  # wall-clock of each step (call to loss on the host)


def run(step, state, put, batches) -> Trajectory:
    """Run `step` over `batches` from `state`, recording what the checks compare."""
    losses, norms, grads0, times = [], [], None, []
    for batch in batches:
        batch = put(batch)
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))  # waits for the step
        times.append(1e3 * (time.perf_counter() - t0))
        norms.append(float(metrics["grad_norm"]))
        if grads0 is None and "grads" in metrics:
            grads0 = jax.device_get(metrics["grads"])
    return Trajectory(
        np.asarray(losses),
        np.asarray(norms),
        jax.device_get(state["params"]),
        grads0,
        step_ms=tuple(times),
    )


def batches(tcfg: TrainConfig, steps: int = TRAJ_STEPS) -> list[np.ndarray]:
    task = data.MarkovData()
    return [task.rows(tcfg.seed, s, range(tcfg.global_batch), tcfg.seq_len) for s in range(steps)]


def reference(
    cfg: ModelConfig, tcfg: TrainConfig, steps: int = TRAJ_STEPS, with_grads: bool = True
) -> Trajectory:
    """The oracle: the unsharded step on one device."""
    step = auto.jit_train_step(cfg, tcfg, None, with_grads=with_grads)
    initial = jax.device_get(auto.init_state(cfg, tcfg))
    traj = run(step, initial, lambda b: b, batches(tcfg, steps))
    return dataclasses.replace(traj, initial=initial)


def run_built(
    built: Built, tcfg: TrainConfig, steps: int = TRAJ_STEPS, step=None, initial: dict | None = None
) -> Trajectory:
    """The strategy's trajectory, from its own init or from `initial` placed in its layout (the
    reference's state: the same numbers, and one compile fewer per case)."""
    with jax.set_mesh(built.mesh):
        state = built.init() if initial is None else jax.device_put(initial, built.state_shardings)
        return run(step or built.step, state, built.put, batches(tcfg, steps))


@dataclass
class Result:
    case: Case
    label: str = ""
    loss_err: float = float("nan")  # |first loss - reference|
    grad_ratio: float = float("nan")  # worst |dg| / tolerance over all leaves; <= 1 passes
    traj_loss_err: float = float("nan")
    traj_norm_err: float = float("nan")  # worst relative pre-clip gradient-norm error
    traj_param_err: float = float("nan")
    error: str | None = None
    ref_loss: float = 1.0  # the reference's first loss (the loss tolerances are relative to it)

    @property
    def bf16(self) -> bool:
        return self.case.compute_dtype != "float32"

    @property
    def loss_ok(self) -> bool:
        if self.case.bf16_reference:
            return self.loss_err <= tol.BF16_SAME_ATOL + tol.BF16_SAME_RTOL * self.ref_loss
        if self.bf16:  # relative to the f32 reference's loss
            return self.loss_err <= tol.BF16_LOSS_RTOL * self.ref_loss
        return self.loss_err <= tol.ATOL + tol.RTOL * self.ref_loss

    @property
    def grads_ok(self) -> bool | None:
        return None if np.isnan(self.grad_ratio) else self.grad_ratio <= 1.0

    @property
    def traj_ok(self) -> bool:
        atol = tol.BF16_TRAJ_ATOL if self.bf16 else tol.TRAJ_ATOL
        norm_rtol = tol.BF16_NORM_RTOL if self.bf16 else tol.TRAJ_NORM_RTOL
        return (
            max(self.traj_loss_err, self.traj_param_err) <= atol and self.traj_norm_err <= norm_rtol
        )

    @property
    def passed(self) -> bool:
        return self.error is None and self.loss_ok and self.grads_ok is not False and self.traj_ok


def compare(case: Case, got: Trajectory, ref: Trajectory, label: str = "") -> Result:
    bf16 = case.compute_dtype != "float32"
    r = Result(case, label or case.label, ref_loss=float(abs(ref.losses[0])))
    r.loss_err = float(abs(got.losses[0] - ref.losses[0]))
    if got.grads0 is not None and ref.grads0 is not None:
        truths = (
            jax.tree.leaves(ref.truth0)
            if ref.truth0 is not None
            else [None] * len(jax.tree.leaves(ref.grads0))
        )
        r.grad_ratio = max(
            _ratio(g, w, bf16, case.bf16_reference, t)
            for g, w, t in zip(
                jax.tree.leaves(got.grads0), jax.tree.leaves(ref.grads0), truths, strict=True
            )
        )
    n = min(len(got.losses), len(ref.losses))
    r.traj_loss_err = float(np.max(np.abs(got.losses[:n] - ref.losses[:n])))
    r.traj_norm_err = float(
        np.max(np.abs(got.grad_norms[:n] - ref.grad_norms[:n]) / np.abs(ref.grad_norms[:n]))
    )
    r.traj_param_err = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(ref.params), strict=True)
    )
    return r


def _ratio(g, r, bf16: bool, same: bool = False, truth=None) -> float:
    g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
    if same:  # bf16 vs bf16 on one device, at the bf16 tolerances (chex's elementwise rule)
        band = tol.BF16_SAME_ATOL + tol.BF16_SAME_RTOL * np.abs(r)
        if truth is None:
            return float(np.max(np.abs(g - r) / band))
        # with the f32 twin: the strategy's error may not exceed the one-device bf16 run's own
        # error by more than the band, elementwise (two bf16 programs can err on opposite sides
        # of the true value; a strategy bug moves it away from both)
        t = np.asarray(truth, np.float64)
        return float(np.max((np.abs(g - t) - np.abs(r - t)).clip(0) / band))
    if bf16:
        band = tol.BF16_GRAD_RTOL * max(float(np.max(np.abs(r))), 1e-12)
        return float(np.max(np.abs(g - r)) / band)
    return float(np.max(np.abs(g - r) / (tol.ATOL + tol.RTOL * np.abs(r))))


def check(case: Case, ref: Trajectory, cfg: ModelConfig = CFG, tcfg: TrainConfig = TCFG) -> Result:
    """Run `case` against `ref` (the reference of the case's training variant, f32)."""
    cfg, tcfg = case.configs(cfg, tcfg)
    have = jax.device_count()
    if case.n_devices > have:
        return Result(
            case,
            case.label,
            error=f"needs {case.n_devices} devices, this process has {have} "
            f"(JAX_NUM_CPU_DEVICES={case.n_devices})",
        )
    try:
        devices = jax.devices()[: case.n_devices]
        built = build(case.strategy, cfg, tcfg, with_grads=True, devices=devices)
    except ValueError as e:  # a layout that cannot be built on this mesh
        return Result(case, case.label, error=str(e).splitlines()[0])
    return compare(case, run_built(built, tcfg, initial=ref.initial), ref, case.label)


def reference_for(
    case: Case, cache: dict, cfg: ModelConfig = CFG, tcfg: TrainConfig = TCFG
) -> Trajectory:
    """The single-device reference of the case's training variant (f32, or the case's own dtype
    with `bf16_reference`), computed once."""
    f32_case = dataclasses.replace(case, compute_dtype="float32")
    ref_case = case if case.bf16_reference else f32_case
    f32_cfg, f32_tcfg = f32_case.configs(cfg, tcfg)
    cfg, tcfg = ref_case.configs(cfg, tcfg)
    for key in {(f32_cfg, f32_tcfg), (cfg, tcfg)}:
        if key not in cache and (key == (cfg, tcfg) or case.bf16_reference):
            cache[key] = reference(*key)
    if not case.bf16_reference:
        return cache[cfg, tcfg]
    return dataclasses.replace(cache[cfg, tcfg], truth0=cache[f32_cfg, f32_tcfg].grads0)


def run_cases(
    cases, progress=None, cfg: ModelConfig = CFG, tcfg: TrainConfig = TCFG, on_result=None
):
    """Check every case; `on_result(result)` as each one finishes (a killed run keeps what it
    printed)."""
    refs: dict = {}
    out = []
    for case in cases:
        out.append(check(case, reference_for(case, refs, cfg, tcfg), cfg, tcfg))
        if on_result:
            on_result(out[-1])
        if progress:
            progress.update(1, note=f"{case.label} {case.mesh}")
    return out


def matrix_header() -> list[str]:
    head = (
        f"{'case':<40} {'mesh':<17} {'|dloss|':>9} {'grad/tol':>9} {'traj dloss':>10} "
        f"{'traj dnorm':>10} {'traj dparam':>11}  ok"
    )
    return [head, "-" * len(head)]


def matrix_row(r: Result) -> str:
    if r.error:
        return f"{r.label:<40} {r.case.mesh:<17} ✗ {r.error}"
    return (
        f"{r.label:<40} {r.case.mesh:<17} {r.loss_err:9.1e} {r.grad_ratio:9.2f} "
        f"{r.traj_loss_err:10.1e} {r.traj_norm_err:10.1e} {r.traj_param_err:11.1e}  "
        f"{'✓' if r.passed else '✗'}"
    )


def format_matrix(results: list[Result]) -> str:
    lines = [*matrix_header(), *(matrix_row(r) for r in results), *matrix_footer(results)]
    return "\n".join(lines)


def matrix_footer(results: list[Result]) -> list[str]:
    """The strategy x mesh grid and the tolerances the rows were judged by."""
    lines = _grid(results)
    lines += [
        "",
        f"f32: first-step loss and gradients pass at rtol {tol.RTOL:g}, atol "
        f"{tol.ATOL:g} (grad/tol <= 1); {TRAJ_STEPS}-step trajectory: losses and final "
        f"parameters within {tol.TRAJ_ATOL:g}, pre-clip gradient norms within "
        f"{tol.TRAJ_NORM_RTOL:g} relative.",
        f"bf16 compute vs the f32 reference: loss within {tol.BF16_LOSS_RTOL:.0%}, "
        f"gradients within {tol.BF16_GRAD_RTOL:.0%} of each leaf's largest entry, "
        f"trajectory {tol.BF16_TRAJ_ATOL:g}, gradient norms "
        f"{tol.BF16_NORM_RTOL:.0%}. 'vs bf16': against the bf16 model on one device, "
        f"rtol {tol.BF16_SAME_RTOL:g}, atol {tol.BF16_SAME_ATOL:g}: loss and trajectory "
        "directly, each gradient element no further from the f32 model's than the "
        "one-device bf16 run's plus that band (an MoE router's bf16 gradient is itself "
        "further from f32 than the f32 band).",
    ]
    return lines


def _grid(results: list[Result]) -> list[str]:
    shapes = {"(8,)": 1, "(2,4)": (2, 4), "(4,2)": (4, 2), "(2,2,2)": 3, "(2,2,2,2)": 4}
    rows: dict[str, dict[str, str]] = {}
    for r in results:
        sizes = tuple(int(p.split("=")[1]) for p in r.case.mesh.split(","))
        shape = "(8,)" if len(sizes) == 1 else str(sizes).replace(" ", "")
        rows.setdefault(r.label, {})[shape] = "✓" if r.passed else "✗"
    lines = ["", f"{'strategy':<40} " + " ".join(f"{s:>8}" for s in shapes)]
    for label, cells in rows.items():
        lines.append(f"{label:<40} " + " ".join(f"{cells.get(s, '·'):>8}" for s in shapes))
    return lines


def as_json(results: list[Result]) -> list[dict]:
    variant = ("compute_dtype", "grad_accum", "optimizer")
    checks = (
        "loss_err",
        "grad_ratio",
        "traj_loss_err",
        "traj_norm_err",
        "traj_param_err",
        "error",
        "loss_ok",
        "grads_ok",
        "traj_ok",
        "passed",
    )
    out = []
    for r in results:
        s = r.case.strategy
        out.append(
            {
                "label": r.label,
                "path": s.path,
                "strategy": s.label().split(":")[1],
                "mesh": str(s.mesh),
                "stage": s.zero,
                "tp_mode": s.tensor,
                "schedule": s.schedule,
                "microbatches": s.microbatches,
                "virtual_stages": s.virtual_stages,
                "n_layers": r.case.n_layers,
                "model": dict(r.case.model),
                **{k: getattr(r.case, k) for k in variant},
                **{k: getattr(r, k) for k in checks},
            }
        )
    return out
