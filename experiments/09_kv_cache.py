"""Seed 002 chapter 9, KV cache management: sizes, capacity, paging, prefix sharing, exercises.

    .venv/bin/python experiments/09_kv_cache.py [--gpu h100] [--seed-faithful] [--out results]

1. the KV cache calculator (kv_cache_calculator.py): six-model
   table, capacity with and without paging, fragmentation (`jaxscale calc kv`);
2. the prose's 70B on 8 x H100 budget ("Memory Budget Planning"): 480 GB -> 1.57M tokens ->
   384 / 192 / 48;
3. prefix sharing (prefix_sharing_demo.py) (`jaxscale calc prefix`);
4. Try It Yourself: requests at 8K on one 80 GB GPU per model, and the 100-request
   system-prompt savings;
5. the demo's six requests on the real serving engine (jaxscale/serve/): the radix prefix cache's
   hit rate and pages beside the seed's trie, and the same tokens with and without the cache
   (skipped by --calculators-only, which compiles nothing);
and writes results/09_kv_capacity.png: concurrent 70B requests against context, paged vs unpaged.
"""

import argparse
import os

from jaxscale.calc import kv, prefix
from jaxscale.calc.commands.common import GPUS
from jaxscale.cli import main as jaxscale_main
from jaxscale.hardware import get_device
from jaxscale.render import figure, fmt_bytes

PROSE_OVERHEAD_GB_PER_GPU = 2.5  # "CUDA kernels, etc. ~20 GB" on 8 GPUs (the prose budget)
PLOT_CONTEXTS = [1024 * 2**i for i in range(8)]  # 1K .. 128K


def section(title: str) -> None:
    print(f"\n{'=' * 78}\n {title}\n{'=' * 78}")


def prose_budget(gpu_memory_gb: float) -> None:
    section("70B on 8 GPUs, ~20 GB overhead (seed 002 ch9: ~375 / ~187 / ~46-47; 128K: ~12)")
    model = kv.get_model("llama-70b")
    for ctx in (4096, 8192, 32768, 131072):
        c = kv.kv_capacity(model, gpu_memory_gb, ctx, 8, PROSE_OVERHEAD_GB_PER_GPU)
        print(
            f"  {ctx:>6} context: {c.available_gib:.0f} GB for KV, {c.max_tokens:,} tokens, "
            f"{c.max_requests} requests ({c.requests_with_paging} at 95% with paging)"
        )


def exercises(gpu_memory_gb: float) -> None:
    section("Try It Yourself, Ex1: requests at 8K on one GPU (weights + 2 GB overhead)")
    for model in kv.MODELS.values():
        c = kv.kv_capacity(model, gpu_memory_gb, 8192)
        if c.fits:
            per_request = fmt_bytes(c.kv_per_request_gib * kv.GIB, binary=True, digits=2)
            print(
                f"  {model.name:<13} {per_request:>10} per "
                f"request -> {c.max_requests:>3} (unpaged {c.requests_without_paging}, "
                f"paged {c.requests_with_paging})"
            )
        else:
            gpus = kv.min_gpus_to_fit(model.model_size_gb, gpu_memory_gb)
            print(f"  {model.name:<13} weights {model.model_size_gb:g} GB: needs {gpus}+ GPUs")
    per_token = kv.model_kv_bytes_per_token(kv.get_model("llama-70b"))
    s = prefix.shared_prefix_savings(100, 500, 100, per_token)
    print(
        f"Ex2: 100 requests sharing a 500-token prompt (+100 own): saves "
        f"{s.saved_fraction * 100:.1f}% = 1 - (500 + 100 x 100) / (100 x 600)"
    )


def plot(gpu_memory_gb: float, out: str) -> str:
    """Concurrent 70B requests against context length on one 8-GPU node (log-log)."""
    model = kv.get_model("llama-70b")
    caps = [kv.kv_capacity(model, gpu_memory_gb, c, kv.SEED_NODE_GPUS) for c in PLOT_CONTEXTS]
    series = {
        "theoretical (100% of KV memory)": [c.max_requests for c in caps],
        "PagedAttention (95%)": [c.requests_with_paging for c in caps],
        "pre-allocated (50%)": [c.requests_without_paging for c in caps],
    }
    path = os.path.join(out, "09_kv_capacity.png")
    with figure(path, figsize=(8, 5)) as (_, ax):
        for label, values in series.items():
            ax.plot(PLOT_CONTEXTS, values, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        title = f"LLaMA-70B on {kv.SEED_NODE_GPUS} x {gpu_memory_gb:g} GB: concurrent requests"
        ax.set(xlabel="Context length (tokens)", ylabel="Concurrent requests", title=title)
        ax.legend()
        ax.grid(True, alpha=0.3, which="both")
    return path


def real_cache() -> None:
    """The seed's six requests through the serving engine's radix cache (page size 1, so every
    token is a page as in the seed's trie), one after another; then the same requests without
    the cache: the tokens generated must not change."""
    from jaxscale.config import ModelConfig
    from jaxscale.model import state as ms
    from jaxscale.serve.engine import Engine, EngineConfig
    from jaxscale.serve.sampling import SamplingParams
    from jaxscale.serve.scheduler import Request

    section("The same six requests on the real cache (jaxscale/serve: engine + radix cache)")
    tok = prefix.WordTokenizer()
    prompts = [tok.encode(text) for text in prefix.SEED_REQUESTS]
    cfg = ModelConfig(vocab=64, max_seq=16)  # word ids (< 64) as tokens; random weights
    params = ms.init_params(cfg, 0)

    def serve(max_tokens: int, cached: bool):
        """(engine, each request's generated tokens), the requests served one after another."""
        eng = Engine(
            params,
            cfg,
            EngineConfig(
                max_num_seqs=1,
                max_num_batched_tokens=16,
                page_size=1,
                n_pages=128,
                prefix_cache=cached,
            ),
        )
        done = eng.run(
            [Request(str(i), p, max_tokens, SamplingParams(0.0)) for i, p in enumerate(prompts)]
        )
        return eng, [done[str(i)].out for i in range(len(prompts))]

    # one token each: the tree then holds the prompts' keys and values only
    c = serve(1, True)[0].cache
    held = c.pages_held()
    print(
        f"  {c.query_tokens} prompt tokens, {c.hit_tokens} served from the cache (hit rate "
        f"{c.hit_rate:.1%}); the tree holds {held} KV pages"
    )
    demo = prefix.radix_demo()
    print(
        f"  the seed's trie: {demo.total_tokens} tokens, {demo.unique_kv_entries} unique, "
        f"{demo.shared_accesses} shared, saved {demo.savings:.1%}"
    )
    (_, with_cache), (_, without) = serve(5, True), serve(5, False)
    print(f"  5 greedy tokens per request, with the cache == without: {with_cache == without}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100", choices=list(GPUS), help="GPU preset")
    parser.add_argument("--seed-faithful", action="store_true", help="the seed's single GPU")
    parser.add_argument("--out", default="results", help="directory for the plot")
    parser.add_argument(
        "--calculators-only",
        action="store_true",
        help="skip the real cache's section (it compiles the model)",
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    faithful = ["--seed-faithful"] if args.seed_faithful else []
    section("KV cache calculator (jaxscale calc kv)")
    if jaxscale_main(["calc", "kv", "--gpu", args.gpu, *faithful]) != 0:
        raise SystemExit(2)
    gpu_memory_gb = get_device(args.gpu).memory_gb
    prose_budget(gpu_memory_gb)
    section("Prefix sharing (jaxscale calc prefix)")
    jaxscale_main(["calc", "prefix"])
    exercises(gpu_memory_gb)
    print(f"\nplot written to {plot(gpu_memory_gb, args.out)}")
    if not args.calculators_only:
        real_cache()


if __name__ == "__main__":
    main()
