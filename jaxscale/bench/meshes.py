"""`make bench`: every strategy x mesh compiled, measured, predicted and checked.

Per row: compile seconds; per-device params / gradients / Adam state measured (the real layout)
vs predicted (the ZeRO calculator); argument bytes from memory_analysis vs the prediction; FLOPs
per device from cost_analysis beside the analytic count; collective bytes per op from the census
vs calc/step_comm; a short trajectory compared with the single-device reference; and a median
step time -- indicative only on simulated CPU devices, which share the host's cores.

With `target` set to a TPU topology the same programs are compiled for abstract TPU devices
(libtpu) and nothing runs: no step time, no equivalence, but the TPU compiler's memory,
collectives and its own time estimate.

The layer loop is unrolled so cost_analysis and the census count every layer.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import jax
import numpy as np

from jaxscale import strategies
from jaxscale.analysis.compiled import CompiledReport, compile_with_report
from jaxscale.bench import predict
from jaxscale.calc import step_comm
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import parse_mesh
from jaxscale.model import counts
from jaxscale.strategies import Case
from jaxscale.train import data
from jaxscale.train import step as train_step

TRAJ_STEPS = 2  # steps compared with the reference before timing
TRAJ_ATOL = 1e-4  # loss trajectory tolerance (DESIGN §5, f32)

DEFAULT_CASES = (
    Case("auto", "dp", "dp=8"), Case("auto", "fsdp", "fsdp=8"), Case("auto", "tp", "tp=8"),
    Case("auto", "dp_tp", "dp=2,tp=4"), Case("auto", "fsdp_tp", "fsdp=4,tp=2"),
    Case("auto", "dp_fsdp_tp", "dp=2,fsdp=2,tp=2"),
    Case("manual", "dp", "dp=8"), Case("manual", "zero1", "dp=8", 1),
    Case("manual", "zero2", "dp=8", 2), Case("manual", "zero3", "fsdp=8", 3),
    Case("manual", "tp", "tp=8", 0, "megatron"), Case("manual", "tp_sp", "tp=8", 0, "sequence"),
    Case("manual", "zero3+tp", "fsdp=4,tp=2", 3, "megatron"),
)  # fmt: skip


@dataclass
class BenchRow:
    case: Case
    devices: int
    report: CompiledReport | None  # None when the strategy could not be built (see error)
    flops_analytic_per_device: float = 0.0
    state_measured: predict.StateBytes | None = None
    state_predicted: predict.StateBytes | None = None
    args_predicted: float = 0.0
    comm_predicted: dict | None = None
    comm_why_not: str | None = None
    losses: list[float] = field(default_factory=list)
    max_loss_diff: float | None = None  # None: nothing was run (AOT target)
    step_ms: list[float] = field(default_factory=list)
    error: str | None = None
    args_padded: float | None = None  # TPU: argument bytes after padding to memory tiles
    args_logical: float = 0.0  # TPU: the same before padding

    @property
    def equivalent(self) -> bool | None:
        if self.error is not None:
            return False
        return None if self.max_loss_diff is None else self.max_loss_diff <= TRAJ_ATOL

    @property
    def args_measured(self) -> float:
        """Argument bytes per device; on TPU the logical (unpadded) bytes of the shards."""
        if self.args_padded is not None:
            return self.args_logical
        return self.report.memory.argument

    @property
    def memory_ok(self) -> bool:
        m, p = self.state_measured, self.state_predicted
        pairs = [(m.params, p.params), (m.grads, p.grads), (m.optimizer, p.optimizer),
                 (self.args_measured, self.args_predicted)]  # fmt: skip
        return all(abs(a - b) <= predict.MEMORY_RTOL * b for a, b in pairs)

    @property
    def comm(self) -> dict[str, tuple]:
        measured = {op: t.total_bytes for op, t in self.report.collective_totals().items()}
        return step_comm.compare(measured, self.comm_predicted or {}, predict.COMM_RTOL)

    @property
    def comm_ok(self) -> bool | None:
        return None if self.comm_predicted is None else all(ok for *_, ok in self.comm.values())

    @property
    def step_ms_median(self) -> float:
        return statistics.median(self.step_ms) if self.step_ms else float("nan")


def resolve_cases(names: list[str], extra_meshes: list[str], n_devices: int) -> list[Case]:
    """Cases by label ('auto:dp', 'manual:zero3', or a bare strategy name = every path that has
    it), plus auto-path cases on custom meshes."""
    out = []
    for name in names:
        hits = [c for c in DEFAULT_CASES if name in (c.label, c.strategy)]
        if not hits:
            known = ", ".join(sorted({c.label for c in DEFAULT_CASES}))
            raise ValueError(f"unknown strategy {name!r}; known: {known}")
        out.extend(hits)
    for spec in extra_meshes:
        # resolved here so a bad spec is a named error before anything compiles
        out.append(Case("auto", "custom", str(parse_mesh(spec).resolve(n_devices))))
    return out


def bench_case(case: Case, cfg: ModelConfig, tcfg: TrainConfig, timed_steps: int,
               reference_losses, devices=None, target=None, execute=True) -> BenchRow:  # fmt: skip
    n_dev = len(devices) if devices is not None else jax.device_count()
    try:
        built = strategies.build(case, cfg, tcfg, devices=devices)
        predicted_comm, why = predict.predicted_collectives(built, cfg, tcfg.global_batch,
                                                            tcfg.seq_len)  # fmt: skip
    except ValueError as e:  # e.g. heads that do not divide over this tensor degree
        return BenchRow(case, n_dev, None, error=str(e).splitlines()[0])
    args = built.abstract_args(tcfg.global_batch, tcfg.seq_len)
    if target is not None:
        from jaxscale.analysis import aot

        compiled, report = aot.compile_for_target(target, built.step, *args)
        entry = aot.entry_argument_bytes(compiled)
    else:
        with jax.set_mesh(built.mesh):
            compiled, report = compile_with_report(built.step, *args)
    state_pred = predict.predicted_state(built, cfg)
    batch_bytes = tcfg.global_batch * (tcfg.seq_len + 1) * 4 / built.group_sizes[0]
    row = BenchRow(
        case, n_dev, report,
        flops_analytic_per_device=counts.train_step_flops(cfg, tcfg.global_batch, tcfg.seq_len)
        / n_dev,
        state_measured=predict.measured_state(built),
        state_predicted=state_pred,
        args_predicted=state_pred.params + state_pred.optimizer + batch_bytes,
        comm_predicted=predicted_comm, comm_why_not=why,
    )  # fmt: skip
    if target is not None:
        row.args_padded, row.args_logical = entry.padded, entry.logical
        row.comm_predicted = None  # the schedule is the TPU compiler's; see the comparison table
        row.comm_why_not = ("TPU compiler: weights gathered in bf16 (default matmul precision), "
                            "re-gathered for the backward; see the CPU vs TPU table")  # fmt: skip
    if target is None and execute:
        _run(row, built, compiled, tcfg, timed_steps, reference_losses)
    return row


def _run(row: BenchRow, built, compiled, tcfg, timed_steps: int, reference_losses) -> None:
    dataset = data.MarkovData()
    with jax.set_mesh(built.mesh):
        state = built.init()
        for s in range(TRAJ_STEPS + timed_steps):
            batch = built.put(dataset.rows(tcfg.seed, s, range(tcfg.global_batch), tcfg.seq_len))
            t0 = time.perf_counter()
            state, metrics = compiled(state, batch)
            loss = float(jax.block_until_ready(metrics["loss"]))
            if s < TRAJ_STEPS:
                row.losses.append(loss)
            else:
                row.step_ms.append(1e3 * (time.perf_counter() - t0))
    row.max_loss_diff = float(np.max(np.abs(np.subtract(row.losses, reference_losses))))


def reference_losses(cfg: ModelConfig, tcfg: TrainConfig) -> tuple[list[float], float]:
    """The single-device reference trajectory, and its median step ms (run, not compiled for)."""
    dataset = data.MarkovData()
    state = train_step.init_state(cfg, tcfg)
    step = train_step.jit_train_step(cfg, tcfg)
    losses, times = [], []
    for s in range(TRAJ_STEPS + 1):
        batch = dataset.rows(tcfg.seed, s, range(tcfg.global_batch), tcfg.seq_len)
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        losses.append(float(jax.block_until_ready(metrics["loss"])))
        times.append(1e3 * (time.perf_counter() - t0))
    return losses[:TRAJ_STEPS], times[-1]


def run_bench(cfg: ModelConfig, tcfg: TrainConfig, cases: list[Case], timed_steps: int = 3,
              progress=None, target=None) -> tuple[list[BenchRow], float | None]:  # fmt: skip
    """Rows for `cases`, and the reference's step ms (None for an AOT target)."""
    cfg = cfg.replace(unroll_layers=True)
    devices, ref, ref_ms = None, None, None
    if target is not None:
        from jaxscale.analysis import aot

        devices = aot.target_devices(target)
    else:
        ref, ref_ms = reference_losses(cfg, tcfg)
        if progress:
            progress.update(1, note="reference")
    rows = []
    for case in cases:
        rows.append(bench_case(case, cfg, tcfg, timed_steps, ref, devices, target))
        if progress:
            progress.update(1, note=f"{case.label} {case.mesh}")
    return rows, ref_ms


def remat_report(cfg: ModelConfig, tcfg: TrainConfig) -> dict:
    """Temporaries of the single-device step with and without per-block remat, against seed
    004's sqrt(L) estimate (checkpoint every sqrt(L) layers: activations x sqrt(L)/L)."""
    from jaxscale.calc.memory import activation_bytes_simple

    args = (jax.eval_shape(lambda: train_step.init_state(cfg, tcfg)),
            jax.ShapeDtypeStruct((tcfg.global_batch, tcfg.seq_len + 1), np.int32))  # fmt: skip
    temps = {}
    for remat in (False, True):
        c = cfg.replace(remat=remat)
        _, report = compile_with_report(train_step.jit_train_step(c, tcfg), *args)
        temps[remat] = report.memory.temp
    L = cfg.n_layers
    seed = [activation_bytes_simple(tcfg.global_batch, tcfg.seq_len, cfg.d_model, L,
                                    checkpointing=ck) for ck in (False, True)]  # fmt: skip
    return {
        "n_layers": L,
        "temp_no_remat": temps[False],
        "temp_remat": temps[True],
        "measured_ratio": temps[True] / temps[False],
        "seed004_sqrtL_ratio": seed[1] / seed[0],
    }
