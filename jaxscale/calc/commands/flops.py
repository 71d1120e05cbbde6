"""`jaxscale calc flops`: per-token transformer FLOPs, forward/backward split and the 6N check
(seed 001 §5)."""

from jaxscale.calc import flops as fl
from jaxscale.calc.models import SHAPE_PRESETS, get_model
from jaxscale.cliutil import add_command, add_output_flags, arg_type, guarded, positive_int
from jaxscale.render import Col, Report, fmt_count, grid

# Seed 001 §5: the FLOPs example's "GPT-3 style" configuration.
SEED_FLOPS_CONFIG = {"d_model": 12288, "layers": 96, "seq_len": 2048, "vocab": 50257}
FAITHFUL_FLOPS = "the seed's attention term 2*d_model*seq_len^2 per token (seed 001 §5)"


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
        help=f"a preset instead of the shape flags: {', '.join(SHAPE_PRESETS)}",
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
    p.set_defaults(func=guarded(run))


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


def run(args) -> int:
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
    r.say("Verification of the 6N rule (seq_len 1, vocab 50000, as seed 001 §5 does)")
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
