"""`jaxscale bench scaling`: strong and weak scaling of one strategy over 1, 2, 4, 8 devices
(seed 004 §10), each point measured beside a prediction, with `calc scaling`'s efficiency
formulas (jaxscale/calc/scaling.py) applied to both.

Strong scaling keeps the global batch; weak scaling keeps the batch per device. Every point is a
row of `bench meshes` (jaxscale/bench/meshes.py) on the first N devices: compiled, its FLOPs and
collective bytes per device read from the program, and its short trajectory checked against a
single-device reference of the same batch, so a fast but wrong point cannot pass.

The prediction starts from the 1-device step time t_1 and the compiled programs:
- accelerators: Amdahl with the compiled work, calc.scaling.amdahl(compute, comm, N), where
  compute = t_1 x (FLOPs per device at N / FLOPs at 1) and comm = collective bytes per device /
  the device's link bandwidth (jaxscale/hardware.py), nothing overlapped: a lower bound on the
  efficiency a well-overlapped program beats;
- simulated CPU devices: they are threads of one process sharing the host's cores, so N of them
  do N devices' work on the same cores: t_N = t_1 x (total FLOPs at N / FLOPs at 1). Strong
  scaling then predicts efficiency about 1/N, which is what the measurement shows; the numbers
  are indicative of the harness, not of any interconnect.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from jaxscale.calc import scaling as calc_scaling
from jaxscale.cliutil import fail

MODES = ("strong", "weak")


@dataclass(frozen=True)
class Point:
    mode: str  # strong | weak
    devices: int
    global_batch: int
    step_ms: float  # median of the timed steps
    flops_per_device: float  # compiled (layers unrolled)
    comm_bytes_per_device: float  # every collective in the compiled step, normalised census
    equivalent: bool  # the trajectory matched the single-device reference
    predicted_ms: float = float("nan")
    comm_fraction: float = 0.0  # of the predicted time (accelerators; 0 on CPU)


def device_counts(n_available: int) -> list[int]:
    """1, 2, 4, ... up to the devices there are."""
    out, n = [], 1
    while n <= n_available:
        out.append(n)
        n *= 2
    return out


def single_axis_case(name: str, n_devices: int):
    """The bench's case for `name` (e.g. auto:fsdp, manual:zero3) whose mesh has one axis: the
    axis that scaling grows."""
    from jaxscale.bench import meshes

    cases = [c for c in meshes.resolve_cases([name], [], n_devices) if "," not in c.mesh]
    if not cases:
        raise ValueError(
            f"--strategy {name}: scaling grows one mesh axis; choose a strategy "
            "on a single-axis mesh (dp, fsdp, tp, zero1..3)"
        )
    return cases[0]


def _resized(case, n: int):
    from jaxscale import verify
    from jaxscale.parallel.compose import Strategy

    text = "auto" if case.label.startswith("auto") else case.label
    return verify.Case(Strategy.parse(text, f"{case.mesh.split('=')[0]}={n}"))


def measure(case, cfg, tcfg, counts: list[int], modes: list[str], steps: int, progress=None):
    """A measured Point per (mode, device count); predictions added by `predict`."""
    import jax

    from jaxscale.bench import meshes

    cfg = cfg.replace(unroll_layers=True)  # every layer's FLOPs in cost_analysis
    refs: dict[int, object] = {}  # reference trajectory per global batch
    points = []
    for mode in modes:
        for n in counts:
            batch = tcfg.global_batch if mode == "strong" else tcfg.global_batch * n
            t = tcfg.replace(global_batch=batch)
            if batch not in refs:
                refs[batch] = meshes.reference(cfg, t, steps + 1)[0]
            row_case = _resized(case, n)
            row = meshes.bench_case(row_case, cfg, t, steps, refs[batch], devices=jax.devices()[:n])
            if row.report is None:
                raise ValueError(f"{row_case.label} on {row_case.mesh}: {row.error}")
            comm = sum(v.total_bytes for v in row.report.collective_totals().values())
            points.append(
                Point(
                    mode, n, batch, row.step_ms_median, row.report.flops, comm, bool(row.equivalent)
                )
            )
            if progress:
                progress.update(1, note=f"{mode} {row_case.mesh}")
    return points


def predict(points: list[Point], link_bytes_per_s: float | None) -> list[Point]:
    """Each point with its predicted step time (module docstring); `link_bytes_per_s` None means
    simulated CPU devices."""
    out = []
    for mode in MODES:
        series = [p for p in points if p.mode == mode]
        if not series:
            continue
        one = series[0]
        if one.devices != 1:
            raise ValueError("a scaling series starts at 1 device (the baseline t_1)")
        for p in series:
            if link_bytes_per_s is None:
                total_work = p.flops_per_device * p.devices / one.flops_per_device
                out.append(_with(p, one.step_ms * total_work, 0.0))
                continue
            compute_s = one.step_ms / 1e3 * p.flops_per_device / one.flops_per_device
            a = calc_scaling.amdahl(
                compute_s, p.comm_bytes_per_device / link_bytes_per_s, p.devices
            )
            out.append(_with(p, a.total_s * 1e3, a.comm_fraction))
    return out


def _with(p: Point, predicted_ms: float, comm_fraction: float) -> Point:
    return Point(**{**asdict(p), "predicted_ms": predicted_ms, "comm_fraction": comm_fraction})


def efficiencies(points: list[Point]) -> dict[str, dict[str, list]]:
    """calc scaling's speedup and efficiency of the measured and the predicted series."""
    fn = {"strong": calc_scaling.strong_scaling, "weak": calc_scaling.weak_scaling}
    out = {}
    for mode in MODES:
        series = [p for p in points if p.mode == mode]
        if not series:
            continue
        n = [p.devices for p in series]
        meas = fn[mode](n, [p.step_ms for p in series])
        pred = fn[mode](n, [p.predicted_ms for p in series])
        out[mode] = {"devices": n, "measured": meas, "predicted": pred}
    return out


def table(points: list[Point], eff: dict) -> str:
    lines = [
        f"{'mode':<7}{'devices':>8}{'batch':>7}{'step ms':>10}{'pred ms':>10}"
        f"{'speedup':>9}{'eff meas':>10}{'eff pred':>10}{'GFLOP/dev':>11}"
        f"{'comm KiB/dev':>14}{'eq':>4}"
    ]
    for mode, e in eff.items():
        series = [p for p in points if p.mode == mode]
        for p, m, q in zip(series, e["measured"], e["predicted"], strict=True):
            lines.append(
                f"{mode:<7}{p.devices:>8}{p.global_batch:>7}{p.step_ms:>10.1f}"
                f"{p.predicted_ms:>10.1f}{m.speedup:>8.2f}x{m.efficiency:>10.1%}"
                f"{q.efficiency:>10.1%}{p.flops_per_device / 1e9:>11.3f}"
                f"{p.comm_bytes_per_device / 1024:>14.1f}{'✓' if p.equivalent else '✗':>4}"
            )
    return "\n".join(lines)


def plot(eff: dict, path: str | Path, title: str) -> Path:
    from jaxscale.render import figure

    with figure(path, 1, len(eff), figsize=(5.5 * len(eff), 4.2), dpi=110) as (fig, axes):
        axes = axes if len(eff) > 1 else [axes]
        for ax, (mode, e) in zip(axes, eff.items(), strict=True):
            n = e["devices"]
            ax.plot(n, [p.efficiency * 100 for p in e["measured"]], "o-", label="measured")
            ax.plot(n, [p.efficiency * 100 for p in e["predicted"]], "s--", label="predicted")
            ax.axhline(100, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks(n, [str(x) for x in n])
            ax.set_ylim(0, 110)
            ax.set_xlabel("devices")
            ax.set_ylabel("efficiency %")
            ax.set_title(f"{mode} scaling")
            ax.legend(fontsize=8)
        fig.suptitle(title, fontsize=10)
    return Path(path)


def main(args) -> int:
    import jax

    from jaxscale.bench import report
    from jaxscale.config import MODEL_PRESETS, TrainConfig
    from jaxscale.hardware import for_device_kind
    from jaxscale.progress import Progress

    name = (args.strategies or "auto:dp").split(",")[0].strip()
    try:
        cfg = MODEL_PRESETS[args.model]
        if args.seq_len > cfg.max_seq:
            raise ValueError(f"--seq-len {args.seq_len} exceeds the model's max_seq {cfg.max_seq}")
        counts = args.devices or device_counts(jax.device_count())
        if counts[0] != 1 or any(n > jax.device_count() for n in counts):
            raise ValueError(
                f"--devices {counts}: start at 1 and stay within the "
                f"{jax.device_count()} devices there are"
            )
        modes = [m for m in MODES if args.mode in (m, "both")]
        case = single_axis_case(name, max(counts))
        tcfg = TrainConfig(
            global_batch=args.global_batch, seq_len=args.seq_len, steps=100, warmup_steps=0, lr=1e-3
        )
        for n in counts:  # the batch must split over every device count, before compiling
            if args.global_batch % n and "strong" in modes:
                raise ValueError(
                    f"--global-batch {args.global_batch} does not split over {n} "
                    "devices (strong scaling keeps it fixed)"
                )
    except ValueError as e:
        return fail("bench scaling", e)
    env = report.environment()
    backend = jax.default_backend()
    label = "indicative: simulated CPU devices" if backend == "cpu" else f"real: {backend}"
    print(
        f"bench scaling: {case.label} over {case.mesh.split('=')[0]} = {counts}, model "
        f"{args.model}, batch {args.global_batch} (strong: global; weak: per device) x seq "
        f"{args.seq_len}, {env['device_kind']} ({label})",
        file=sys.stderr,
    )
    if args.dry_run:
        print("\n".join(f"{m:<7}{n:>3} devices" for m in modes for n in counts))
        return 0
    bar = Progress(len(modes) * len(counts), desc="scaling", eta=False)
    points = measure(case, cfg, tcfg, counts, modes, args.steps, progress=bar)
    bar.close()
    device = for_device_kind(env["device_kind"]) if backend != "cpu" else None
    link = device.link_bytes_per_s if device is not None else None
    if backend != "cpu" and link is None:
        print(
            "no link bandwidth for this device in jaxscale/hardware.py: communication is "
            "left out of the prediction",
            file=sys.stderr,
        )
        link = float("inf")
    points = predict(points, None if backend == "cpu" else link)
    eff = efficiencies(points)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "env": env,
        "strategy": case.label,
        "model": args.model,
        "label": label,
        "points": [asdict(p) for p in points],
        "efficiency": {
            m: {
                "measured": [p.efficiency for p in e["measured"]],
                "predicted": [p.efficiency for p in e["predicted"]],
            }
            for m, e in eff.items()
        },
    }
    (out / "bench_scaling.json").write_text(json.dumps(data, indent=1))
    paths = [out / "bench_scaling.json"]
    if not args.no_plot:
        title = f"{case.label}, model {args.model} ({label})"
        paths.append(plot(eff, args.plot or out / "bench_scaling.png", title))
    if args.json:
        print(json.dumps(data))
    else:
        print(table(points, eff))
        if backend == "cpu":
            print(
                "* simulated CPU devices share the host's cores: the prediction is the same "
                "work on the same cores (efficiency ~1/N for strong scaling). Run on GPUs or "
                "TPUs for real scaling."
            )
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if all(p.equivalent for p in points) else 1
