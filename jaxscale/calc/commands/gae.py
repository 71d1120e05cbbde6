"""`jaxscale calc gae`: the seed's GAE tables (TD errors, advantages per lambda, weights and the
worked example)."""

from jaxscale.calc import gae
from jaxscale.cliutil import add_command, add_output_flags, comma_list, guarded, positive_int
from jaxscale.render import Report, figure, grid

FAITHFUL = "seed 002 gae_visualizer.py: weights printed for gamma 0.99, lambda 0.95"


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "gae",
        help="GAE tables: TD errors, advantages for several lambda (seed 002)",
        description="The seed's 10-step trajectory: TD errors, GAE advantages for each lambda, the "
        "(gamma lambda)^k weights and the 3-step worked example (seed 002 ch. 12).",
        example="jaxscale calc gae --gamma 0.99 --lambdas 0,0.5,0.95,1 --plot gae.png",
    )
    p.add_argument("--gamma", type=float, default=0.99, help="discount")
    p.add_argument(
        "--lam", type=float, default=0.95, help="lambda of the weights and of the worked example"
    )
    p.add_argument(
        "--lambdas",
        type=comma_list(float),
        default=list(gae.SEED_LAMBDAS),
        help="lambdas of the advantage table",
    )
    p.add_argument(
        "--trajectory-length",
        type=positive_int,
        default=10,
        help="steps of the seed's trajectory used (1-10)",
    )
    add_output_flags(p, plot=True, faithful=True)
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    lambdas = sorted(set(args.lambdas))
    gae.check(args.gamma, args.lam, args.trajectory_length, lambdas)
    n = args.trajectory_length
    rewards, values = gae.SEED_REWARDS[:n], gae.SEED_VALUES[:n]
    deltas = gae.td_errors(rewards, values, args.gamma)
    adv = {lam: gae.advantages(deltas, args.gamma, lam) for lam in lambdas}
    rep = Report("calc gae", gamma=args.gamma, lam=args.lam).mode(args.seed_faithful, FAITHFUL)
    rep.put(
        trajectory=[
            {
                "t": t,
                "reward": r,
                "value": v,
                "td_error": d,
                **{f"lambda={lam:g}": adv[lam][t] for lam in lambdas},
            }
            for t, (r, v, d) in enumerate(zip(rewards, values, deltas, strict=True))
        ]
    )
    rep.say(
        f"trajectory (terminal V = 0), gamma {args.gamma:g}:",
        grid(
            ["t", "reward", "V", "TD error"] + [f"A lambda={lam:g}" for lam in lambdas],
            [
                [t, f"{r:.2f}", f"{v:.2f}", f"{d:.4f}"] + [f"{adv[lam][t]:.4f}" for lam in lambdas]
                for t, (r, v, d) in enumerate(zip(rewards, values, deltas, strict=True))
            ],
        ),
    )
    if args.seed_faithful:
        w = list(gae.SEED_WEIGHT_TEXT)
        rep.say(
            "",
            "weights as the seed prints them (gamma 0.99, lambda 0.95, rounded; t+10 is "
            "0.5415, not 0.53):",
        )
    else:
        w = gae.weights(args.gamma, args.lam)
        rep.say(
            "",
            f"weight of delta_(t+k) in A_t: (gamma lambda)^k, gamma lambda = "
            f"{args.gamma * args.lam:.4f}:",
        )
    rep.put(weights=[{"k": k, "weight": x} for k, x in w])
    rep.say("  " + ", ".join(f"t+{k}: {x:.4f}" for k, x in w))
    ex_d = gae.td_errors(gae.EXAMPLE_REWARDS, gae.EXAMPLE_VALUES, args.gamma)
    ex_a = gae.advantages(ex_d, args.gamma, args.lam)
    rep.put(example={"td_errors": ex_d, "advantages": ex_a})
    rep.say(
        "",
        f"worked example r = {list(gae.EXAMPLE_REWARDS)}, V = {list(gae.EXAMPLE_VALUES)}"
        f" (step 2 terminal), gamma {args.gamma:g}, lambda {args.lam:g}"
        + (" (the seed's version crashes before printing)" if args.seed_faithful else "")
        + ":",
        "  delta = [" + ", ".join(f"{d:.4f}" for d in ex_d) + "]",
        "  A     = [" + ", ".join(f"{a:.4f}" for a in ex_a) + "]",
    )
    if args.plot:
        with figure(args.plot, figsize=(8, 4.5), dpi=110) as (fig, ax):
            for lam in lambdas:
                ax.plot(range(n), adv[lam], "o-", label=f"lambda = {lam:g}")
            ax.plot(range(n), deltas, "k--", linewidth=1, label="TD error (= lambda 0)")
            ax.set(
                xlabel="step t",
                ylabel="advantage A_t",
                title=f"GAE on the seed's trajectory, gamma {args.gamma:g}",
            )
            ax.legend()
        rep.put(plot=args.plot).say(f"wrote {args.plot}")
    rep.emit(args)
    return 0
