"""`jaxscale calc inference`: prefill/decode latency, KV per sequence, roofline, serving memory.

Seeds: seed 001 §9 (latency), seed 003's concepts and misconceptions tables (roofline, NVLink
example), seed 002 ch8 "Memory: The Inference Bottleneck" (serving memory). Nothing here imports
jax.
"""

from jaxscale.calc import inference as inf
from jaxscale.calc.commands.common import (
    add_gpu_flags,
    add_model_flags,
    gpu_from_args,
    header,
    kv_bytes_per_token,
    model_from_args,
    ms,
    per,
    record,
)
from jaxscale.cliutil import add_command, add_output_flags, guarded, positive_int
from jaxscale.render import Col, Report, grid

FAITHFUL = "seed 001 section 9: compute-only prefill, weights-only decode, KV from d_model"
LATENCY_PROPERTIES = ("decode_per_token_s", "total_s", "tokens_per_s", "kv_total_bytes")
COLS = [
    Col("scenario", "Scenario"),
    Col("prompt_len", "Prompt"),
    Col("gen_len", "Gen"),
    Col("batch_size", "Batch"),
    Col("prefill_s", "Prefill ms", ms),
    Col("decode_per_token_s", "Decode ms/tok", ms),
    Col("decode_total_s", "Decode ms", ms),
    Col("total_s", "Total ms", ms),
    Col("tokens_per_s", "Tokens/s", ".1f"),
    Col("kv_per_seq_bytes", "KV/seq GB", per(1e9, ".3f")),
    Col("kv_total_bytes", "KV total GB", per(1e9, ".3f")),
    Col("prefill_bound", "Prefill"),
    Col("decode_bound", "Decode"),
]


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "inference",
        help="prefill/decode latency, throughput, KV per sequence, roofline, serving memory",
        description="Seed 001 section 9 latency model on a roofline. Without --prompt-len, "
        "--gen-len or --batch-size it prints the seed's four scenarios.",
        example="jaxscale calc inference --model llama-7b --gpu a100 --prompt-len 512 --tp 2",
    )
    add_model_flags(p)
    add_gpu_flags(p)
    p.add_argument("--prompt-len", type=positive_int, help="prompt tokens (default 100)")
    p.add_argument("--gen-len", type=positive_int, help="generated tokens (default 50)")
    p.add_argument("--batch-size", type=positive_int, help="sequences per batch (default 1)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel GPUs (ideal)")
    p.add_argument(
        "--context",
        type=positive_int,
        default=inf.SEED_SERVING_CONTEXT,
        help="tokens per request in the serving-memory table",
    )
    p.add_argument(
        "--requests",
        type=positive_int,
        default=inf.SEED_SERVING_REQUESTS,
        help="concurrent requests in the serving-memory table",
    )
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run))


def run(args) -> int:
    model, gpu, sf = model_from_args(args), gpu_from_args(args), args.seed_faithful
    kv_tok = kv_bytes_per_token(model, sf)
    if args.prompt_len or args.gen_len or args.batch_size:
        scenarios = [("Custom", args.prompt_len or 100, args.gen_len or 50, args.batch_size or 1)]
    else:
        scenarios = inf.SEED_SCENARIOS
    roof = (gpu.flops_per_s, gpu.hbm_bytes_per_s)
    rows = []
    for name, prompt, gen, batch in scenarios:
        lat = inf.inference_latency(
            model.n_params,
            prompt,
            gen,
            batch,
            kv_bytes_per_token=kv_tok,
            flops_per_s=roof[0],
            hbm_bytes_per_s=roof[1],
            tp=args.tp,
            seed_faithful=sf,
        )
        rows.append(
            record(
                lat,
                *LATENCY_PROPERTIES,
                scenario=name,
                prefill_bound=inf.bound(lat.prefill_intensity, *roof),
                decode_bound=inf.bound(lat.decode_intensity, *roof),
            )
        )
    ridge = inf.ridge_point(*roof)
    a100 = inf.ridge_point(inf.A100.flops_per_s, inf.A100.hbm_bytes_per_s)
    link = inf.transfer_cost()
    mem = inf.serving_memory(model.n_params, kv_tok, args.context, args.requests, seed_faithful=sf)
    weights_gb = model.n_params * inf.SEED_WEIGHT_BYTES / 1e9

    r = Report("inference").say(f"Inference latency: {header(model, gpu)}, tp={args.tp}")
    r.mode(sf, FAITHFUL).say(f"KV per token: {kv_tok:,} B", "")
    r.put(
        model=model.name,
        n_params=model.n_params,
        gpu=gpu.name,
        tp=args.tp,
        kv_bytes_per_token=kv_tok,
    )
    r.table("scenarios", COLS, rows)
    r.say("Prefill/Decode: which roofline limit binds (compute or memory)")
    if weights_gb > args.tp * gpu.memory_gb:
        r.say(
            f"note: {weights_gb:.1f} GB of weights exceed {args.tp} x {gpu.memory_gb:g} GB; "
            "these latencies need --tp large enough to hold them"
        )
    r.say(
        "",
        f"Roofline: ridge point {ridge:.1f} FLOP/B on {gpu.name}; seed 003's A100 (312 TFLOPS, "
        f"2 TB/s): {a100:.0f} FLOP/B. Below the ridge a step is memory-bound.",
        f"Moving 1 GB over 600 GB/s NVLink: {link.seconds * 1e3:.2f} ms = "
        f"{link.flops_forgone / 1e9:.0f} GFLOP of A100 compute (seed 003: ~1.7 ms, "
        "~530 GFLOP)",
        "",
        f"Serving memory: {args.requests} requests x {args.context} tokens (seed 002 ch8)",
        grid(
            ["Component", "GB"],
            [
                ["Weights (FP16)", f"{mem.weights_bytes / 1e9:.1f}"],
                ["KV per request", f"{mem.kv_per_request_bytes / 1e9:.2f}"],
                [f"KV x {args.requests}", f"{mem.kv_total_bytes / 1e9:.1f}"],
                ["Activations", f"{mem.activations_bytes / 1e9:.1f}"],
                ["Total", f"{mem.total_bytes / 1e9:.1f}"],
            ],
        ),
    )
    if sf:
        r.say("KV per request is ch8's '~2 GB for 32K'; ch9's formula: 10.74 GB")
    r.put(ridge_flop_per_byte=ridge, a100_ridge_flop_per_byte=a100, nvlink_1gb=record(link))
    r.put(serving_memory=record(mem, "kv_total_bytes", "total_bytes", context=args.context))
    r.emit(args)
    return 0
