"""`jaxscale calc kv` and `jaxscale calc prefix`: KV cache size, capacity, paging, prefix sharing.

Ports of shared/seeds/002_*.txt ch9 `kv_cache_calculator.py` (L7104-7418) and
`prefix_sharing_demo.py` (L7483-7782). Nothing here imports jax.
"""

from jaxscale.calc import kv
from jaxscale.calc import prefix as px
from jaxscale.calc.cli_serving import mode_name, record
from jaxscale.calc.gpus import GPUS, get_gpu
from jaxscale.calc.training_format import (
    add_output_flags,
    comma_list,
    emit,
    format_table,
    guarded,
    mode_line,
    non_negative_float,
    positive_float,
    positive_int,
)

KV_FAITHFUL = "the seed's single-GPU capacity, where its default 70B does not fit (defect 8)"


def add_parsers(calc_sub) -> None:
    p = calc_sub.add_parser(
        "kv",
        help="KV cache per token/request, capacity with and without paging, fragmentation",
        description="The seed's KV cache calculator. Capacity runs on one GPU when the model "
        "fits there, else on one 8-GPU node (tensor parallel), unless --num-gpus says otherwise.",
    )
    p.add_argument("--model", "-m", default="llama-70b", choices=list(kv.MODELS))
    p.add_argument("--gpu", "-g", default="h100", choices=list(GPUS))
    p.add_argument("--custom", action="store_true", help="use --layers/--heads/--dim instead")
    p.add_argument("--layers", type=positive_int, default=80, help="with --custom (default 80)")
    p.add_argument("--heads", type=positive_int, default=8, help="K/V heads, with --custom")
    p.add_argument("--dim", type=positive_int, default=128, help="head dim, with --custom")
    p.add_argument(
        "--model-size-gb",
        type=positive_float,
        help="FP16 weights in GB (default: the seed's size; 14 for --custom)",
    )
    p.add_argument("--num-gpus", type=positive_int, help="GPUs sharing the model (TP)")
    p.add_argument(
        "--overhead-gb",
        type=non_negative_float,
        default=kv.SEED_OVERHEAD_GB_PER_GPU,
        help="runtime overhead per GPU (default 2, as the seed)",
    )
    p.add_argument(
        "--contexts",
        type=comma_list(positive_int),
        default=list(kv.SEED_CONTEXTS),
        help="context lengths for the capacity table (default 2048,4096,8192,32768)",
    )
    p.add_argument("--dtype-bytes", type=positive_int, default=2, help="bytes per KV value")
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(_run_kv))

    p = calc_sub.add_parser(
        "prefix",
        help="prefix sharing (RadixCache): trie demo, system-prompt and few-shot savings",
        description="The seed's prefix-sharing demo: savings = 1 - (S + n*U) / (n*(S + U)).",
    )
    p.add_argument("--num-requests", "-n", type=positive_int, default=100)
    p.add_argument("--system-prompt-len", type=positive_int, default=500)
    p.add_argument("--user-prompt-len", type=positive_int, default=100)
    p.add_argument(
        "--model",
        default="llama-70b",
        choices=list(kv.MODELS),
        help="whose KV bytes per token (default llama-70b, 327,680 B, as the seed)",
    )
    add_output_flags(p)
    p.set_defaults(func=guarded(_run_prefix))


def _run_kv(args) -> int:
    sf, gpu = args.seed_faithful, get_gpu(args.gpu)
    if sf and args.num_gpus:
        raise ValueError(
            "--seed-faithful reproduces the seed's single-GPU capacity; drop --num-gpus"
        )
    if args.custom:
        model = kv.custom_model(args.layers, args.heads, args.dim, args.model_size_gb)
    else:
        model = kv.get_model(args.model)
        if args.model_size_gb:
            model = kv.KvModel(
                model.name, model.num_layers, model.num_kv_heads, model.head_dim, args.model_size_gb
            )
    models = list(kv.MODELS.values()) + ([model] if args.custom else [])
    comparison, comparison_json = [], []
    for m in models:
        per_token = kv.model_kv_bytes_per_token(m, args.dtype_bytes)
        at = [per_token * c for c in kv.COMPARISON_CONTEXTS]
        comparison.append(
            [m.name, m.num_layers, m.num_kv_heads, m.head_dim, kv.format_binary(per_token)]
            + [kv.format_binary(b) for b in at]
        )
        comparison_json.append(
            record(m, kv_bytes_per_token=per_token, kv_bytes_8k=at[0], kv_bytes_32k=at[1])
        )
    fits_from = kv.min_gpus_to_fit(model.model_size_gb, gpu.memory_gb, args.overhead_gb)
    if sf:
        gpus = 1
    else:
        gpus = args.num_gpus or kv.deployment_gpus(
            model.model_size_gb, gpu.memory_gb, args.overhead_gb
        )
    capacity, capacity_json = [], []
    for ctx in args.contexts:
        c = kv.kv_capacity(model, gpu.memory_gb, ctx, gpus, args.overhead_gb, args.dtype_bytes)
        gain = c.paging_improvement
        capacity_json.append(record(c, "fits", "paging_improvement"))
        if not c.fits:
            capacity.append([ctx, "Model does not fit in GPU memory", "", "", "", "", ""])
            continue
        improvement = "n/a" if gain is None else f"{gain * 100:.0f}%"
        capacity.append([ctx, f"{c.kv_per_request_gib:.2f}", f"{c.max_tokens:,}"])
        capacity[-1] += [c.max_requests, c.requests_without_paging, c.requests_with_paging]
        capacity[-1].append(improvement)
    per_token = kv.model_kv_bytes_per_token(model, args.dtype_bytes)
    frag, frag_json = [], []
    for requests, avg, most, desc in kv.FRAGMENTATION_SCENARIOS:
        f = kv.fragmentation(per_token, requests, avg, most)
        sizes = (f.bytes_without_paging, f.bytes_with_paging, f.wasted_bytes)
        frag.append([desc, requests, avg, most] + [kv.format_binary(b) for b in sizes])
        frag[-1].append(f"{f.waste_fraction * 100:.1f}%")
        frag_json.append(record(f, "wasted_bytes", "waste_fraction", scenario=desc))
    available = kv.available_kv_gib(model.model_size_gb, gpu.memory_gb, gpus, args.overhead_gb)
    where = gpu.name if gpus == 1 else f"{gpus} x {gpu.name} (tensor parallel)"
    lines = [
        "KV cache calculator (shared/seeds/002 ch9); sizes in binary units (the seed prints "
        "KiB as 'KB', GiB as 'GB')",
        mode_line(sf, KV_FAITHFUL),
        "",
        format_table(
            ["Model", "Layers", "KV heads", "Head dim", "Per token", "@ 8K ctx", "@ 32K ctx"],
            comparison,
        ),
        "",
        f"Capacity: {model.name} ({model.model_size_gb:g} GB weights) on {where}, overhead "
        f"{args.overhead_gb:g} GB per GPU: {available:.1f} GB left for KV",
    ]
    if args.custom and args.model_size_gb is None:
        lines.append("(14 GB of weights is the seed's fallback for --custom; see --model-size-gb)")
    if fits_from is not None and fits_from > 1:
        lines.append(f"(the weights need at least {fits_from} GPUs of {gpu.memory_gb:g} GB)")
    lines += [
        format_table(
            [
                "Context",
                "KV/request GiB",
                "Max tokens",
                "Max requests",
                "Without paging",
                "With paging",
                "Improvement",
            ],
            capacity,
        ),
        "paging: 50% of the memory usable without it, 95% with it (shared/seeds/002 L7206-7208)",
        "",
        f"Fragmentation: {model.name}, every request pre-allocating its max context",
        format_table(
            [
                "Scenario",
                "Requests",
                "Avg ctx",
                "Max ctx",
                "Without paging",
                "With paging",
                "Saved",
                "Waste",
            ],
            frag,
        ),
    ]
    report = {
        "command": "kv",
        "mode": mode_name(sf),
        "models": comparison_json,
        "capacity": {
            "model": model.name,
            "model_size_gb": model.model_size_gb,
            "gpu": gpu.name,
            "gpu_memory_gb": gpu.memory_gb,
            "num_gpus": gpus,
            "min_gpus_to_fit": fits_from,
            "overhead_gb_per_gpu": args.overhead_gb,
            "kv_bytes_per_token": per_token,
            "rows": capacity_json,
        },
        "fragmentation": frag_json,
    }
    emit(args, report, lines)
    return 0


def _run_prefix(args) -> int:
    demo = px.radix_demo()
    per_token = kv.model_kv_bytes_per_token(kv.get_model(args.model))
    system = px.shared_prefix_savings(
        args.num_requests, args.system_prompt_len, args.user_prompt_len, per_token
    )
    few_shot_len = px.FEW_SHOT_EXAMPLES * px.FEW_SHOT_EXAMPLE_LEN
    few = px.shared_prefix_savings(
        args.num_requests, few_shot_len, px.FEW_SHOT_QUERY_LEN, per_token
    )

    def savings_rows(s: px.PrefixSavings) -> list[list[str]]:
        return [
            ["Without sharing", f"{s.bytes_without_sharing / 1e9:.2f} GB"],
            ["With sharing", f"{s.bytes_with_sharing / 1e9:.2f} GB"],
            ["Saved", f"{s.saved_bytes / 1e9:.2f} GB ({s.saved_fraction * 100:.1f}%)"],
            ["Shared prefix (cached once)", f"{s.shared_bytes / 1e6:.2f} MB"],
            ["Own tokens (all requests)", f"{s.unique_bytes / 1e9:.2f} GB"],
        ]

    def savings_json(s: px.PrefixSavings, **extra) -> dict:
        props = ("bytes_without_sharing", "bytes_with_sharing", "saved_bytes", "saved_fraction")
        return record(s, *props, "shared_bytes", "unique_bytes", **extra)

    requests = [
        [f"{i + 1}. {text}", n]
        for i, (text, n) in enumerate(zip(px.SEED_REQUESTS, demo.tokens_per_request, strict=True))
    ]
    lines = [
        "Prefix sharing (shared/seeds/002 ch9 prefix_sharing_demo.py); words get ids in "
        "first-seen order (the seed's salted hash() ids change per run)",
        "",
        format_table(["Request", "Tokens"], requests),
        f"KV entries without sharing {demo.total_tokens}, with a token trie "
        f"{demo.unique_kv_entries}; {demo.shared_accesses} tokens reuse a cached prefix; "
        f"saved {demo.savings * 100:.1f}%",
        "",
        *demo.tree,
        "",
        f"System prompt: {args.num_requests} requests x ({args.system_prompt_len} shared + "
        f"{args.user_prompt_len} own) tokens, {per_token:,} B/token",
        format_table(["", "Memory"], savings_rows(system)),
        "",
        f"Few-shot: {args.num_requests} requests x ({px.FEW_SHOT_EXAMPLES} x "
        f"{px.FEW_SHOT_EXAMPLE_LEN} shared + {px.FEW_SHOT_QUERY_LEN} query) tokens",
        format_table(["", "Memory"], savings_rows(few)),
    ]
    report = {
        "command": "prefix",
        "radix_demo": record(demo, "total_tokens", "savings"),
        "kv_bytes_per_token": per_token,
        "system_prompt": savings_json(system, num_requests=args.num_requests),
        "few_shot": savings_json(few, num_requests=args.num_requests),
    }
    emit(args, report, lines)
    return 0
