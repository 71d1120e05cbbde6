"""`jaxscale simulate param-server`: sync vs stale asynchronous updates (seed 004 §9)."""

import math
from dataclasses import asdict

from jaxscale.checks import at_most
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    comma_list,
    guarded,
    non_negative_float,
    non_negative_int,
    overrides,
    positive_float,
    positive_int,
    probability,
)
from jaxscale.render import Col, Report
from jaxscale.sim import param_server as ps

CONVERGED_RATIO = 1e-8  # "converged": the gap fell below this fraction of the initial gap
DEFAULT_SWEEP = (0, 1, 2, 3, 5, 7)
# Bounds that keep a run to seconds (the default run: 2,200 gradients, 2e7 multiply-adds).
MAX_GRADIENTS = 200_000
MAX_WORK = 2e9
MAX_DIM = 256
MAX_SWEEP = 8
MAX_STALENESS = 64


def add_parser(sim_sub) -> None:
    p = add_command(
        sim_sub,
        "param-server",
        help="asynchronous parameter server with stale gradients vs synchronous updates",
        description="Seed 004 §9's parameter server as an event simulation on a least-squares "
        "problem: workers pull, compute, push; the server applies each push at once, so "
        "gradients are stale by the updates applied in between.",
        example="jaxscale simulate param-server --workers 8 --lr 0.3 --staleness-sweep 0,2,4",
    )
    d = ps.ParamServerConfig()
    p.add_argument("--workers", type=positive_int, default=d.workers, help="workers W")
    p.add_argument("--lr", type=positive_float, default=d.lr, help="step size x lambda_max")
    p.add_argument("--updates", type=positive_int, default=d.updates, help="server updates")
    p.add_argument(
        "--batch-size",
        type=non_negative_int,
        default=d.batch_size,
        help="rows per gradient (0 = all rows)",
    )
    p.add_argument("--samples", type=positive_int, default=d.samples, help="rows n of A")
    p.add_argument(
        "--dim",
        type=positive_int,
        default=d.dim,
        help=f"columns d of A (parameters), at most {MAX_DIM}",
    )
    p.add_argument("--noise", type=non_negative_float, default=d.noise, help="label noise std")
    p.add_argument(
        "--jitter",
        type=probability,
        default=d.jitter,
        help="worker compute time ~ U(1-j, 1+j), j < 1",
    )
    p.add_argument("--seed", type=non_negative_int, default=d.seed, help="seed of the problem")
    p.add_argument(
        "--staleness-sweep",
        type=comma_list(non_negative_int),
        default=list(DEFAULT_SWEEP),
        metavar="TAUS",
        help=f"staleness values, comma-separated: at most {MAX_SWEEP}, each at most "
        f"{MAX_STALENESS}",
    )
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run))


def _check(args) -> None:
    """The combinations the flags must satisfy, and the bounds that keep a run to seconds."""
    if args.samples < args.dim:
        raise ValueError(
            f"--samples {args.samples} < --dim {args.dim}: the least-squares "
            "problem needs samples >= dim for a unique minimiser"
        )
    if args.batch_size > args.samples:
        raise ValueError(f"--batch-size {args.batch_size} exceeds --samples {args.samples}")
    if args.jitter >= 1:
        raise ValueError(f"--jitter must be < 1 (compute times stay positive), got {args.jitter}")
    sweep = args.staleness_sweep
    if len(sweep) > MAX_SWEEP or max(sweep) > MAX_STALENESS:
        raise ValueError(
            f"--staleness-sweep {','.join(map(str, sweep))}: at most {MAX_SWEEP} "
            f"values, each at most {MAX_STALENESS} (the stability root of tau "
            "comes from a degree tau+1 polynomial per eigenvalue)"
        )
    at_most(MAX_DIM, "columns", "every eigenvalue of the d x d Hessian is analysed", dim=args.dim)
    grads = args.updates * (args.workers + 1 + len(sweep))  # sync, async, the sweep's runs
    work = grads * args.samples * args.dim
    if grads > MAX_GRADIENTS or work > MAX_WORK:
        raise ValueError(
            f"--updates {args.updates} x (--workers {args.workers} + 1 + {len(sweep)} "
            f"--staleness-sweep values) = {grads:,} gradients of --samples {args.samples} x "
            f"--dim {args.dim}: at most {MAX_GRADIENTS:,} gradients and {MAX_WORK:.0e} "
            "multiply-adds (a longer run takes minutes)"
        )


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


RUN_COLS = [
    Col("mode", "mode"),
    Col("workers", "workers"),
    Col("updates", "updates"),
    Col("gradients", "gradients"),
    Col("sim_time", "sim time", ".1f"),
    Col("staleness", "staleness mean/max"),
    Col("final_gap", "final f-f*"),
    Col("status", "status"),
]
SWEEP_COLS = [
    Col("staleness", "tau"),
    Col("critical_lr", "stable if lr*lambda <", ".3f"),
    Col("predicted_rate", "predicted rate/update", ".3f"),
    Col("final_gap", "final f-f*"),
    Col("status", "status"),
]


def run(args) -> int:
    _check(args)
    cfg = ps.ParamServerConfig(**overrides(args, ps.ParamServerConfig))
    problem = ps.make_problem(cfg)
    eig = problem.hessian_eigenvalues()
    runs = {"sync": ps.run_sync(cfg, problem), "async": ps.run_async(cfg, problem)}
    delayed = [ps.run_delayed(problem, cfg.lr, tau, cfg.updates) for tau in args.staleness_sweep]
    sweep = [
        {
            "staleness": tau,
            "critical_lr": ps.critical_lr(tau),
            "predicted_rate": ps.delayed_rate(cfg.lr, tau, eig),
            "final_gap": _finite(d.final_gap),
            "status": _status(d),
        }
        for tau, d in zip(args.staleness_sweep, delayed, strict=True)
    ]
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
    r.table(
        None,
        RUN_COLS,
        [
            _shown(
                s,
                mode=name,
                workers=cfg.workers,
                staleness=f"{s['mean_staleness']:.2f}/{s['max_staleness']}",
            )
            for name, s in summaries.items()
        ],
    )
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
