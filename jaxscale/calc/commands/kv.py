"""`jaxscale calc kv`: KV cache per token and request, capacity with and without paging,
fragmentation.

Port of seed 002 ch9 `kv_cache_calculator.py`. Nothing here imports jax.
"""

from dataclasses import replace

from jaxscale.calc import kv
from jaxscale.calc.commands.common import GPUS, record
from jaxscale.cliutil import (
    add_command,
    add_output_flags,
    comma_list,
    guarded,
    hidden_alias,
    non_negative_float,
    positive_float,
    positive_int,
)
from jaxscale.hardware import get_device
from jaxscale.render import Col, Report, fmt_bytes, grid

KV_FAITHFUL = "the seed's single-GPU capacity, where its default 70B does not fit (defect 8)"
PAGING = "paging: 50% of the memory usable without it, 95% with it (seed 002 ch9)"


def _kib(num_bytes: float) -> str:
    """1024-based, honestly named ("512.00 KiB"); the seed prints "KB"."""
    return fmt_bytes(num_bytes, binary=True, digits=2)


MODEL_COLS = [
    Col("name", "Model"),
    Col("num_layers", "Layers"),
    Col("num_kv_heads", "KV heads"),
    Col("head_dim", "Head dim"),
    Col("kv_bytes_per_token", "Per token", _kib),
    Col("kv_bytes_8k", "@ 8K ctx", _kib),
    Col("kv_bytes_32k", "@ 32K ctx", _kib),
]
CAPACITY_HEADS = [
    "Context",
    "KV/request GiB",
    "Max tokens",
    "Max requests",
    "Without paging",
    "With paging",
    "Improvement",
]
FRAGMENTATION_COLS = [
    Col("scenario", "Scenario"),
    Col("requests", "Requests"),
    Col("avg_context", "Avg ctx"),
    Col("max_context", "Max ctx"),
    Col("bytes_without_paging", "Without paging", _kib),
    Col("bytes_with_paging", "With paging", _kib),
    Col("wasted_bytes", "Saved", _kib),
    Col("waste_fraction", "Waste", ".1%"),
]


def add_parser(calc_sub) -> None:
    p = add_command(
        calc_sub,
        "kv",
        help="KV cache per token/request, capacity with and without paging, fragmentation",
        description="The seed's KV cache calculator. Capacity runs on one GPU when the model "
        "fits there, else on one 8-GPU node (tensor parallel), unless --gpus says otherwise.",
        example="jaxscale calc kv --model llama-70b --gpu h100 --gpus 4 --contexts 4096,32768",
    )
    p.add_argument(
        "--model",
        "-m",
        default="llama-70b",
        choices=list(kv.MODELS),
        help="the model whose cache is sized",
    )
    p.add_argument("--gpu", "-g", default="h100", choices=GPUS, help="the GPU kind")
    p.add_argument(
        "--custom", action="store_true", help="size --layers/--kv-heads/--head-dim instead"
    )
    p.add_argument("--layers", type=positive_int, default=80, help="layers, with --custom")
    a = p.add_argument("--kv-heads", type=positive_int, default=8, help="K/V heads, with --custom")
    hidden_alias(p, a, "--heads")
    a = p.add_argument(
        "--head-dim", type=positive_int, default=128, help="head dimension, with --custom"
    )
    hidden_alias(p, a, "--dim")
    p.add_argument(
        "--model-size-gb",
        type=positive_float,
        help="FP16 weights in GB (default: the seed's size; 14 for --custom)",
    )
    a = p.add_argument(
        "--gpus", type=positive_int, help="GPUs sharing the model (default: 1 or 8, above)"
    )
    hidden_alias(p, a, "--num-gpus")
    p.add_argument(
        "--overhead-gb",
        type=non_negative_float,
        default=kv.SEED_OVERHEAD_GB_PER_GPU,
        help="runtime overhead per GPU, as the seed",
    )
    p.add_argument(
        "--contexts",
        type=comma_list(positive_int),
        default=list(kv.SEED_CONTEXTS),
        help="context lengths of the capacity table, comma-separated",
    )
    p.add_argument("--dtype-bytes", type=positive_int, default=2, help="bytes per KV value")
    add_output_flags(p, faithful=True)
    p.set_defaults(func=guarded(run))


def _capacity_cells(c: dict) -> list:
    if not c["fits"]:
        return [c["context_len"], "Model does not fit in GPU memory", "", "", "", "", ""]
    gain = "n/a" if c["paging_improvement"] is None else f"{c['paging_improvement']:.0%}"
    return [
        c["context_len"],
        f"{c['kv_per_request_gib']:.2f}",
        f"{c['max_tokens']:,}",
        c["max_requests"],
        c["requests_without_paging"],
        c["requests_with_paging"],
        gain,
    ]


def run(args) -> int:
    sf, gpu = args.seed_faithful, get_device(args.gpu)
    if sf and args.gpus:
        raise ValueError("--seed-faithful reproduces the seed's single-GPU capacity; drop --gpus")
    if args.custom:
        model = kv.custom_model(args.layers, args.kv_heads, args.head_dim, args.model_size_gb)
    else:
        model = kv.get_model(args.model)
        if args.model_size_gb:
            model = replace(model, model_size_gb=args.model_size_gb)
    models = []
    for m in list(kv.MODELS.values()) + ([model] if args.custom else []):
        per_token = kv.model_kv_bytes_per_token(m, args.dtype_bytes)
        at_8k, at_32k = (per_token * c for c in kv.COMPARISON_CONTEXTS)
        models.append(
            record(m, kv_bytes_per_token=per_token, kv_bytes_8k=at_8k, kv_bytes_32k=at_32k)
        )
    fits_from = kv.min_gpus_to_fit(model.model_size_gb, gpu.memory_gb, args.overhead_gb)
    gpus = 1 if sf else args.gpus
    gpus = gpus or kv.deployment_gpus(model.model_size_gb, gpu.memory_gb, args.overhead_gb)
    capacity = []
    for ctx in args.contexts:
        c = kv.kv_capacity(model, gpu.memory_gb, ctx, gpus, args.overhead_gb, args.dtype_bytes)
        capacity.append(record(c, "fits", "paging_improvement"))
    per_token = kv.model_kv_bytes_per_token(model, args.dtype_bytes)
    fragmentation = []
    for requests, avg, most, desc in kv.FRAGMENTATION_SCENARIOS:
        f = kv.fragmentation(per_token, requests, avg, most)
        fragmentation.append(record(f, "wasted_bytes", "waste_fraction", scenario=desc))
    available = kv.available_kv_gib(model.model_size_gb, gpu.memory_gb, gpus, args.overhead_gb)
    where = gpu.name if gpus == 1 else f"{gpus} x {gpu.name} (tensor parallel)"

    r = Report("kv").say(
        "KV cache calculator (seed 002 ch9); sizes in binary units (the "
        "seed prints KiB as 'KB', GiB as 'GB')"
    )
    r.mode(sf, KV_FAITHFUL).say("")
    r.table("models", MODEL_COLS, models)
    r.say(
        "",
        f"Capacity: {model.name} ({model.model_size_gb:g} GB weights) on {where}, overhead "
        f"{args.overhead_gb:g} GB per GPU: {available:.1f} GB left for KV",
    )
    if args.custom and args.model_size_gb is None:
        r.say("(14 GB of weights is the seed's fallback for --custom; see --model-size-gb)")
    if fits_from is not None and fits_from > 1:
        r.say(f"(the weights need at least {fits_from} GPUs of {gpu.memory_gb:g} GB)")
    r.say(grid(CAPACITY_HEADS, [_capacity_cells(c) for c in capacity]), PAGING)
    r.say("", f"Fragmentation: {model.name}, every request pre-allocating its max context")
    r.put(
        capacity={
            "model": model.name,
            "model_size_gb": model.model_size_gb,
            "gpu": gpu.name,
            "gpu_memory_gb": gpu.memory_gb,
            "num_gpus": gpus,
            "min_gpus_to_fit": fits_from,
            "overhead_gb_per_gpu": args.overhead_gb,
            "kv_bytes_per_token": per_token,
            "rows": capacity,
        }
    )
    r.table("fragmentation", FRAGMENTATION_COLS, fragmentation)
    r.emit(args)
    return 0
