"""`jaxscale calc flops|chinchilla|moe` (shared/seeds/001_*.txt §2, §3, §5)."""

from jaxscale.calc import flops as fl
from jaxscale.calc import scaling_laws as sl
from jaxscale.calc.models import MODELS, get_model
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    arg_type,
    comma_list,
    guarded,
    parse_count,
    positive_float,
    positive_int,
)
from jaxscale.render import Col, Report, figure, fmt_count, grid

# shared/seeds/001_*.txt L456-461: the FLOPs example's "GPT-3 style" configuration.
SEED_FLOPS_CONFIG = {"d_model": 12288, "layers": 96, "seq_len": 2048, "vocab": 50257}
FAITHFUL_FLOPS = "the seed's attention term 2*d_model*seq_len^2 per token (001 L422-425)"


def billions(x: float) -> str:
    return f"{x / 1e9:,.1f}B"


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "flops",
        help="per-token transformer FLOPs, forward/backward split, the 6N check",
        description="FLOPs per token of a decoder-only transformer (default: seed 001's GPT-3 "
        "style model) and the table verifying the 6N rule.",
        example="jaxscale calc flops --model llama-7b --attention --causal",
    )
    p.add_argument(
        "--model",
        type=arg_type(get_model),
        help=f"a preset instead of the shape flags: {', '.join(MODELS)}",
    )
    p.add_argument(
        "--d-model", type=positive_int, default=SEED_FLOPS_CONFIG["d_model"], help="hidden size"
    )
    p.add_argument(
        "--layers",
        type=positive_int,
        default=SEED_FLOPS_CONFIG["layers"],
        help="transformer layers",
    )
    p.add_argument(
        "--seq-len", type=positive_int, default=SEED_FLOPS_CONFIG["seq_len"], help="sequence length"
    )
    p.add_argument(
        "--vocab", type=positive_int, default=SEED_FLOPS_CONFIG["vocab"], help="vocabulary size"
    )
    p.add_argument("--d-ff", type=positive_int, help="MLP width (default 4 * d_model)")
    p.add_argument("--attention", action="store_true", help="count QK^T and AV matmuls")
    p.add_argument("--causal", action="store_true", help="halve the attention-score FLOPs")
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run_flops))

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
    p.set_defaults(func=guarded(run_chinchilla))

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
    p.set_defaults(func=guarded(run_moe))


# (JSON key, TransformerFlops attribute, row label) of the per-token count, in printed order.
FLOPS_ROWS = (
    ("attention_projections_per_layer", "attention_projections", "Attention projections / layer"),
    ("attention_scores_per_layer", "attention_scores", "Attention scores / layer"),
    ("mlp_per_layer", "mlp", "MLP / layer"),
    ("fwd_per_layer", "fwd_per_layer", "FWD per layer"),
    ("unembedding", "unembedding", "Unembedding (logits)"),
    ("fwd_total", "fwd_total", "FWD total"),
    ("bwd_total", "bwd_total", "BWD total"),
    ("step_total", "step_total", "Full step"),
)
SIX_N_COLS = [
    Col("model", "Model"),
    Col("n_params", "Params", fmt_count),
    Col("detailed", "Detailed", ",.0f"),
    Col("six_n", "6N", ",.0f"),
    Col("ratio", "Ratio", ".2f"),
]


def run_flops(args) -> int:
    if m := args.model:
        shape = (m.name, m.d_model, m.n_layers, m.max_seq_len, m.vocab_size, args.d_ff or m.d_ff)
    else:
        shape = (
            "GPT-3 style model",
            args.d_model,
            args.layers,
            args.seq_len,
            args.vocab,
            args.d_ff,
        )
    name, d_model, layers, seq_len, vocab, d_ff = shape
    f = fl.transformer_flops_per_token(
        d_model,
        layers,
        seq_len,
        vocab,
        d_ff=d_ff,
        include_attention=args.attention,
        causal=args.causal,
        seed_faithful=args.seed_faithful,
    )
    counts = {key: getattr(f, attr) for key, attr, _ in FLOPS_ROWS}
    rows = [[head, f"{counts[key]:,.0f}"] for key, _, head in FLOPS_ROWS]
    if not args.attention:
        rows[1][1] = "not counted (--attention)"
    rows += [
        ["BWD / FWD ratio", f"{f.bwd_total / f.fwd_total:.1f}x"],
        ["Step / FWD ratio", f"{f.step_total / f.fwd_total:.1f}x"],
    ]
    checks = [fl.check_six_n(*spec) for spec in fl.SIX_N_MODELS]
    r = Report("flops")
    r.say(
        f"FLOPs per token, {name}: d_model={d_model}, layers={layers}, seq_len={seq_len}, "
        f"vocab={vocab}"
    )
    r.mode(args.seed_faithful, FAITHFUL_FLOPS)
    r.put(model=name, d_model=d_model, layers=layers, seq_len=seq_len, vocab=vocab, **counts)
    r.say("", grid(["Component", "FLOPs per token"], rows), "")
    r.say("Verification of the 6N rule (seq_len 1, vocab 50000, as shared/seeds/001 L478-500)")
    r.table(
        "six_n_check",
        SIX_N_COLS,
        [
            {
                "model": c.name,
                "n_params": c.n_params,
                "detailed": c.detailed_flops,
                "six_n": c.six_n_flops,
                "ratio": c.ratio,
            }
            for c in checks
        ],
    )
    r.emit(args)
    return 0


CHINCHILLA_COLS = [
    Col("model", "Model"),
    Col("n_params", "Params", billions),
    Col("optimal_tokens", "Optimal tokens", billions),
    Col("compute_flops", "Compute (ZettaFLOPs)", lambda c: f"{c / sl.ZETTA:,.2f}"),
]


def run_chinchilla(args) -> int:
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


MOE_COLS = [
    Col("model", "Model"),
    Col("total_params", "Total", billions),
    Col("active_params", "Active", billions),
    Col("active_fraction", "Active/total", lambda x: f"{x * 100:.1f}%"),
    Col("optimal_tokens", "Optimal tokens", billions),
]


def run_moe(args) -> int:
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


def _plot_chinchilla(path, records: list[dict], tokens_per_param: float) -> None:
    import numpy as np

    params = np.logspace(9, 12, 50)  # 1B .. 1000B, as shared/seeds/001 L115
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
