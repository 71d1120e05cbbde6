"""`jaxscale calc moe`: MoE total vs active parameters and optimal tokens (seed 001 §3)."""

from jaxscale.calc import scaling_laws as sl
from jaxscale.calc.commands.common import billions
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    guarded,
    parse_count,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "moe",
        help="MoE total vs active parameters and optimal tokens",
        description="Total and active parameters of mixture-of-experts models (seed 001 §3). "
        "Give all of --shared --experts --expert-size --top-k for a custom model.",
        example="jaxscale calc moe --shared 5B --experts 8 --expert-size 7B --top-k 2",
    )
    p.add_argument("--shared", type=parse_count, help="parameters every token uses, e.g. 5B")
    p.add_argument("--experts", type=positive_int, help="number of experts")
    p.add_argument("--expert-size", type=parse_count, help="parameters of one expert, e.g. 7B")
    p.add_argument("--top-k", type=positive_int, help="experts per token")
    p.add_argument(
        "--tokens-per-param",
        type=positive_float,
        default=20.0,
        help="optimal tokens per active parameter",
    )
    add_output_flags(p)
    p.set_defaults(func=guarded(run))


MOE_COLS = [
    Col("model", "Model"),
    Col("total_params", "Total", billions),
    Col("active_params", "Active", billions),
    Col("active_fraction", "Active/total", lambda x: f"{x * 100:.1f}%"),
    Col("optimal_tokens", "Optimal tokens", billions),
]


def run(args) -> int:
    custom = (args.shared, args.experts, args.expert_size, args.top_k)
    if any(v is not None for v in custom):
        if any(v is None for v in custom):
            raise ValueError(
                "a custom MoE needs all of --shared, --experts, --expert-size, --top-k"
            )
        if args.top_k > args.experts:
            raise ValueError(f"--top-k {args.top_k} exceeds --experts {args.experts}")
        models = {"custom": sl.MoEConfig(*custom)}
    else:
        models = sl.MOE_MODELS
    r = Report("moe")
    r.say(
        "Mixture of experts: total = shared + experts * expert size; active = shared + top_k *"
        " expert size",
        f"Optimal tokens = {args.tokens_per_param:g} x ACTIVE parameters",
        "",
    )
    r.table(
        "models",
        MOE_COLS,
        [
            {
                "model": name,
                "total_params": m.total_params,
                "active_params": m.active_params,
                "active_fraction": m.active_fraction,
                "optimal_tokens": m.optimal_tokens(args.tokens_per_param),
            }
            for name, m in models.items()
        ],
    )
    r.say("", "Compute follows the active parameters, memory the total.")
    r.emit(args)
    return 0
