"""`jaxscale simulate speculative`: closed forms, seed 000's sweeps, seed 002's speculative_demo."""

from jaxscale.checks import at_most
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    guarded,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
)
from jaxscale.render import Col, Report
from jaxscale.sim import speculative as sp
from jaxscale.sim import speculative_demo as demo

FAITHFUL_WHAT = (
    "seed 002's 3.36 tokens/pass and speculative_demo's per-call draft cost without a bonus "
    "token (3.50x), and seed 000's k*T/(k*d+T) perfect-draft speedup"
)
SEED_EXAMPLE = "seed 002 ch11 example"  # the row whose printed value is defect 9
# Bounds that keep a run to seconds: the sweeps draw up to trials x tokens x K numbers at each of
# six settings (the default: 160,000, under a second); the demo draws per token.
MAX_DRAWS = 400_000
MAX_K = 32
MAX_TARGET_LENGTH = 100_000
WHY = "a larger run is slow"


def add_parser(sim_sub) -> None:
    p = add_command(
        sim_sub,
        "speculative",
        help="speculative decoding: closed forms, Monte-Carlo draft/verify, speculative_demo",
        description="Draft K tokens, verify them in one target pass, accept until the first "
        "mismatch. Closed forms (seed 002 ch11), seed 000 exercise 2's K and match-probability "
        "sweeps, and seed 002's speculative_demo.py (Python random).",
        example="jaxscale simulate speculative -k 4 -a 0.8 --match-prob 0.8 --plot spec.png",
    )
    g = p.add_argument_group("seed 002 speculative_demo.py flags")
    d = demo.DemoConfig()
    g.add_argument(
        "--draft-length",
        "-k",
        type=positive_int,
        default=d.draft_length,
        help="draft tokens per round",
    )
    g.add_argument(
        "--target-length",
        "-n",
        type=positive_int,
        default=d.target_length,
        help=f"tokens to generate, at most {MAX_TARGET_LENGTH:,}",
    )
    g.add_argument(
        "--acceptance-rate",
        "-a",
        type=probability,
        default=d.acceptance_rate,
        help="probability that the target agrees with a draft token",
    )
    g.add_argument(
        "--draft-cost",
        type=non_negative_float,
        default=d.draft_cost,
        help="one draft forward relative to one target forward",
    )
    g.add_argument(
        "--seed", type=non_negative_int, default=d.seed, help="Python random seed of the demo"
    )
    g = p.add_argument_group("seed 000 exercise 2 Monte-Carlo")
    s = sp.SweepConfig()
    g.add_argument(
        "--match-prob",
        type=probability,
        default=s.match_prob,
        help="probability that a draft token matches",
    )
    g.add_argument(
        "--total-tokens",
        type=positive_int,
        default=s.total_tokens,
        help="tokens generated per trial",
    )
    g.add_argument(
        "--draft-time-ms",
        type=non_negative_float,
        default=s.draft_time_ms,
        help="time of one drafted token",
    )
    g.add_argument(
        "--target-time-ms",
        type=positive_float,
        default=s.target_time_ms,
        help="time of one target pass",
    )
    g.add_argument(
        "--trials",
        type=positive_int,
        default=s.num_trials,
        help=f"trials per point (x --total-tokens x --max-k: at most {MAX_DRAWS:,})",
    )
    g.add_argument(
        "--mc-seed", type=non_negative_int, default=s.seed, help="np.random seed of the sweeps"
    )
    g.add_argument(
        "--max-k",
        type=positive_int,
        default=max(sp.DRAFT_LENGTHS),
        help=f"largest draft length K of the sweeps, at most {MAX_K}",
    )
    add_output_flags(p, plot=True, faithful=True)
    p.set_defaults(func=guarded(run))


def _closed_form_rows(args, best_k: int) -> list[dict]:
    cases = [
        (SEED_EXAMPLE, 0.8, 5, None),
        ("seed 002 ch11 Exercise 1", 0.75, 4, 0.05),
        (
            f"speculative_demo model (-a {args.acceptance_rate:g})",
            demo.per_token_acceptance(args.acceptance_rate),
            args.draft_length,
            args.draft_cost,
        ),
        (
            f"seed 000 model, optimal K (match_prob {args.match_prob:g})",
            args.match_prob,
            best_k,
            None,
        ),
    ]
    rows = []
    for name, gamma, k, cost in cases:
        e = sp.expected_tokens_per_pass(gamma, k)
        if args.seed_faithful and name == SEED_EXAMPLE:
            e = sp.seed_expected_tokens_per_pass(gamma, k)  # the seed's 3.36
        speedup = None if cost is None else sp.speedup_with_draft_cost(gamma, k, cost)
        rows.append(
            {
                "case": name,
                "gamma": gamma,
                "k": k,
                "draft_cost": cost,
                "tokens_per_pass": e,
                "speedup": speedup,
            }
        )
    return rows


def _x(v: float) -> str:
    return f"{v:.2f}x"


CLOSED_COLS = [
    Col("case", "case"),
    Col("gamma", "g", ".4f"),
    Col("k", "k"),
    Col("draft_cost", "c", "g"),
    Col("tokens_per_pass", "E[tokens]", ".5f"),
    Col("speedup", "speedup", _x),
]
SWEEP_COLS = [
    Col("k", "K"),
    Col("avg_accepted_per_round", "acc/round", ".2f"),
    Col("avg_tokens_per_round", "tok/round", ".2f"),
    Col("closed_form_tokens_per_round", "closed form", ".2f"),
    Col("avg_rounds", "rounds", ".1f"),
    Col("avg_time_ms", "time ms", ".0f"),
    Col("baseline_time_ms", "baseline ms", ".0f"),
    Col("speedup", "speedup", _x),
    Col("closed_form_speedup", "closed-form speedup", _x),
]
DEMO_COLS = [
    Col("tokens", "tokens"),
    Col("target_calls", "target calls"),
    Col("draft_calls", "draft calls"),
    Col("drafted_tokens", "drafted"),
    Col("accepted", "accepted"),
    Col("rejected", "rejected"),
    Col("bonus", "bonus"),
    Col("tokens_per_target_call", "tok/target call", ".2f"),
    Col("acceptance_rate", "acceptance", ".2%"),
    Col("speedup", "speedup", _x),
]


def run(args) -> int:
    at_most(MAX_K, "draft tokens", WHY, max_k=args.max_k)
    at_most(
        MAX_DRAWS,
        "draws",
        WHY,
        trials=args.trials,
        total_tokens=args.total_tokens,
        max_k=args.max_k,
    )
    at_most(MAX_TARGET_LENGTH, "tokens", WHY, target_length=args.target_length)
    cfg = sp.SweepConfig(
        args.total_tokens,
        args.match_prob,
        args.draft_time_ms,
        args.target_time_ms,
        args.trials,
        args.mc_seed,
    )
    ks = tuple(range(1, args.max_k + 1))
    points = sp.k_sweep(cfg, ks)
    mp_sweep = sp.match_prob_sweep(cfg, sp.MATCH_PROBS, ks)
    demo_cfg = demo.DemoConfig(
        args.draft_length, args.target_length, args.acceptance_rate, args.draft_cost, args.seed
    )
    res = demo.run_demo(demo_cfg, seed_faithful=args.seed_faithful)
    best = sp.best(points)
    perfect = sp.perfect_draft_speedup(
        best.k, args.draft_time_ms, args.target_time_ms, seed_faithful=args.seed_faithful
    )

    r = Report("simulate speculative")
    r.say(
        "jaxscale simulate speculative — draft K tokens, verify in one target pass, accept "
        "until the first mismatch"
    )
    r.mode(args.seed_faithful, FAITHFUL_WHAT)
    r.say(
        "",
        "closed form: E[tokens per target pass] = (1 - g^(k+1)) / (1 - g); with draft cost "
        "c per drafted token, speedup = E / (1 + k*c)",
    )
    r.table("closed_form", CLOSED_COLS, _closed_form_rows(args, best.k))
    r.say(
        f"seed-faithful: the example row shows the seed's 3.36 = (1 - g^k) / (1 - g); the "
        f"formula it states gives {sp.expected_tokens_per_pass(0.8, 5):.5f}."
        if args.seed_faithful
        else f"the seed prints 3.36 for its example: that is (1 - g^k) / (1 - g) = "
        f"{sp.seed_expected_tokens_per_pass(0.8, 5):.4f}, not the formula it states.",
        "",
        f"Monte-Carlo (seed 000 ex. 2): {args.total_tokens} tokens, match_prob "
        f"{args.match_prob:g}, draft {args.draft_time_ms:g} ms/token, target "
        f"{args.target_time_ms:g} ms/pass, {args.trials} trials, np.random.seed({args.mc_seed})",
    )
    r.table("k_sweep", SWEEP_COLS, [_point(p, args) for p in points])
    r.say(
        f"optimal K = {best.k} ({best.speedup:.2f}x); P(all {ks[-1]} drafts match) = "
        f"{args.match_prob ** ks[-1]:.3f}.",
        f"a perfect draft (match_prob 1) at K={best.k} would give {perfect:.2f}x "
        + (
            "(seed 000 Exercise 2: k*T/(k*d+T), without the target's own token)"
            if args.seed_faithful
            else "= (K+1)*T/(K*d+T) (seed 000 Exercise 2 prints K*T/(K*d+T))"
        ),
        "",
        "speedup by match probability (same model, one generator for the whole grid):",
    )
    r.put(optimal_k=best.k, perfect_draft_speedup=perfect)
    sweep = {str(mp): [q.speedup for q in pts] for mp, pts in mp_sweep.items()}
    r.put(match_prob_sweep=sweep)
    k_cols = [Col(f"K={k}", f"K={k}", ".2f") for k in ks]
    grid_cols = [Col("match_prob", "match_prob", "g"), *k_cols, Col("best_k", "best K")]
    grid_rows = [
        {"match_prob": mp, **{f"K={q.k}": q.speedup for q in pts}, "best_k": sp.best(pts).k}
        for mp, pts in mp_sweep.items()
    ]
    r.table(None, grid_cols, grid_rows)
    demo_record = {
        "tokens": len(res.tokens),
        "target_calls": res.target_calls,
        "draft_calls": res.draft_calls,
        "drafted_tokens": res.drafted_tokens,
        "accepted": res.accepted,
        "rejected": res.rejected,
        "bonus": res.bonus,
        "tokens_per_target_call": res.tokens_per_target_call,
        "acceptance_rate": res.acceptance_rate,
        "speedup": res.speedup,
        "preview": list(res.tokens[:20]),
    }
    r.say(
        "",
        f"speculative_demo (seed 002 ch11, Python random seed {args.seed}): "
        f"k={args.draft_length}, n={args.target_length}, a={args.acceptance_rate:g}, "
        f"draft cost {args.draft_cost:g}",
    )
    r.table(None, DEMO_COLS, [demo_record])
    r.put(demo=demo_record)
    r.say(
        "seed-faithful: no bonus token when all drafts pass; draft cost charged once per call."
        if args.seed_faithful
        else "corrected: the verify pass's next token is kept when all drafts pass (bonus); "
        "draft cost charged per drafted token.",
        f"per-token acceptance of this model: {demo.per_token_acceptance(args.acceptance_rate):.4f}"
        " = 0.45 + 0.5417*a",
    )
    if args.plot:
        from jaxscale.sim import plots

        r.say(f"\nplot written to {plots.speculative(points, mp_sweep, args.plot)}")
        r.put(plot=args.plot)
    r.emit(args)
    return 0


def _point(p: sp.SweepPoint, args) -> dict:
    return {
        "k": p.k,
        "avg_accepted_per_round": p.avg_accepted_per_round,
        "avg_tokens_per_round": p.avg_tokens_per_round,
        "avg_rounds": p.avg_rounds,
        "avg_time_ms": p.avg_time_ms,
        "baseline_time_ms": p.baseline_time_ms,
        "speedup": p.speedup,
        "closed_form_tokens_per_round": sp.expected_tokens_per_pass(p.match_prob, p.k),
        "closed_form_speedup": sp.expected_speedup_timed(
            p.match_prob, p.k, args.draft_time_ms, args.target_time_ms
        ),
    }
