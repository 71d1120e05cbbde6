"""`jaxscale simulate json`: seed 002's json_constraint_demo.py (17-token JSON vocabulary)."""

import random

from jaxscale.cliutil import add_command, add_output_flags, guarded, non_negative_int, positive_int
from jaxscale.render import Col, Report
from jaxscale.sim import json_demo as jd

FAITHFUL_WHAT = (
    "the seed's cut at max_tokens, which leaves 685 of 5000 documents unfinished, "
    "and its constrained run reseeded with 42 whatever --seed says"
)


def add_parser(sim_sub) -> None:
    p = add_command(
        sim_sub,
        "json",
        help="constrained decoding: seed 002's 17-token JSON automaton, masking trace, fuzz",
        description="The seed's json_constraint_demo.py: a pushdown automaton over 17 JSON "
        "tokens lists the valid next tokens; random.choice picks among them. Corrected, the "
        "mask also drops tokens after which the document could not be closed within max_tokens, "
        "so every output parses; --seed-faithful cuts at max_tokens as the seed does.",
        example="jaxscale simulate json --seed 42 --fuzz 5000",
    )
    p.add_argument("--seed", type=non_negative_int, default=42, help="random.seed of the demo")
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=15,
        help="tokens of the constrained generation (the seed's 15)",
    )
    p.add_argument(
        "--fuzz",
        type=positive_int,
        default=5000,
        help="seeds of the validity check, at most 100,000",
    )
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    if args.fuzz > 100_000:
        raise ValueError("--fuzz: at most 100,000 seeds (a larger run is slow)")
    r = Report("simulate json")
    r.say("jaxscale simulate json — grammar-constrained sampling over the seed's 17 tokens")
    r.mode(args.seed_faithful, FAITHFUL_WHAT)
    rng = random.Random(args.seed)
    # the seed's demonstrate_token_masking: at most 10 steps, one generator for the whole demo
    out, trace, _ = jd.generate(rng, 10, args.seed_faithful)
    steps = [
        {
            "step": i,
            "state": st,
            "valid": " ".join(jd.VOCAB[t] for t in valid),
            "masked": len(jd.VOCAB) - len(valid),
            "chosen": jd.VOCAB[tok],
        }
        for i, (st, valid, tok) in enumerate(trace)
    ]
    r.table(
        "masking",
        [
            Col("step", "step"),
            Col("state", "state"),
            Col("valid", "valid tokens"),
            Col("masked", "masked"),
            Col("chosen", "chosen"),
        ],
        steps,
        title="token masking (at most 10 steps)",
    )
    r.say(f"generated: {''.join(out)}", "")
    free = "".join(rng.choice(jd.VOCAB) for _ in range(10))
    # the seed reseeds 42 here whatever --seed says; corrected, --seed is honoured
    seed = 42 if args.seed_faithful else args.seed
    constrained, _, _ = jd.generate(random.Random(seed), args.max_tokens, args.seed_faithful)
    text = "".join(constrained)
    r.data["unconstrained"], r.data["constrained"] = free, text
    r.say(
        f"unconstrained (10 random tokens): {free}   parses: {jd.parses(free)}",
        f"constrained (seed {seed}, max_tokens {args.max_tokens}): {text}   parses: "
        f"{jd.parses(text)}",
        "",
    )
    rows = [
        dict(jd.fuzz(args.fuzz, args.max_tokens, faithful), mode=name)
        for name, faithful in (("seed-faithful", True), ("corrected", False))
    ]
    r.table(
        "fuzz",
        [
            Col("mode", "mode"),
            Col("seeds", "seeds"),
            Col("complete", "complete"),
            Col("truncated", "cut unfinished"),
            Col("parse", "json.loads ok"),
        ],
        rows,
        title=f"every seed 0..{args.fuzz - 1}, max_tokens {args.max_tokens}",
    )
    r.emit(args)
    return 0
