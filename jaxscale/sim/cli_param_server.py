"""`jaxscale simulate param-server`: sync vs stale asynchronous updates (seed 004 §9)."""

import argparse
import math
from dataclasses import asdict

from jaxscale.cliutil import (
    add_output_flags,
    guarded,
    non_negative_float,
    overrides,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report
from jaxscale.sim import param_server as ps

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
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="rows per gradient (0 = all rows)")  # fmt: skip
    p.add_argument("--samples", type=positive_int, default=d.samples)
    p.add_argument("--dim", type=positive_int, default=d.dim)
    p.add_argument("--noise", type=non_negative_float, default=d.noise)
    p.add_argument("--jitter", type=non_negative_float, default=d.jitter,
                   help="worker compute time ~ U(1-j, 1+j)")  # fmt: skip
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--staleness-sweep", type=_staleness_list, default=list(DEFAULT_SWEEP),
                   metavar="TAUS", help="comma-separated staleness values")  # fmt: skip
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run))


def _status(run: ps.RunResult) -> str:
    if run.diverged:
        return "diverged"
    return "converged" if run.final_gap <= CONVERGED_RATIO * run.gaps[0] else "not yet"


def _finite(x: float) -> float | None:
    """JSON has no inf/nan: a gap that overflowed is reported as null."""
    return x if math.isfinite(x) else None


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


def _shown(row: dict, **extra) -> dict:
    """A record as the text table shows it: an overflowed (null) gap reads 'overflow'."""
    gap = row["final_gap"]
    return row | extra | {"final_gap": "overflow" if gap is None else f"{gap:.2e}"}


RUN_COLS = [Col("mode", "mode"), Col("workers", "workers"), Col("updates", "updates"),
            Col("gradients", "gradients"), Col("sim_time", "sim time", ".1f"),
            Col("staleness", "staleness mean/max"), Col("final_gap", "final f-f*"),
            Col("status", "status")]  # fmt: skip
SWEEP_COLS = [Col("staleness", "tau"), Col("critical_lr", "stable if lr*lambda <", ".3f"),
              Col("predicted_rate", "predicted rate/update", ".3f"),
              Col("final_gap", "final f-f*"), Col("status", "status")]  # fmt: skip


def run(args) -> int:
    cfg = ps.ParamServerConfig(**overrides(args, ps.ParamServerConfig))
    problem = ps.make_problem(cfg)
    eig = problem.hessian_eigenvalues()
    runs = {"sync": ps.run_sync(cfg, problem), "async": ps.run_async(cfg, problem)}
    delayed = [ps.run_delayed(problem, cfg.lr, tau, cfg.updates) for tau in args.staleness_sweep]
    sweep = [{"staleness": tau, "critical_lr": ps.critical_lr(tau),
              "predicted_rate": ps.delayed_rate(cfg.lr, tau, eig),
              "final_gap": _finite(d.final_gap), "status": _status(d)}
             for tau, d in zip(args.staleness_sweep, delayed, strict=True)]  # fmt: skip
    summaries = {name: _summary(run) for name, run in runs.items()}
    batch = "all rows" if cfg.batch_size in (0, cfg.samples) else f"{cfg.batch_size} random rows"

    r = Report("simulate param-server", config=asdict(cfg), lambda_min=float(eig.min()))
    r.put(runs=summaries)
    r.say(
        "jaxscale simulate param-server — synchronous vs asynchronous parameter server "
        "(seed 004 §9)",
        f"problem: least squares, {cfg.samples} x {cfg.dim} Gaussian A (seed {cfg.seed}), "
        f"H = A^T A / n scaled to lambda_max 1 (lambda_min {eig.min():.3f}), noise "
        f"{cfg.noise:g}; lr {cfg.lr:g}; each gradient on {batch}; compute time "
        + (f"U({1 - cfg.jitter:g}, {1 + cfg.jitter:g})" if cfg.jitter else "1 per gradient"),
        "",
    )
    r.table(None, RUN_COLS, [
        _shown(s, mode=name, workers=cfg.workers,
               staleness=f"{s['mean_staleness']:.2f}/{s['max_staleness']}")
        for name, s in summaries.items()])  # fmt: skip
    r.say(
        "sync: W gradients at the current x, averaged, one update per round (a round lasts as "
        "long as its slowest worker).",
        "async: each push is applied at once; staleness = updates applied between a worker's "
        "pull and its push (W-1 when compute times are equal).",
        "",
        f"staleness sweep: full-batch gradient descent where update t uses x(t - tau), lr "
        f"{cfg.lr:g}, {cfg.updates} updates",
    )
    r.table(None, SWEEP_COLS, [_shown(row) for row in sweep])
    r.put(staleness_sweep=sweep)
    r.say(
        "stability: e(t+1) = e(t) - lr*lambda*e(t-tau) is stable iff lr*lambda < "
        "2 sin(pi / (2(2 tau + 1))); rate = largest root of z^(tau+1) - z^tau + lr*lambda "
        "over H's eigenvalues."
    )
    if args.plot:
        from jaxscale.sim import plots

        curves = {f"{name}, W={cfg.workers}": run for name, run in runs.items()}
        curves |= {d.mode: d for d in delayed}  # "delayed tau=3"
        r.say(f"\nplot written to {plots.param_server(curves, args.plot)}")
        r.put(plot=args.plot)
    r.emit(args)
    return 0
