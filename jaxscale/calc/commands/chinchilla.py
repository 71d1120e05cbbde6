"""`jaxscale calc chinchilla`: compute-optimal tokens and 6ND compute (seed 001 §2)."""

from jaxscale.calc import scaling_laws as sl
from jaxscale.calc.commands.common import billions
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    comma_list,
    guarded,
    parse_count,
    positive_float,
)
from jaxscale.render import Col, Report, figure, fmt_count


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "chinchilla",
        help="compute-optimal tokens (20 per parameter) and compute budget",
        description="Chinchilla-optimal training tokens and 6ND compute (seed 001 §2).",
        example="jaxscale calc chinchilla --params 7B,70B --tokens 2T --plot chinchilla.png",
    )
    p.add_argument(
        "--params",
        type=comma_list(parse_count),
        help="parameter counts, e.g. 7B,70B (default: the seed's models)",
    )
    p.add_argument(
        "--tokens-per-param", type=positive_float, default=20.0, help="the compute-optimal ratio"
    )
    p.add_argument("--tokens", type=parse_count, help="tokens actually trained on, for the ratio")
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run))


CHINCHILLA_COLS = [
    Col("model", "Model"),
    Col("n_params", "Params", billions),
    Col("optimal_tokens", "Optimal tokens", billions),
    Col("compute_flops", "Compute (ZettaFLOPs)", lambda c: f"{c / sl.ZETTA:,.2f}"),
]


def run(args) -> int:
    if args.params:
        models = [(fmt_count(n), n) for n in args.params]
        actual = [(name, n, args.tokens) for name, n in models] if args.tokens else []
    else:
        models = list(sl.CHINCHILLA_MODELS)
        actual = list(sl.ACTUAL_TRAINING_TOKENS)
        if args.tokens:
            raise ValueError("--tokens needs --params")
    for _, n in models:
        if not n * args.tokens_per_param > 0:
            raise ValueError(
                f"--params {n:g} x --tokens-per-param {args.tokens_per_param:g} "
                "underflows to 0 tokens"
            )
    chin = [sl.chinchilla_row(name, n, args.tokens_per_param) for name, n in models]
    r = Report("chinchilla", tokens_per_param=args.tokens_per_param)
    r.say(
        f"Compute-optimal training tokens ({args.tokens_per_param:g} per parameter; "
        "compute = 6 * N * D)",
        "",
    )
    records = r.table(
        "models",
        CHINCHILLA_COLS,
        [
            {
                "model": c.name,
                "n_params": c.n_params,
                "optimal_tokens": c.optimal_tokens,
                "compute_flops": c.compute_flops,
            }
            for c in chin
        ],
    )
    r.say("")
    ratios = [
        {
            "model": name,
            "n_params": n,
            "tokens": tokens,
            "tokens_per_param": sl.tokens_per_param(n, tokens),
        }
        for name, n, tokens in actual
    ]
    r.put(actual=ratios)
    for x in ratios:
        ratio = x["tokens_per_param"]
        verdict = "undertrained" if ratio < args.tokens_per_param else "overtrained for quality"
        r.say(
            f"{x['model']} trained on {billions(x['tokens'])} tokens = {ratio:.1f}x ratio "
            f"({verdict})"
        )
    if args.plot:
        _plot_chinchilla(args.plot, records, args.tokens_per_param)
        r.say(f"plot written to {args.plot}")
    r.emit(args)
    return 0


def _plot_chinchilla(path, records: list[dict], tokens_per_param: float) -> None:
    import numpy as np

    params = np.logspace(9, 12, 50)  # 1B .. 1000B, as seed 001 §2's plot
    with figure(path, 1, 2, figsize=(14, 5)) as (fig, (ax1, ax2)):
        ax1.loglog(params / 1e9, tokens_per_param * params / 1e9, "b-", label="Chinchilla optimal")
        ax1.loglog(params / 1e9, params / 1e9, "r--", alpha=0.5, label="1x ratio")
        points: dict[tuple, list[str]] = {}  # models at one point share a label (70B twice)
        for x in records:
            xy = (x["n_params"] / 1e9, x["optimal_tokens"] / 1e9)
            points.setdefault(xy, []).append(x["model"])
        for xy, names in points.items():
            ax1.scatter(*xy, s=60, zorder=5)
            ax1.annotate(
                "\n".join(names),
                xy,
                xytext=(8, -4),
                textcoords="offset points",
                va="top",
                fontsize=8,
            )
        ax1.set_xlabel("Model parameters (billions)")
        ax1.set_ylabel("Training tokens (billions)")
        ax1.set_title(f"Chinchilla optimal: {tokens_per_param:g} tokens per parameter")
        ax1.legend()
        ax2.loglog(params / 1e9, 6 * params * tokens_per_param * params / sl.ZETTA, "g-")
        ax2.set_xlabel("Model parameters (billions)")
        ax2.set_ylabel("Compute budget (ZettaFLOPs)")
        ax2.set_title("Total compute for Chinchilla-optimal training")
