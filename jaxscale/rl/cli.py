"""`jaxscale rl ALGO`: train on CartPole (one jitted program for every seed), and the small labs:
`rl variance` (policy-gradient variance with and without a baseline), `rl clipping` (the PPO-clip
case table)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jaxscale.cliutil import (
    add_command,
    add_dataclass_args,
    build_config,
    check_implied,
    guarded,
    positive_float,
    positive_int,
    writable_dir,
    writable_path,
)


def add_parser(sub) -> None:
    from jaxscale.rl.config import ALGOS, RLConfig

    p = sub.add_parser(
        "rl",
        help="RL fundamentals on CartPole: PPO, actor-critic, REINFORCE",
        description="Policy-gradient training in pure JAX, one jit per run, data "
        "parallel over the mesh (seed 002 ch. 12).",
    )
    rl_sub = p.add_subparsers(dest="rl_name", required=True, metavar="WHAT")
    for algo in ALGOS:
        t = add_command(
            rl_sub,
            algo,
            help=f"train {algo} on CartPole",
            description=f"Train {algo} on CartPole, every seed in one compiled program; report "
            "the evaluation returns, when each seed first reached the solved threshold, and the "
            "time taken.",
            example=f"jaxscale rl {algo} --env cartpole --seeds 5 --mesh dp=8 --out runs/rl",
        )
        add_dataclass_args(t, RLConfig, skip=("algo",))
        t.add_argument(
            "--seed-faithful",
            action="store_true",
            help="train on the seed's SimulatedCartPole (same as --env seed-cartpole)",
        )
        t.add_argument("--seeds", type=positive_int, default=1, help="independent runs (vmapped)")
        t.add_argument("--seed", type=int, default=0, help="first seed; runs use SEED..SEED+N-1")
        t.add_argument(
            "--mesh",
            default="",
            help="split the environments over a data axis, e.g. dp=8 (default: one device)",
        )
        t.add_argument(
            "--out",
            type=writable_dir,
            default=None,
            help="directory for metrics.jsonl and learning_curve.png",
        )
        t.add_argument(
            "--tensorboard",
            type=writable_dir,
            default=None,
            metavar="DIR",
            help="also write each seed's losses and returns as TensorBoard scalars here "
            "(tensorboardX: pip install -e '.[profile]')",
        )
        t.add_argument(
            "--profile",
            type=writable_dir,
            default=None,
            metavar="DIR",
            help="trace the run (compiled first; it is one program) into DIR and print its "
            "compute / collective / idle split per update. On CPU devices the profiler's cost "
            "per op dwarfs the run's small ops: the split describes the traced run",
        )
        t.add_argument("--json", action="store_true", help="print the summary as one JSON object")
        t.add_argument(
            "--dry-run",
            action="store_true",
            help="check the arguments and the output paths, print the run, compile nothing",
        )
        t.set_defaults(func=guarded(_train), algo=algo)
    v = add_command(
        rl_sub,
        "variance",
        help="gradient variance of REINFORCE with and without a baseline",
        description="Train REINFORCE-with-baseline briefly, then estimate the policy gradient from "
        "single episodes with b = 0 and with b = V(s): the variance over episodes of each "
        "estimate (seed 002 ch. 12, Try It 2).",
        example="jaxscale rl variance --episodes 256 --updates 100",
    )
    v.add_argument("--episodes", type=positive_int, default=256, help="episodes sampled")
    v.add_argument(
        "--updates",
        type=positive_int,
        default=100,
        help="REINFORCE-with-baseline updates before measuring",
    )
    v.add_argument("--seed", type=int, default=0, help="random seed")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(func=guarded(_variance))
    c = add_command(
        rl_sub,
        "clipping",
        help="the PPO-clip objective's case table (seed 002 ch. 12, Try It 3)",
        description="min(r A, clip(r, 1-eps, 1+eps) A) for each sign of A and ratio regime, and "
        "whether the clipped term is chosen (zero gradient).",
        example="jaxscale rl clipping --eps 0.2",
    )
    c.add_argument("--eps", type=positive_float, default=0.2, help="clip epsilon")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=guarded(_clipping))


def _train(args) -> int:
    import json

    from jaxscale.rl import run
    from jaxscale.rl.config import RLConfig
    from jaxscale.stopping import stop_on_signal

    cfg = build_config(RLConfig, args, RLConfig(algo=args.algo))
    if args.seed_faithful:
        if args.env not in (None, "seed-cartpole"):
            raise ValueError(f"--seed-faithful trains on seed-cartpole; drop --env {args.env}")
        cfg = cfg.replace(env="seed-cartpole")
    if not 0 <= args.seed <= 2**31 - 1 - args.seeds:
        raise ValueError(f"--seed must be in [0, {2**31 - 1 - args.seeds}]")
    mesh = _mesh(args.mesh)
    cfg.check(1 if mesh is None else mesh.shape["data"])
    _check_memory(cfg, args.seeds)
    if args.tensorboard:
        from jaxscale.scalars import check_available

        check_available()
    if args.out:  # what --out will hold, checked before anything compiles
        d = Path(args.out)
        check_implied(
            "--out", d, [(writable_path, d / "metrics.jsonl"), (writable_path, d / OUT_PNG)]
        )
    seeds = list(range(args.seed, args.seed + args.seeds))
    print(
        f"rl {cfg.algo}: {cfg.env}, {len(seeds)} seed(s), {cfg.env_steps:,} env steps each "
        f"({cfg.n_updates} updates of {cfg.num_envs} envs x {cfg.num_steps} steps), "
        f"{'mesh ' + args.mesh if mesh is not None else 'one device'}",
        file=sys.stderr,
    )
    if args.dry_run:
        print("dry run: arguments and output paths checked, nothing compiled", file=sys.stderr)
        return 0
    # the writes are inside the block too: a second Ctrl-C while they run is an abort (its note
    # says so), not a traceback from half-written files
    with stop_on_signal(STOP_NOTE, ABORT_NOTE) as stop:
        try:
            out = run.train(
                cfg, seeds, mesh, progress=not args.json, stop=stop, profile=args.profile
            )
        except run.Stopped as e:
            print(f"jaxscale rl: {e}: nothing written", file=sys.stderr)
            return 130
        summary = out.summary()
        if args.out:
            d = Path(args.out)
            summary["metrics"] = str(run.write_metrics(out, d / "metrics.jsonl"))
            summary["plot"] = str(run.plot_curves({cfg.algo: out}, d / OUT_PNG))
        if args.tensorboard:
            run.write_scalars(out, args.tensorboard)
            summary["tensorboard"] = str(args.tensorboard)
    if out.profile:
        from jaxscale.profiling import describe

        summary["profile"] = out.profile["trace"]
        print(describe(out.profile, args.profile, "update"), file=sys.stderr)
    bad = out.first_non_finite()
    if args.json:
        print(json.dumps(summary))
    else:
        print(_summary_text(out, summary))
    if bad:  # a diverged run is not a result: say so, and exit as train does (3)
        where = ", ".join(f"seed {seed} from update {u}" for seed, u in bad.items())
        print(f"jaxscale rl: non-finite losses ({where}); lower --lr", file=sys.stderr)
        return 3
    if stop.is_set():
        print(
            f"jaxscale rl: stopped after {out.cfg.n_updates} of {cfg.n_updates} updates "
            f"({out.cfg.env_steps:,} env steps each); the results above are theirs",
            file=sys.stderr,
        )
        return 130
    return 0


OUT_PNG = "learning_curve.png"
STOP_NOTE = "stopping after this chunk of updates (keeping what finished); Ctrl-C again to abort"
ABORT_NOTE = "aborted: the finished updates are not (all) written"


def seed_bytes(cfg) -> int:
    """A lower bound on what one seed's run holds at once, in bytes: its rollout (per step and
    environment: observation, action, log-prob, value, reward, done, advantage and return, f32)
    and its actor-critic's parameters, gradients and two Adam moments (CartPole: 4 inputs, 2
    actions)."""
    obs, actions, h = 4, 2, cfg.hidden
    mlp = lambda n_out: obs * h + h + h * h + h + h * n_out + n_out  # noqa: E731
    params = mlp(actions) + mlp(1)
    return 4 * (cfg.num_steps * cfg.num_envs * (obs + 7) + 4 * params)


def _check_memory(cfg, n_seeds: int) -> None:
    """Refuse a seed count whose runs cannot fit in the host's memory (the seeds run as one
    vmapped program: before, 100,000,000 seeds ran out of memory after 40 s)."""
    need = n_seeds * seed_bytes(cfg)
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have / 2:
        raise ValueError(
            f"--seeds {n_seeds}: at least {need / 2**30:,.1f} GiB ({seed_bytes(cfg) / 2**20:.2f} "
            f"MiB per seed) for {have / 2**30:.0f} GiB of memory; run fewer seeds"
        )


def _summary_text(out, s: dict) -> str:
    from jaxscale.render import grid

    rows = [
        [seed, f"{ret:.1f}", f"{at:,}" if at is not None else "not reached"]
        for seed, ret, at in zip(
            out.seeds, s["final_eval_return"], s["solved_at_env_steps"], strict=True
        )
    ]
    lines = [
        grid(["seed", "final eval return", f"first eval >= {s['threshold']:g} at env step"], rows)
    ]
    med = s["median_solved_at"]
    lines.append(
        f"solved: {s['seeds_solved_at_end']}/{s['seeds']} seeds end at or above "
        f"{s['threshold']:g}; median seed first reached it at "
        f"{f'{med:,} env steps' if med is not None else '(not reached by most seeds)'}"
    )
    lines.append(
        f"time: compile {s['compile_s']:.1f} s, train {s['train_s']:.1f} s for "
        f"{s['seeds']} seed(s) x {s['env_steps']:,} env steps "
        f"({s['env_steps_per_s']:,.0f} env steps/s, evaluations included)"
    )
    for key in ("metrics", "plot"):
        if key in s:
            lines.append(f"wrote {s[key]}")
    return "\n".join(lines)


def _mesh(text: str):
    if not text:
        return None
    import jax

    from jaxscale.mesh import MeshSpecError, build_mesh, parse_mesh

    try:
        spec = parse_mesh(text).resolve(jax.device_count())
    except MeshSpecError as e:
        raise ValueError(f"--mesh {text}: {e}") from None
    if spec.names != ("data",):
        raise ValueError(
            f"--mesh {text}: RL training splits environments over a data axis only; write dp=N"
        )
    return build_mesh(spec, jax.devices()[: spec.n_devices])


def _variance(args) -> int:
    import json

    from jaxscale.rl import variance

    res = variance.measure(args.episodes, args.updates, args.seed)
    if args.json:
        print(json.dumps(res))
        return 0
    print(
        f"policy-gradient estimate from one episode, {args.episodes} episodes, after "
        f"{args.updates} REINFORCE-with-baseline updates (mean episode length "
        f"{res['mean_episode_length']:.1f}):"
    )
    print(
        f"  total variance (trace of the covariance), b = 0:    {res['variance_no_baseline']:.4g}"
    )
    print(f"  total variance, b = V(s) (the learned critic):    {res['variance_baseline']:.4g}")
    print(
        f"  ratio: {res['ratio']:.3f} (the baseline leaves the mean unchanged; "
        f"|mean difference| / |mean| = {res['mean_shift']:.3f})"
    )
    return 0


def _clipping(args) -> int:
    import json

    from jaxscale.render import grid
    from jaxscale.rl.ppo import CLIPPING_CASES, clipped_objective

    rows = []
    for adv, ratio in CLIPPING_CASES:
        value, clipped = clipped_objective(ratio, adv, args.eps)
        rows.append({"advantage": adv, "ratio": ratio, "objective": value, "clipped": clipped})
    if args.json:
        print(json.dumps({"eps": args.eps, "cases": rows}))
        return 0
    print(f"PPO-clip objective min(r A, clip(r, {1 - args.eps:g}, {1 + args.eps:g}) A):")
    print(
        grid(
            ["A", "r", "objective", "term chosen"],
            [
                [
                    f"{r['advantage']:+g}",
                    f"{r['ratio']:g}",
                    f"{r['objective']:+.3f}",
                    "clipped (zero gradient)" if r["clipped"] else "unclipped",
                ]
                for r in rows
            ],
        )
    )
    return 0
