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
6. the int8 KV cache (the chapter's "INT8/FP8 KV cache: 2x requests"): bytes per token of the
   engine's pool, bf16 against int8 with its scales, beside `calc kv --dtype-bytes 1`; and its
   quality cost on a model trained at 1,024 positions (`jaxscale train`, kept under --runs):
   the largest logit difference and the held-out loss, full cache against int8, at 256 and
   1,024 positions (--int8-seq; skipped by --calculators-only, or --int8-steps 0);
and writes results/09_kv_capacity.png: concurrent 70B requests against context, paged vs unpaged.
"""

import argparse
import os
from pathlib import Path

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


INT8_TRAIN = ["--data", "stdlib", "--global-batch", "8"]
INT8_TRAIN += ["--d-model", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2"]
INT8_TRAIN += ["--no-progress", "--sample-tokens", "0", "--eval-every", "0", "--log-every", "100"]


def int8_cache(run_dir: Path, steps: int, seq: int = 1024) -> None:
    """Section 6: the int8 pool's bytes per token, and the int8 cache against the full one on a
    model trained at `seq` positions: prefill of 8 held-out windows through each cache, the
    largest logit difference and the next-token loss over the first seq / 4 and all `seq`
    positions."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxscale.model import kv_cache
    from jaxscale.train import data
    from jaxscale.train.checkpoint import load_model

    section("int8 KV cache: capacity and quality (seed 002 ch9: INT8/FP8, 2x requests)")
    if not (run_dir / "checkpoints").is_dir():
        argv = ["train", *INT8_TRAIN, "--seq-len", str(seq), "--max-seq", str(seq)]
        argv += ["--steps", str(steps), "--run-dir", str(run_dir)]
        if jaxscale_main(argv) != 0:
            raise SystemExit(f"training into {run_dir} failed")
    cfg, params = load_model(str(run_dir))
    print(f"  bytes per token of the engine's pool (this model: {cfg.n_layers} layers, ", end="")
    print(f"{cfg.n_kv_heads} kv heads of {cfg.head_dim}; then Llama-3-8B's 32 x 8 x 128):")
    llama = cfg.replace(d_model=4096, n_heads=32, n_kv_heads=8, n_layers=32, d_ff=14336)
    for name, c in (("this model", cfg), ("llama-3-8b", llama)):
        bf16, int8 = (kv_cache.bytes_per_token(c, dt) for dt in ("bfloat16", "int8"))
        calc = kv.kv_bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim, 1)
        print(
            f"  {name:>11}: bf16 {bf16:,} B, int8 {int8:,} B (calc kv --dtype-bytes 1: "
            f"{calc:,} B + the scales' {int8 - calc:,} B): {bf16 / int8:.2f}x the tokens per page"
        )
    windows = data.make_dataset("stdlib").rows(0, data.EVAL_STEP_OFFSET, range(8), seq)
    tokens, targets = jnp.asarray(windows[:, :-1]), np.asarray(windows[:, 1:])
    forward = jax.jit(kv_cache.forward, static_argnames="cfg")
    positions = jnp.broadcast_to(jnp.arange(seq), tokens.shape)
    logits = {
        dt: np.asarray(
            forward(params, tokens, positions, kv_cache.init_cache(cfg, 8, seq, dt), cfg=cfg)[0]
        )
        for dt in ("float32", "int8")
    }

    def loss(logits_BTV, n):  # mean next-token cross-entropy over the first n positions
        x = logits_BTV[:, :n] - logits_BTV[:, :n].max(-1, keepdims=True)
        logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
        return float(-np.take_along_axis(logp, targets[:, :n, None], -1).mean())

    print(f"  {steps} steps at {seq:,} positions; 8 held-out windows through each cache:")
    print(f"  {'positions':>9} {'loss, f32':>10} {'loss, int8':>11} {'max |dlogit|':>13}")
    for n in (seq // 4, seq):
        full, int8 = logits["float32"], logits["int8"]
        diff = np.abs(int8[:, :n] - full[:, :n]).max()
        print(f"  {n:>9} {loss(full, n):>10.4f} {loss(int8, n):>11.4f} {diff:>13.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100", choices=list(GPUS), help="GPU preset")
    parser.add_argument("--seed-faithful", action="store_true", help="the seed's single GPU")
    parser.add_argument("--out", default="results", help="directory for the plot")
    parser.add_argument(
        "--calculators-only",
        action="store_true",
        help="skip the real cache's sections (they compile the model)",
    )
    parser.add_argument(
        "--int8-steps",
        type=int,
        default=300,
        help="training steps of the int8 section's model (0: skip the section)",
    )
    parser.add_argument(
        "--int8-seq", type=int, default=1024, help="its model's context (measured at 1/4 and all)"
    )
    parser.add_argument(
        "--runs", default="runs/09_kv_cache", help="where its trained model is kept (and reused)"
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
        if args.int8_steps > 0:
            name = f"int8_{args.int8_steps}x{args.int8_seq}"
            int8_cache(Path(args.runs) / name, args.int8_steps, args.int8_seq)


if __name__ == "__main__":
    main()
