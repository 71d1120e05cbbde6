"""`jaxscale calc reward`: the seed's RLHF reward tables (per-token KL penalty, the beta sweep, the
four KL scenarios and the page's worked example), with one sign convention:
penalty = beta·sum KL, net = RM score - penalty."""

from jaxscale.calc import reward
from jaxscale.cliutil import add_command, add_output_flags, finite_float, guarded
from jaxscale.render import Col, Report

FAITHFUL = (
    'seed 002 reward_calculator.py\'s printed signs (its "KL Penalty" column is -beta·KL), '
    f'"Weak penalty" for a bonus, and its demos at RM {reward.SEED_RM_SCORE}, beta '
    f"{reward.SEED_KL_COEF} whatever the flags"
)
CONVENTION = "penalty = beta·sum KL, subtracted from the RM score: net = RM - beta·sum KL"
ESTIMATOR_TEXT = {
    "k1": "k1 = actor_lp - ref_lp per sampled token (the seed's; can be negative)",
    "k3": "k3 = exp(r) - r - 1, r = ref_lp - actor_lp (>= 0 per token)",
}


def signed(x: float) -> str:
    """+0.0040; a float-noise -0.0000 prints as +0.0000."""
    return f"{round(x, 4) + 0.0:+.4f}"


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "reward",
        help="RLHF reward: RM score - beta·KL per token, beta sweep (seed 002)",
        description="The seed's 8-token response: per-token KL estimate, penalty beta·KL and "
        "reward (RM score at the last token), then the beta sweep and four KL scenarios "
        "(seed 002 ch. 13, reward_calculator.py).",
        example="jaxscale calc reward --kl-coef 0.1 --rm-score 0.8 --estimator k3",
    )
    # any number parses; the library refuses beta < 0 with the reason (clearer than argparse's)
    p.add_argument(
        "--kl-coef",
        "-k",
        type=finite_float,
        default=reward.SEED_KL_COEF,
        help="KL penalty coefficient beta (>= 0)",
    )
    p.add_argument(
        "--rm-score",
        "-r",
        type=finite_float,
        default=reward.SEED_RM_SCORE,
        help="reward-model score of the response",
    )
    p.add_argument(
        "--estimator",
        choices=reward.ESTIMATORS,
        default="k1",
        help="per-token KL estimator: k1 log-ratio (the seed's) or k3 (>= 0)",
    )
    p.add_argument(
        "--spread-rm",
        action="store_true",
        help="credit RM/N to every token instead of the whole score to the last",
    )
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    faithful = args.seed_faithful
    if faithful and args.estimator != "k1":
        raise ValueError("--seed-faithful reproduces the seed's k1 estimator: drop --estimator")
    if faithful and args.spread_rm:
        raise ValueError("--seed-faithful puts the RM score at the last token: drop --spread-rm")
    beta, rm_score, est = args.kl_coef, args.rm_score, args.estimator
    out = reward.compute_rewards(
        reward.SEED_ACTOR_LPS, reward.SEED_REF_LPS, rm_score, beta, not args.spread_rm, est
    )
    rep = Report(
        "calc reward",
        kl_coef=beta,
        rm_score=rm_score,
        estimator=est,
        reward_at_end_only=not args.spread_rm,
    ).mode(faithful, FAITHFUL)
    where = "spread over the tokens" if args.spread_rm else "at the last token"
    signs = "the seed's signs below; corrected: " if faithful else ""
    rep.put(convention=CONVENTION).say(
        f"convention: {signs}{CONVENTION}",
        f"KL estimator {ESTIMATOR_TEXT[est]}",
        f"beta {beta:g}, RM score {signed(rm_score)} {where}, {len(out.kl)} tokens",
        "",
    )
    _tokens(rep, out, faithful)
    _summary(rep, out, faithful)
    # the seed runs its demos at fixed inputs; corrected, the flags apply to them too
    demo_rm = reward.SEED_RM_SCORE if faithful else rm_score
    demo_beta = reward.SEED_KL_COEF if faithful else beta
    _sweep(rep, reward.kl_coef_sweep(demo_rm, est, seed_faithful=faithful), demo_rm)
    _scenarios(rep, reward.scenarios(demo_rm, demo_beta, est), demo_rm, demo_beta)
    prose = reward.prose_example()
    rep.put(
        prose_example={
            "rm_score": reward.PROSE_RM_SCORE,
            "total_kl": reward.PROSE_TOTAL_KL,
            "rows": prose,
        }
    )
    lo, hi = reward.TYPICAL_KL_COEFS
    rep.say(
        "",
        f"the page's example (its numbers, not the script's): R = {reward.PROSE_RM_SCORE} - "
        f"beta·{reward.PROSE_TOTAL_KL}",
        "  " + ", ".join(f"beta {r['kl_coef']:g} -> {r['net_reward']:.3f}" for r in prose),
        f"typical beta (seed): {lo:g} - {hi:g}",
    )
    rep.emit(args)
    return 0


def _tokens(rep: Report, out: reward.Rewards, faithful: bool) -> None:
    records = [
        {"t": t, "actor_logprob": a, "ref_logprob": r, "kl": k, "penalty": p, "rm": m, "reward": x}
        for t, (a, r, k, p, m, x) in enumerate(
            zip(
                reward.SEED_ACTOR_LPS,
                reward.SEED_REF_LPS,
                out.kl,
                out.penalties,
                out.rm,
                out.rewards,
                strict=True,
            )
        )
    ]
    total = {
        "t": "Total",
        "kl": out.total_kl,
        "penalty": out.penalty,
        "rm": sum(out.rm),
        "reward": out.net,
    }
    if faithful:  # the seed's column is the reward's KL term, -beta·KL, under "KL Penalty"
        pen = Col("penalty", "KL Penalty", lambda v: signed(-v))
    else:
        pen = Col("penalty", "penalty beta·KL", signed)
    cols = [
        Col("t", "Token"),
        Col("actor_logprob", "actor lp", "+.2f"),
        Col("ref_logprob", "ref lp", "+.2f"),
        Col("kl", "KL", signed),
        pen,
        Col("rm", "RM", signed),
        Col("reward", "Reward", signed),
    ]
    rep.table(None, cols, records + [total], title="token-level rewards:")
    rep.put(tokens=records)


def _summary(rep: Report, out: reward.Rewards, faithful: bool) -> None:
    rep.put(
        summary={
            "rm_score": out.rm_score,
            "total_kl": out.total_kl,
            "mean_kl": out.mean_kl,
            "penalty": out.penalty,
            "net_reward": out.net,
        }
    )
    kl_line = f"  total KL           {signed(out.total_kl)}  (mean {signed(out.mean_kl)} per token)"
    if faithful:
        rep.say(
            "",
            "summary (the seed's signs):",
            f"  RM score           {signed(out.rm_score)}",
            kl_line,
            f"  Total KL Penalty   {signed(out.penalty)}",
            f"  KL penalty         {signed(-out.penalty)} (distributed)",
            f"  net reward         {signed(out.net)}",
        )
        return
    note = ""
    if out.penalty < 0:
        note = f"  (sum KL < 0 under k1: a bonus of {-out.penalty:.4f}; k3 cannot go negative)"
    rep.say(
        "",
        "summary:",
        f"  RM score           {signed(out.rm_score)}",
        kl_line,
        f"  penalty beta·sumKL {signed(out.penalty)}{note}",
        f"  net reward         {signed(out.net)}  = RM - penalty",
    )


def _sweep(rep: Report, rows: list[dict], rm_score: float) -> None:
    total_kl = rows[0]["total_kl"]
    cols = [
        Col("kl_coef", "beta", "g"),
        Col("penalty", "penalty beta·sumKL", signed),
        Col("net_reward", "net reward", signed),
        Col("effect", "effect"),
    ]
    title = (
        f"\nKL coefficient sweep (the seed's 5-token response, sum KL {signed(total_kl)}, "
        f"RM {rm_score:g}):"
    )
    rep.table("kl_coef_sweep", cols, rows, title=title)


def _scenarios(rep: Report, rows: list[dict], rm_score: float, beta: float) -> None:
    cols = [
        Col("name", "scenario"),
        Col("kl", "per-token KL", lambda ks: "[" + ", ".join(f"{k:+.2f}" for k in ks) + "]"),
        Col("total_kl", "sum KL", signed),
        Col("penalty", "penalty", signed),
        Col("net_reward", "net reward", signed),
    ]
    title = f"\nKL divergence scenarios (3 tokens, beta {beta:g}, RM {rm_score:g}):"
    rep.table("scenarios", cols, rows, title=title)
    bonus = [r["name"] for r in rows if r["penalty"] < 0]
    if bonus:  # the seed prints these without comment
        rep.say(
            f"  sum KL < 0 under k1 turns the penalty into a bonus: {', '.join(bonus)}",
            "  (--estimator k3 cannot go negative)",
        )
