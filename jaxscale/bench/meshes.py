"""`make bench`: every strategy x mesh compiled, measured, predicted and checked.

Per row: compile seconds; per-device params / gradients / Adam state from the strategy's layout
vs predicted (the ZeRO calculator); argument bytes from memory_analysis vs the prediction; FLOPs
per device from cost_analysis beside the analytic count; collective bytes per op from the census
vs the axis modules' predictions; a short trajectory with real updates compared with the
single-device reference by verify's harness (losses, pre-clip gradient norms, final parameters);
and a median step time -- indicative only on simulated CPU devices, which share the host's cores.

With `target` set to a TPU topology the same programs are compiled for abstract TPU devices
(libtpu) and nothing runs: no step time, no equivalence, but the TPU compiler's memory,
collectives and its own time estimate.

The layer loop is unrolled so cost_analysis and the census count every layer.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import jax

from jaxscale import verify
from jaxscale.analysis.compiled import CompiledReport, compile_with_report
from jaxscale.bench import predict
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import parse_mesh
from jaxscale.model import counts
from jaxscale.parallel.compose import Strategy, build, check
from jaxscale.tolerances import MEMORY_RTOL

DEFAULT_TIMED = 2  # timed steps per row: the checked trajectory's steps after its first


@dataclass
class BenchRow:
    case: verify.Case
    devices: int
    report: CompiledReport | None  # None when the strategy could not be built (see error)
    label: str = ""
    flops_analytic_per_device: float = 0.0
    state_layout: predict.StateBytes | None = None
    state_predicted: predict.StateBytes | None = None
    args_predicted: float = 0.0
    comm_predicted: dict | None = None
    comm_why_not: str | None = None
    result: verify.Result | None = None  # None: nothing was run (AOT target)
    step_ms: list[float] = field(default_factory=list)
    error: str | None = None
    args_padded: float | None = None  # TPU: argument bytes after padding to memory tiles
    args_logical: float = 0.0  # TPU: the same before padding
    timing: dict | None = None  # `--time`: trace.summary of its profiled steps (timing.py)

    @property
    def equivalent(self) -> bool | None:
        if self.error is not None:
            return False
        return None if self.result is None else self.result.passed

    @property
    def args_measured(self) -> float:
        """Argument bytes per device; on TPU the logical (unpadded) bytes of the shards."""
        if self.args_padded is not None:
            return self.args_logical
        return self.report.memory.argument

    @property
    def memory_ok(self) -> bool:
        m, p = self.state_layout, self.state_predicted
        pairs = [
            (m.params, p.params),
            (m.grads, p.grads),
            (m.optimizer, p.optimizer),
            (self.args_measured, self.args_predicted),
        ]
        return all(abs(a - b) <= MEMORY_RTOL * b for a, b in pairs)

    @property
    def comm(self) -> dict[str, tuple]:
        measured = {op: t.total_bytes for op, t in self.report.collective_totals().items()}
        return predict.compare_comm(measured, self.comm_predicted or {})

    @property
    def comm_ok(self) -> bool | None:
        return None if self.comm_predicted is None else all(ok for *_, ok in self.comm.values())

    @property
    def step_ms_median(self) -> float:
        return statistics.median(self.step_ms) if self.step_ms else float("nan")


DEFAULT_CASES = verify.bench_cases("meshes")  # the dense model's rows


def resolve_cases(names: list[str], extra_meshes: list[str], n_devices: int) -> list[verify.Case]:
    """Cases by label ('auto:dp', 'manual:zero3', or a bare strategy name = every path that has
    it): the bench's rows first, else every f32 case of verify's list; plus auto-path cases on
    custom meshes."""
    plain = [c for c in verify.CASES if c.label == c.strategy.label()]  # f32, no accum, AdamW
    out = []
    for name in names:

        def hit(c, name=name):
            return name in (c.label, c.label.split(":")[1])

        hits = [c for c in DEFAULT_CASES if hit(c)] or [c for c in plain if hit(c)]
        if not hits:
            known = ", ".join(sorted({c.label for c in plain}))
            raise ValueError(f"--strategies: unknown strategy {name!r}; known: {known}")
        out.extend(hits)
    for spec in extra_meshes:
        out.append(verify.Case(Strategy(_mesh(spec, n_devices))))
    return out


def cross_cases(names: list[str], meshes: list[str], n_devices: int) -> list[verify.Case]:
    """Every strategy ('auto' or 'manual:...') on every mesh."""
    out = []
    for name in names:
        if name != "auto" and not name.startswith(("auto:", "manual:")):
            raise ValueError(f"--strategies {name!r}: with --meshes, give 'auto' or 'manual:...'")
        text = "auto" if name.startswith("auto") else name
        for spec in meshes:
            mesh = _mesh(spec, n_devices)
            out.append(verify.Case(Strategy.parse(text, mesh)))
    return out


def _mesh(spec: str, n_devices: int) -> str:
    try:  # resolved here so a bad spec is a named error before anything compiles
        return str(parse_mesh(spec).resolve(n_devices))
    except ValueError as e:
        raise ValueError(f"--meshes {spec}: {e}") from None


def check_cases(cases: list[verify.Case], tcfg: TrainConfig, n_devices: int) -> None:
    """What the flags got wrong (a mesh, an unused axis, a batch that does not divide), before
    anything compiles. A layout the model cannot take (heads over tensor) stays a skipped row."""
    for case in cases:
        check(case.strategy, tcfg, n_devices)


def bench_case(
    case: verify.Case,
    cfg: ModelConfig,
    tcfg: TrainConfig,
    timed_steps: int,
    reference,
    devices=None,
    target=None,
    execute=True,
    time_steps: int = 0,
    profile: str | None = None,
) -> BenchRow:
    n_dev = len(devices) if devices is not None else jax.device_count()
    runs = target is None and execute
    if runs and len(reference.losses) != timed_steps + 1:  # final parameters compared
        raise ValueError(
            f"reference has {len(reference.losses)} steps; the row runs "
            f"{timed_steps + 1} ({timed_steps} timed + 1)"
        )
    try:
        built = build(case.strategy, cfg, tcfg, devices=devices)
        comm, why = built.predict_comm(cfg, tcfg.global_batch, tcfg.seq_len)
    except ValueError as e:  # e.g. heads that do not divide over this tensor degree
        return BenchRow(case, n_dev, None, case.label, error=str(e).splitlines()[0])
    args = built.abstract_args(tcfg.global_batch, tcfg.seq_len)
    if target is not None:
        from jaxscale.analysis import aot

        compiled, report = aot.compile_for_target(target, built.step, *args)
        entry = aot.entry_argument_bytes(compiled)
    else:
        with jax.set_mesh(built.mesh):
            compiled, report = compile_with_report(built.step, *args)
    state_pred = predict.predicted_state(built, cfg)
    flops = counts.train_step_flops(cfg, tcfg.global_batch, tcfg.seq_len) / n_dev
    row = BenchRow(
        case,
        n_dev,
        report,
        built.label,
        flops_analytic_per_device=flops,
        state_layout=predict.layout_state(built),
        state_predicted=state_pred,
        args_predicted=state_pred.params
        + state_pred.optimizer
        + predict.batch_bytes(built, tcfg.global_batch, tcfg.seq_len),
        comm_predicted=comm,
        comm_why_not=why,
    )
    if target is not None:
        row.args_padded, row.args_logical = entry.padded, entry.logical
        row.comm_predicted = None  # the schedule is the TPU compiler's; see the comparison table
        row.comm_why_not = (
            "TPU compiler: weights gathered in bf16 (default matmul precision), "
            "re-gathered for the backward; see the CPU vs TPU table"
        )
    if runs:
        # the trajectory checked against the reference (real updates) is also what is timed:
        # all but its first step, which pays the transfers
        # from the reference's initial state placed in this layout: no init to compile
        got = verify.run_built(
            built, tcfg, timed_steps + 1, step=compiled, initial=reference.initial
        )
        row.result = verify.compare(case, got, reference, built.label)
        row.step_ms = list(got.step_ms[1:])
        if time_steps:
            from jaxscale.bench import timing

            keep = timing.trace_dir(profile, built.label, case.mesh) if profile else None
            row.timing = timing.measure_row(
                built, compiled, tcfg, reference.initial, time_steps, keep
            )
    return row


def reference(
    cfg: ModelConfig,
    tcfg: TrainConfig,
    steps: int = DEFAULT_TIMED + 1,
) -> tuple[verify.Trajectory, float]:
    """The single-device reference trajectory, and its median step ms after the first step."""
    traj = verify.reference(cfg, tcfg, steps, with_grads=False)
    return traj, statistics.median(traj.step_ms[1:]) if steps > 1 else float("nan")


def run_bench(
    cfg: ModelConfig,
    tcfg: TrainConfig,
    cases: list[verify.Case],
    timed_steps: int = DEFAULT_TIMED,
    progress=None,
    target=None,
    time_steps: int = 0,
    profile: str | None = None,
) -> tuple[list[BenchRow], float | None]:
    """Rows for `cases`, and the reference's step ms (None for an AOT target)."""
    cfg = cfg.replace(unroll_layers=True)
    devices, ref, ref_ms = None, None, None
    if target is not None:
        from jaxscale.analysis import aot

        devices = aot.target_devices(target)
    else:
        ref, ref_ms = reference(cfg, tcfg, timed_steps + 1)
        if progress:
            progress.update(1, note="reference")
    rows = []
    for case in cases:
        rows.append(
            bench_case(
                case,
                cfg,
                tcfg,
                timed_steps,
                ref,
                devices,
                target,
                time_steps=time_steps,
                profile=profile,
            )
        )
        if progress:
            progress.update(1, note=f"{case.label} {case.mesh}")
    return rows, ref_ms


def remat_report(cfg: ModelConfig, tcfg: TrainConfig) -> dict:
    """Temporaries of the single-device step with and without per-block remat, against seed
    004's sqrt(L) estimate (checkpoint every sqrt(L) layers: activations x sqrt(L)/L); every
    policy side by side is `bench remat`."""
    from jaxscale.bench.remat import temporaries
    from jaxscale.calc.memory import activation_bytes_simple

    temps = {policy: temporaries(cfg, tcfg, policy) for policy in ("none", "block")}
    L = cfg.n_layers
    seed = [
        activation_bytes_simple(tcfg.global_batch, tcfg.seq_len, cfg.d_model, L, checkpointing=ck)
        for ck in (False, True)
    ]
    return {
        "n_layers": L,
        "temp_no_remat": temps["none"],
        "temp_remat": temps["block"],
        "measured_ratio": temps["block"] / temps["none"],
        "seed004_sqrtL_ratio": seed[1] / seed[0],
    }
