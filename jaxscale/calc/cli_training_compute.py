"""`jaxscale calc flops|chinchilla|moe` (shared/seeds/001_*.txt §2, §3, §5)."""

from jaxscale.calc import flops as fl
from jaxscale.calc import scaling_laws as sl
from jaxscale.calc.models import get_model
from jaxscale.calc.training_format import (
    add_output_flags,
    arg_type,
    comma_list,
    emit,
    format_count,
    format_table,
    guarded,
    mode_line,
    parse_count,
    positive_float,
    positive_int,
)

# shared/seeds/001_*.txt L456-461: the FLOPs example's "GPT-3 style" configuration.
SEED_FLOPS_CONFIG = {"d_model": 12288, "layers": 96, "seq_len": 2048, "vocab": 50257}
FAITHFUL_FLOPS = "the seed's attention term 2*d_model*seq_len^2 per token (001 L422-425)"


def billions(x: float) -> str:
    return f"{x / 1e9:,.1f}B"


def add_parsers(calc_sub) -> None:
    p = calc_sub.add_parser(
        "flops",
        help="per-token transformer FLOPs, forward/backward split, the 6N check",
        description="FLOPs per token of a decoder-only transformer (default: seed 001's GPT-3 "
        "style model) and the table verifying the 6N rule.",
    )
    p.add_argument("--model", type=arg_type(get_model), help="a preset instead of the shape flags")
    p.add_argument("--d-model", type=positive_int, default=SEED_FLOPS_CONFIG["d_model"])
    p.add_argument("--layers", type=positive_int, default=SEED_FLOPS_CONFIG["layers"])
    p.add_argument("--seq-len", type=positive_int, default=SEED_FLOPS_CONFIG["seq_len"])
    p.add_argument("--vocab", type=positive_int, default=SEED_FLOPS_CONFIG["vocab"])
    p.add_argument("--d-ff", type=positive_int, help="MLP width (default 4 * d_model)")
    p.add_argument("--attention", action="store_true", help="count QK^T and AV matmuls")
    p.add_argument("--causal", action="store_true", help="halve the attention-score FLOPs")
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run_flops))

    p = calc_sub.add_parser(
        "chinchilla",
        help="compute-optimal tokens (20 per parameter) and compute budget",
        description="Chinchilla-optimal training tokens and 6ND compute (seed 001 §2).",
    )
    p.add_argument("--params", type=comma_list(parse_count), help="e.g. 7B,70B (default: seed's)")
    p.add_argument("--tokens-per-param", type=positive_float, default=20.0)
    p.add_argument("--tokens", type=parse_count, help="tokens actually trained on, for the ratio")
    add_output_flags(p, plot=True)
    p.set_defaults(func=guarded(run_chinchilla))

    p = calc_sub.add_parser(
        "moe",
        help="MoE total vs active parameters and optimal tokens",
        description="Total and active parameters of mixture-of-experts models (seed 001 §3). "
        "Give all of --shared --experts --expert-size --top-k for a custom model.",
    )
    p.add_argument("--shared", type=parse_count, help="parameters every token uses, e.g. 5B")
    p.add_argument("--experts", type=positive_int, help="number of experts")
    p.add_argument("--expert-size", type=parse_count, help="parameters of one expert, e.g. 7B")
    p.add_argument("--top-k", type=positive_int, help="experts per token")
    p.add_argument("--tokens-per-param", type=positive_float, default=20.0)
    add_output_flags(p)
    p.set_defaults(func=guarded(run_moe))


def run_flops(args) -> int:
    if args.model:
        m = args.model
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
        include_attention=args.attention,
        causal=args.causal,
        d_ff=d_ff,
        seed_faithful=args.seed_faithful,
    )
    scores = f"{f.attention_scores:,.0f}" if args.attention else "not counted (--attention)"
    rows = [
        ["Attention projections / layer", f"{f.attention_projections:,.0f}"],
        ["Attention scores / layer", scores],
        ["MLP / layer", f"{f.mlp:,.0f}"],
        ["FWD per layer", f"{f.fwd_per_layer:,.0f}"],
        ["Unembedding (logits)", f"{f.unembedding:,.0f}"],
        ["FWD total", f"{f.fwd_total:,.0f}"],
        ["BWD total", f"{f.bwd_total:,.0f}"],
        ["Full step", f"{f.step_total:,.0f}"],
        ["BWD / FWD ratio", f"{f.bwd_total / f.fwd_total:.1f}x"],
        ["Step / FWD ratio", f"{f.step_total / f.fwd_total:.1f}x"],
    ]
    checks = [fl.check_six_n(*spec) for spec in fl.SIX_N_MODELS]
    check_rows = [
        [c.name, format_count(c.n_params), f"{c.detailed_flops:,.0f}", f"{c.six_n_flops:,.0f}"]
        + [f"{c.ratio:.2f}"]
        for c in checks
    ]
    lines = [
        f"FLOPs per token, {name}: d_model={d_model}, layers={layers}, seq_len={seq_len}, "
        f"vocab={vocab}",
        mode_line(args.seed_faithful, FAITHFUL_FLOPS),
        "",
        format_table(["Component", "FLOPs per token"], rows),
        "",
        "Verification of the 6N rule (seq_len 1, vocab 50000, as shared/seeds/001 L478-500)",
        format_table(["Model", "Params", "Detailed", "6N", "Ratio"], check_rows),
    ]
    report = {
        "command": "flops",
        "mode": "seed-faithful" if args.seed_faithful else "corrected",
        "model": name,
        "d_model": d_model,
        "layers": layers,
        "seq_len": seq_len,
        "vocab": vocab,
        "attention_projections_per_layer": f.attention_projections,
        "attention_scores_per_layer": f.attention_scores,
        "mlp_per_layer": f.mlp,
        "fwd_per_layer": f.fwd_per_layer,
        "unembedding": f.unembedding,
        "fwd_total": f.fwd_total,
        "bwd_total": f.bwd_total,
        "step_total": f.step_total,
        "six_n_check": [
            {"model": c.name, "n_params": c.n_params, "detailed": c.detailed_flops}
            | {"six_n": c.six_n_flops, "ratio": c.ratio}
            for c in checks
        ],
    }
    emit(args, report, lines)
    return 0


def run_chinchilla(args) -> int:
    if args.params:
        models = [(format_count(n), n) for n in args.params]
        actual = [(name, n, args.tokens) for name, n in models] if args.tokens else []
    else:
        models = list(sl.CHINCHILLA_MODELS)
        actual = list(sl.ACTUAL_TRAINING_TOKENS)
        if args.tokens:
            raise ValueError("--tokens needs --params")
    chin = [sl.chinchilla_row(name, n, args.tokens_per_param) for name, n in models]
    rows = [
        [r.name, billions(r.n_params), billions(r.optimal_tokens), f"{r.compute_zettaflops:,.2f}"]
        for r in chin
    ]
    lines = [
        f"Compute-optimal training tokens ({args.tokens_per_param:g} per parameter; "
        "compute = 6 * N * D)",
        "",
        format_table(["Model", "Params", "Optimal tokens", "Compute (ZettaFLOPs)"], rows),
        "",
    ]
    ratios = []
    for name, n, tokens in actual:
        ratio = sl.tokens_per_param(n, tokens)
        verdict = "undertrained" if ratio < args.tokens_per_param else "overtrained for quality"
        lines.append(
            f"{name} trained on {billions(tokens)} tokens = {ratio:.1f}x ratio ({verdict})"
        )
        ratios.append({"model": name, "n_params": n, "tokens": tokens, "tokens_per_param": ratio})
    report = {
        "command": "chinchilla",
        "tokens_per_param": args.tokens_per_param,
        "models": [
            {"model": r.name, "n_params": r.n_params, "optimal_tokens": r.optimal_tokens}
            | {"compute_flops": r.compute_flops}
            for r in chin
        ],
        "actual": ratios,
    }
    if args.plot:
        _plot_chinchilla(args.plot, chin, args.tokens_per_param)
        lines.append(f"plot written to {args.plot}")
    emit(args, report, lines)
    return 0


def run_moe(args) -> int:
    custom = (args.shared, args.experts, args.expert_size, args.top_k)
    if any(v is not None for v in custom):
        if any(v is None for v in custom):
            raise ValueError(
                "a custom MoE needs all of --shared, --experts, --expert-size, --top-k"
            )
        models = {"custom": sl.MoEConfig(args.shared, args.experts, args.expert_size, args.top_k)}
    else:
        models = sl.MOE_MODELS
    rows, report_rows = [], []
    for name, m in models.items():
        tokens = m.optimal_tokens(args.tokens_per_param)
        rows.append(
            [name, billions(m.total_params), billions(m.active_params)]
            + [f"{m.active_fraction * 100:.1f}%", billions(tokens)]
        )
        report_rows.append(
            {"model": name, "total_params": m.total_params, "active_params": m.active_params}
            | {"active_fraction": m.active_fraction, "optimal_tokens": tokens}
        )
    lines = [
        "Mixture of experts: total = shared + experts * expert size; active = shared + top_k *"
        " expert size",
        f"Optimal tokens = {args.tokens_per_param:g} x ACTIVE parameters",
        "",
        format_table(["Model", "Total", "Active", "Active/total", "Optimal tokens"], rows),
        "",
        "Compute follows the active parameters, memory the total.",
    ]
    emit(args, {"command": "moe", "models": report_rows}, lines)
    return 0


def _plot_chinchilla(path, rows, tokens_per_param) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    params = np.logspace(9, 12, 50)  # 1B .. 1000B, as shared/seeds/001 L115
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    ax1.loglog(params / 1e9, tokens_per_param * params / 1e9, "b-", label="Chinchilla optimal")
    ax1.loglog(params / 1e9, params / 1e9, "r--", alpha=0.5, label="1x ratio")
    for r in rows:
        ax1.scatter(r.n_params / 1e9, r.optimal_tokens / 1e9, s=60, zorder=5)
        ax1.annotate(r.name, (r.n_params / 1e9, r.optimal_tokens / 1e9), fontsize=8)
    ax1.set_xlabel("Model parameters (billions)")
    ax1.set_ylabel("Training tokens (billions)")
    ax1.set_title(f"Chinchilla optimal: {tokens_per_param:g} tokens per parameter")
    ax1.legend()
    ax2.loglog(params / 1e9, 6 * params * tokens_per_param * params / sl.ZETTA, "g-")
    ax2.set_xlabel("Model parameters (billions)")
    ax2.set_ylabel("Compute budget (ZettaFLOPs)")
    ax2.set_title("Total compute for Chinchilla-optimal training")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
