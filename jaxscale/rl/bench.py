"""`jaxscale bench rl`: jaxscale's PPO beside rejax's, in one process on the same machine.

Two measurements, both with the compile excluded (each program is compiled first, then run):
- throughput: environment steps per second of training (no evaluations), for jaxscale on one
  device and split over the simulated devices, and for rejax (single-device by design);
- time to solve: 5 seeds at once, each implementation run twice at the same budget: once with
  evaluations (the same evaluator for both: mean return of full episodes every `eval_every`
  updates) to find the env step where each seed first reached 475, once without to time training.
  time-to-475 = (median seed's env steps to 475) / budget x the training time of the budget.
  ratio = rejax's time / jaxscale's (above 1: jaxscale is faster).
"""

from __future__ import annotations

import time

import numpy as np

from jaxscale.rl.config import RLConfig

SEEDS = (0, 1, 2, 3, 4)
THROUGHPUT_ENVS = (16, 1024)


def timed(fn, keys):
    """(compile s, best run s of two, outputs) of a jitted fn(keys)."""
    import jax

    t0 = time.perf_counter()
    compiled = fn.lower(keys).compile()
    compile_s = time.perf_counter() - t0
    runs = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(keys))
        runs.append(time.perf_counter() - t0)
    return compile_s, min(runs), out


def _keys(seeds):
    import jax

    return jax.vmap(jax.random.key)(np.asarray(seeds, np.uint32))


def _fn(impl: str, cfg: RLConfig, mesh=None):
    from jaxscale.rl import competitor, loop

    if impl == "rejax":
        fn = competitor.make_train(cfg)
        return lambda: fn, lambda out: np.asarray(out[0])
    return (lambda: loop.make_run(cfg, mesh)), (lambda out: np.asarray(out[2]))


def throughput_rows(base: RLConfig, n_devices: int, with_rejax: bool, progress=None) -> list[dict]:
    from jaxscale.mesh import build_mesh

    rows = []
    for envs in THROUGHPUT_ENVS:
        updates = max(2, 16 * 16 // envs)
        cfg = base.replace(
            num_envs=envs,
            eval_episodes=0,
            eval_every=updates,
            total_steps=updates * envs * base.num_steps,
        )
        impls = [("jaxscale", 1), ("jaxscale", n_devices)] + ([("rejax", 1)] if with_rejax else [])
        for impl, devices in impls:
            mesh = build_mesh(f"dp={devices}") if impl == "jaxscale" and devices > 1 else None
            make, _ = _fn(impl, cfg, mesh)
            compile_s, run_s, _ = timed(make(), _keys(SEEDS[:1]))
            rows.append(
                {
                    "impl": impl,
                    "devices": devices,
                    "num_envs": envs,
                    "env_steps": cfg.env_steps,
                    "compile_s": compile_s,
                    "run_s": run_s,
                    "steps_per_s": cfg.env_steps / run_s,
                }
            )
            if progress:
                progress(f"{impl} x{devices} envs {envs}")
    return rows


def solve_rows(cfg: RLConfig, impls, progress=None) -> list[dict]:
    threshold = 475.0
    rows = []
    for impl in impls:
        make, evals_of = _fn(impl, cfg)
        _, eval_s, out = timed(make(), _keys(SEEDS))
        evals = evals_of(out)
        make, _ = _fn(impl, cfg.replace(eval_episodes=0))
        compile_s, train_s, _ = timed(make(), _keys(SEEDS))
        steps = (np.arange(evals.shape[1]) + 1) * cfg.batch * cfg.eval_every
        solved = [
            int(steps[np.argmax(row >= threshold)]) if np.any(row >= threshold) else None
            for row in evals
        ]
        reached = sorted(s for s in solved if s is not None)
        median = float(np.median(reached)) if 2 * len(reached) > len(solved) else None
        rows.append(
            {
                "impl": impl,
                "seeds": len(SEEDS),
                "budget_env_steps": cfg.env_steps,
                "solved_at_env_steps": solved,
                "median_env_steps_to_475": median,
                "final_eval_return": [float(x) for x in evals[:, -1]],
                "compile_s": compile_s,
                "train_s": train_s,
                "with_eval_s": eval_s,
                "steps_per_s": cfg.env_steps * len(SEEDS) / train_s,
                "time_to_475_s": None if median is None else median / cfg.env_steps * train_s,
                "eval_curve": evals.tolist(),
                "eval_steps": steps.tolist(),
            }
        )
        if progress:
            progress(f"{impl} solve")
    return rows


def ratio(rows: list[dict]) -> float | None:
    by = {r["impl"]: r["time_to_475_s"] for r in rows}
    if by.get("rejax") is None or by.get("jaxscale") is None:
        return None
    return by["rejax"] / by["jaxscale"]


def plot(solve: list[dict], throughput: list[dict], path) -> None:
    from jaxscale.render import figure

    with figure(path, 1, 2, figsize=(12, 4.5), dpi=110) as (fig, (ax_c, ax_t)):
        for i, r in enumerate(solve):
            curve = np.asarray(r["eval_curve"])
            ax_c.plot(
                r["eval_steps"],
                curve.mean(0),
                "o-",
                color=f"C{i}",
                markersize=3,
                label=f"{r['impl']} (mean of {r['seeds']} seeds)",
            )
            ax_c.fill_between(
                r["eval_steps"], curve.min(0), curve.max(0), color=f"C{i}", alpha=0.15
            )
        ax_c.axhline(475, linestyle="--", color="gray", label="solved (475)")
        ax_c.set(
            xlabel="environment steps",
            ylabel="evaluation return",
            title="CartPole-v1 PPO, matched hyperparameters",
        )
        ax_c.legend(fontsize=8)
        labels = [f"{r['impl']}\nx{r['devices']}, {r['num_envs']} envs" for r in throughput]
        ax_t.bar(
            range(len(throughput)),
            [r["steps_per_s"] for r in throughput],
            color=["C0" if r["impl"] == "jaxscale" else "C1" for r in throughput],
        )
        ax_t.set_xticks(range(len(throughput)), labels, fontsize=7)
        ax_t.set(ylabel="environment steps / s (training only)", title="throughput")


def main(args) -> int:
    """The `bench rl` suite: tables on stdout, JSON and PNG under --out."""
    import json
    import sys
    from pathlib import Path

    import jax

    from jaxscale.progress import Progress
    from jaxscale.render import grid
    from jaxscale.rl import competitor

    cfg = RLConfig()
    n_dev = jax.device_count()
    reason = competitor.unavailable_reason()
    impls = ["jaxscale"] + ([] if reason else ["rejax"])
    print(
        f"bench rl: PPO on CartPole-v1, {cfg.num_envs} envs x {cfg.num_steps} steps, "
        f"{cfg.epochs} epochs x {cfg.minibatches} minibatches, lr {cfg.lr:g} decayed, budget "
        f"{cfg.env_steps:,} env steps, {len(SEEDS)} seeds; {n_dev} {jax.devices()[0].device_kind}"
        f" devices, jax {jax.__version__}"
        + ("" if reason else f"; competitor {competitor.version()}"),
        file=sys.stderr,
    )
    if reason:
        print(f"bench rl: {reason}; measuring jaxscale alone", file=sys.stderr)
    if args.dry_run:
        return 0
    bar = Progress(len(THROUGHPUT_ENVS) * (len(impls) + 1) + len(impls), desc="bench rl", eta=False)
    step = lambda note: bar.update(1, note=note)  # noqa: E731
    through = throughput_rows(cfg, n_dev, not reason, step)
    solve = solve_rows(cfg, impls, step)
    bar.close()
    r = ratio(solve)
    report = {
        "config": cfg.__dict__,
        "devices": n_dev,
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "competitor": None if reason else competitor.version(),
        "throughput": through,
        "solve": solve,
        "ratio_time_to_475": r,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_rl.json").write_text(json.dumps(report, indent=1))
    paths = [out / "bench_rl.json"]
    if not args.no_plot:
        png = Path(args.plot or out / "bench_rl.png")
        plot(solve, through, png)
        paths.append(png)
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        grid(
            ["implementation", "devices", "envs", "env steps/s", "compile s"],
            [
                [
                    t["impl"],
                    t["devices"],
                    t["num_envs"],
                    f"{t['steps_per_s']:,.0f}",
                    f"{t['compile_s']:.1f}",
                ]
                for t in through
            ],
        )
    )
    print()
    print(
        grid(
            [
                "implementation",
                "seeds >= 475 at end",
                "median env steps to 475",
                "train env steps/s",
                "time to 475 s",
            ],
            [
                [
                    s["impl"],
                    f"{sum(x >= 475 for x in s['final_eval_return'])}/{s['seeds']}",
                    f"{s['median_env_steps_to_475']:,.0f}" if s["median_env_steps_to_475"] else "-",
                    f"{s['steps_per_s']:,.0f}",
                    f"{s['time_to_475_s']:.2f}" if s["time_to_475_s"] else "-",
                ]
                for s in solve
            ],
        )
    )
    if r is not None:
        print(
            f"\nratio (rejax time to 475 / jaxscale time to 475): {r:.2f}"
            f" ({'jaxscale faster' if r >= 1 else 'rejax faster'})"
        )
    if jax.default_backend() == "cpu":
        print(
            "* on simulated CPU devices the 8-device rows share the host's cores: they show "
            "that the sharded program runs, not a speed-up."
        )
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
