"""`make bench`: every strategy x mesh compiled, measured and checked against the reference.

Per row: compile seconds; per-device memory from memory_analysis; FLOPs per device from
cost_analysis beside the analytic count; the collectives the compiler inserted (normalised census);
a short training trajectory compared with the single-device reference (equivalence check); and a
median step time -- indicative only on simulated CPU devices, which share the host's cores.

The layer loop is unrolled for the bench so cost_analysis and the census count every layer (a
loop body is counted once).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import jax
import numpy as np

from jaxscale.analysis.compiled import CompiledReport, compile_with_report
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import build_mesh, parse_mesh
from jaxscale.model import counts
from jaxscale.sharding import STRATEGY_MESHES, Sharder
from jaxscale.train import data
from jaxscale.train import step as train_step

TRAJ_STEPS = 3  # steps compared with the reference before timing
TRAJ_ATOL = 1e-4  # loss trajectory tolerance (DESIGN §5, f32)


@dataclass
class BenchRow:
    strategy: str
    mesh: str
    devices: int
    report: CompiledReport | None  # None when the strategy could not be built (see error)
    flops_analytic_per_device: float
    losses: list[float]
    max_loss_diff: float = 0.0  # vs the reference trajectory
    step_ms: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def equivalent(self) -> bool:
        return self.error is None and self.max_loss_diff <= TRAJ_ATOL

    @property
    def step_ms_median(self) -> float:
        return statistics.median(self.step_ms) if self.step_ms else float("nan")


def resolve_strategies(names: list[str], extra_meshes: list[str]) -> list[tuple[str, str]]:
    """[(strategy label, mesh spec)]: named strategies from the rules table plus custom meshes."""
    out = []
    for name in names:
        if name not in STRATEGY_MESHES:
            raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGY_MESHES)}")
        out.append((name, STRATEGY_MESHES[name]))
    for spec in extra_meshes:
        parsed = parse_mesh(spec)  # raises a named error for a bad spec
        out.append(("custom", str(parsed)))
    return out


def _abstract(tree, shardings=None):
    if shardings is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def bench_one(label: str, spec_text: str, cfg: ModelConfig, tcfg: TrainConfig, timed_steps: int,
              reference_losses: list[float] | None) -> BenchRow:  # fmt: skip
    dataset = data.MarkovData()
    abstract_state = jax.eval_shape(lambda: train_step.init_state(cfg, tcfg))
    batch_shape = jax.ShapeDtypeStruct((tcfg.global_batch, tcfg.seq_len + 1), np.int32)
    if label == "reference":
        devices = [jax.devices()[0]]
        spec, sharder = parse_mesh("dp=1").resolve(1), None
    else:
        spec = parse_mesh(spec_text).resolve(jax.device_count())
        sharder = Sharder(build_mesh(spec))
        devices = list(sharder.mesh.devices.flat)
    analytic = counts.train_step_flops(cfg, tcfg.global_batch, tcfg.seq_len) / len(devices)
    ctx = jax.set_mesh(sharder.mesh) if sharder else contextlib.nullcontext()
    with ctx:
        step_fn = train_step.jit_train_step(cfg, tcfg, sharder)
        if sharder is None:
            args = (_abstract(abstract_state), batch_shape)
            put = lambda b: jax.device_put(b, devices[0])  # noqa: E731
        else:
            state_sh = train_step.state_shardings(cfg, tcfg, sharder)
            batch_sh = train_step.batch_sharding(sharder)
            args = (_abstract(abstract_state, state_sh), batch_shape.update(sharding=batch_sh))
            put = lambda b: jax.device_put(b, batch_sh)  # noqa: E731
        compiled, report = compile_with_report(step_fn, *args)
        row = BenchRow(label, str(spec), len(devices), report, analytic, losses=[])
        state = train_step.init_state(cfg, tcfg, sharder)
        if sharder is None:
            state = jax.device_put(state, devices[0])
        for s in range(TRAJ_STEPS + timed_steps):
            batch = put(dataset.rows(tcfg.seed, s, range(tcfg.global_batch), tcfg.seq_len))
            t0 = time.perf_counter()
            state, metrics = compiled(state, batch)
            loss = float(jax.block_until_ready(metrics["loss"]))
            if s < TRAJ_STEPS:
                row.losses.append(loss)
            else:
                row.step_ms.append(1e3 * (time.perf_counter() - t0))
    if reference_losses is not None:
        row.max_loss_diff = float(np.max(np.abs(np.subtract(row.losses, reference_losses))))
    return row


def run_bench(cfg: ModelConfig, tcfg: TrainConfig, strategies: list[tuple[str, str]],
              timed_steps: int = 5, progress=None) -> list[BenchRow]:  # fmt: skip
    """The reference runs first; every other row is compared with its loss trajectory."""
    cfg = cfg.replace(unroll_layers=True)
    rows: list[BenchRow] = []
    ref = bench_one("reference", "dp=1", cfg, tcfg, timed_steps, None)
    if progress:
        progress.update(1, note="reference")
    for label, spec in strategies:
        if label == "reference":
            rows.append(ref)
            continue
        try:
            rows.append(bench_one(label, spec, cfg, tcfg, timed_steps, ref.losses))
        except ValueError as e:  # e.g. heads that do not divide over this tensor degree
            rows.append(BenchRow(label, spec, 0, None, 0.0, [], error=str(e)))
        if progress:
            progress.update(1, note=f"{label} {spec}")
    return rows if any(r.strategy == "reference" for r in rows) else [ref, *rows]
