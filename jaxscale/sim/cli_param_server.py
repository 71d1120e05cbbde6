"""`jaxscale simulate param-server`: sync vs stale asynchronous updates (seed 004 §9)."""

import argparse
import math
from dataclasses import asdict

from jaxscale.calc.training_format import (
    add_output_flags,
    emit,
    format_table,
    non_negative_float,
    positive_float,
    positive_int,
)
from jaxscale.sim import param_server as ps
from jaxscale.sim.cli import guarded

CONVERGED_RATIO = 1e-8  # "converged": the gap fell below this fraction of the initial gap
DEFAULT_SWEEP = (0, 1, 2, 3, 5, 7)


def _staleness_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"need non-negative integers, got {text!r}")
    return values


def add_command(sim_sub) -> None:
    p = sim_sub.add_parser(
        "param-server",
        help="asynchronous parameter server with stale gradients vs synchronous updates",
        description="Seed 004 §9's parameter server as an event simulation on a least-squares "
        "problem: workers pull, compute, push; the server applies each push at once, so "
        "gradients are stale by the updates applied in between.",
    )
    d = ps.ParamServerConfig()
    p.add_argument("--workers", type=positive_int, default=d.workers, help="W")
    p.add_argument("--lr", type=positive_float, default=d.lr, help="step size x lambda_max")
    p.add_argument("--updates", type=positive_int, default=d.updates, help="server updates")
    p.add_argument(
        "--batch-size", type=int, default=d.batch_size, help="rows per gradient (0 = all rows)"
    )
    p.add_argument("--samples", type=positive_int, default=d.samples)
    p.add_argument("--dim", type=positive_int, default=d.dim)
    p.add_argument("--noise", type=non_negative_float, default=d.noise)
    p.add_argument(
        "--jitter",
        type=non_negative_float,
        default=d.jitter,
        help="worker compute time ~ U(1-j, 1+j)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--staleness-sweep",
        type=_staleness_list,
        default=list(DEFAULT_SWEEP),
        metavar="TAUS",
        help="comma-separated staleness values",
    )
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run))


def _status(run: ps.RunResult) -> str:
    if run.diverged:
        return "diverged"
    return "converged" if run.final_gap <= CONVERGED_RATIO * run.gaps[0] else "not yet"


def _finite(x: float) -> float | None:
    """JSON has no inf/nan: a gap that overflowed is reported as null."""
    return x if math.isfinite(x) else None


def _fmt_gap(x: float | None) -> str:
    return "overflow" if x is None else f"{x:.2e}"


def _summary(run: ps.RunResult) -> dict:
    return {
        "updates": len(run.times),
        "gradients": run.gradients,
        "sim_time": run.times[-1] if run.times else 0.0,
        "mean_staleness": sum(run.staleness) / max(len(run.staleness), 1),
        "max_staleness": max(run.staleness, default=0),
        "final_gap": _finite(run.final_gap),
        "status": _status(run),
        "gaps": [_finite(g) for g in run.gaps],
    }


def run(args) -> int:
    cfg = ps.ParamServerConfig(
        args.workers,
        args.lr,
        args.updates,
        args.batch_size,
        args.samples,
        args.dim,
        args.noise,
        args.jitter,
        args.seed,
    )
    problem = ps.make_problem(cfg)
    eig = problem.hessian_eigenvalues()
    runs = {"sync": ps.run_sync(cfg, problem), "async": ps.run_async(cfg, problem)}
    sweep = []
    for tau in args.staleness_sweep:
        r = ps.run_delayed(problem, cfg.lr, tau, cfg.updates)
        sweep.append(
            {
                "staleness": tau,
                "critical_lr": ps.critical_lr(tau),
                "predicted_rate": ps.delayed_rate(cfg.lr, tau, eig),
                "final_gap": _finite(r.final_gap),
                "status": _status(r),
                "run": r,
            }
        )
    summaries = {name: _summary(r) for name, r in runs.items()}
    batch = "all rows" if cfg.batch_size in (0, cfg.samples) else f"{cfg.batch_size} random rows"
    lines = [
        "jaxscale simulate param-server — synchronous vs asynchronous parameter server "
        "(seed 004 §9)",
        f"problem: least squares, {cfg.samples} x {cfg.dim} Gaussian A (seed {cfg.seed}), "
        f"H = A^T A / n scaled to lambda_max 1 (lambda_min {eig.min():.3f}), noise "
        f"{cfg.noise:g}; lr {cfg.lr:g}; each gradient on {batch}; compute time "
        + (f"U({1 - cfg.jitter:g}, {1 + cfg.jitter:g})" if cfg.jitter else "1 per gradient"),
        "",
        format_table(
            [
                "mode",
                "workers",
                "updates",
                "gradients",
                "sim time",
                "staleness mean/max",
                "final f-f*",
                "status",
            ],
            [
                [
                    name,
                    cfg.workers,
                    s["updates"],
                    s["gradients"],
                    f"{s['sim_time']:.1f}",
                    f"{s['mean_staleness']:.2f}/{s['max_staleness']}",
                    _fmt_gap(s["final_gap"]),
                    s["status"],
                ]
                for name, s in summaries.items()
            ],
        ),
        "sync: W gradients at the current x, averaged, one update per round (a round lasts as "
        "long as its slowest worker).",
        "async: each push is applied at once; staleness = updates applied between a worker's "
        "pull and its push (W-1 when compute times are equal).",
        "",
        f"staleness sweep: full-batch gradient descent where update t uses x(t - tau), lr "
        f"{cfg.lr:g}, {cfg.updates} updates",
        format_table(
            ["tau", "stable if lr*lambda <", "predicted rate/update", "final f-f*", "status"],
            [
                [
                    row["staleness"],
                    f"{row['critical_lr']:.3f}",
                    f"{row['predicted_rate']:.3f}",
                    _fmt_gap(row["final_gap"]),
                    row["status"],
                ]
                for row in sweep
            ],
        ),
        "stability: e(t+1) = e(t) - lr*lambda*e(t-tau) is stable iff lr*lambda < "
        "2 sin(pi / (2(2 tau + 1))); rate = largest root of z^(tau+1) - z^tau + lr*lambda "
        "over H's eigenvalues.",
    ]
    report = {
        "command": "simulate param-server",
        "config": asdict(cfg),
        "lambda_min": float(eig.min()),
        "runs": summaries,
        "staleness_sweep": [{k: v for k, v in row.items() if k != "run"} for row in sweep],
    }
    if args.plot:
        from jaxscale.sim import plots

        curves = {f"sync, W={cfg.workers}": runs["sync"], f"async, W={cfg.workers}": runs["async"]}
        curves |= {f"delayed tau={row['staleness']}": row["run"] for row in sweep}
        lines.append(f"\nplot written to {plots.param_server(curves, args.plot)}")
        report["plot"] = args.plot
    emit(args, report, lines)
    return 0
