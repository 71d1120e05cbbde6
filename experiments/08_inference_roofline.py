"""Prefill time against prompt length and decode step time against batch size (seed 002 ch. 8,
exercise 2), measured on the KV-cached model beside the roofline calculator's prediction
(`jaxscale calc inference`: time = max(FLOPs / peak, bytes / HBM bandwidth)).

    python experiments/08_inference_roofline.py                          # tiny model, any backend
    python experiments/08_inference_roofline.py --d-model 1024 --layers 24 --heads 16 --d-ff 3584 \
        --max-seq 1024 --dtype bfloat16                                # ~365M, on a GPU

The cached attention reads only the live slots of the cache, in blocks of kv_cache.BLOCK (up to
the last position a row holds), so a decode step moves the weights plus batch x (the live
tokens, rounded up to a block) of K/V: the prediction uses that count, and the last table shows
the step time of the same live tokens in caches of more and more slots (flat: the unused slots
are never read). The engine's table runs the serving engine (paged pool, sampling on the device,
host work overlapped with the device step) at each decode batch: its step, its host time (the
step's wall time less its wait for the device), its tokens/s as a fraction of the bare decode
step's above, and of the roofline (`jaxscale.bench.engine_step`). On CPU there is no peak in
jaxscale/hardware.py: the measurements print without the fraction of roofline.
"""

import argparse
import time

import jax
import jax.numpy as jnp

from jaxscale.bench import engine_step
from jaxscale.calc.inference import inference_latency
from jaxscale.config import ModelConfig
from jaxscale.hardware import for_device_kind
from jaxscale.model import counts, kv_cache
from jaxscale.model import state as ms


def timed(fn, *args, reps: int):
    out = fn(*args)  # compile and warm up
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--d-ff", type=int, default=128)
    p.add_argument("--max-seq", type=int, default=128)
    p.add_argument("--dtype", default="float32", help="weights, activations and KV cache")
    p.add_argument("--prompts", default="16,32,64", help="prefill lengths (batch 1)")
    p.add_argument("--batches", default="1,2,4,8,16", help="decode batch sizes")
    p.add_argument("--live", type=int, default=64, help="tokens in each row's cache at decode")
    p.add_argument("--slots", default="64,512,4096", help="cache sizes for the same live tokens")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--unroll-layers", action="store_true", help="no layer loop in the program")
    a = p.parse_args()
    slots = [int(x) for x in a.slots.split(",")]
    if a.live < 1 or a.live > min(slots + [a.max_seq]):
        p.error(f"--live {a.live} must be in [1, the smallest cache: {min(slots + [a.max_seq])}]")
    cfg = ModelConfig(
        d_model=a.d_model,
        n_layers=a.layers,
        n_heads=a.heads,
        n_kv_heads=a.kv_heads or a.heads,
        d_ff=a.d_ff,
        max_seq=max(a.max_seq, *slots),
        compute_dtype=a.dtype,
        param_dtype=a.dtype,
        unroll_layers=a.unroll_layers,
    )
    dt = jnp.dtype(a.dtype)
    params = jax.tree.map(lambda x: x.astype(dt), ms.init_params(cfg, 0))
    n_params = counts.param_count(cfg)
    kv_per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * dt.itemsize
    kind = jax.devices()[0].device_kind
    device = for_device_kind(kind)
    print(
        f"{kind}, jax {jax.__version__}: {n_params / 1e6:.1f}M params in {a.dtype}, KV "
        f"{kv_per_token / 1024:.1f} KiB/token, cache S = {a.max_seq}, {a.live} live tokens "
        f"at decode"
    )
    # the slots a decode step reads: the live tokens rounded up to a block of the cache's
    read = min(a.max_seq, -(-a.live // kv_cache.BLOCK) * kv_cache.BLOCK)

    def predicted(prompt, batch, gen):
        if device is None:
            return None
        return inference_latency(
            n_params,
            prompt,
            gen,
            batch,
            kv_bytes_per_token=kv_per_token,
            flops_per_s=device.flops_per_s,
            hbm_bytes_per_s=device.hbm_bytes_per_s,
            weight_bytes=dt.itemsize,
        )

    def intensity(prompt, batch):
        """The calculator's arithmetic intensity (FLOPs per byte moved) of the prefill and of a
        decode step: the same on any device (the peak and bandwidth only scale the times)."""
        est = inference_latency(
            n_params,
            prompt,
            1,
            batch,
            kv_bytes_per_token=kv_per_token,
            flops_per_s=1.0,
            hbm_bytes_per_s=1.0,
            weight_bytes=dt.itemsize,
        )
        return est.prefill_intensity, est.decode_intensity

    prefill = jax.jit(
        lambda params, t, c: kv_cache.prefill(params, t, jnp.full((1,), t.shape[1]), c, cfg)[0]
    )
    print(
        f"\n{'prefill tokens':>14} {'ms':>9} {'FLOP/B':>8} {'predicted ms':>13} {'of roofline':>12}"
    )
    for n in [int(x) for x in a.prompts.split(",")]:
        tokens = jnp.zeros((1, n), jnp.int32)
        s = timed(prefill, params, tokens, kv_cache.init_cache(cfg, 1, a.max_seq), reps=a.reps)
        pred = predicted(n, 1, 1)
        frac = f"{pred.prefill_s / s:.1%}" if pred else "-"
        print(
            f"{n:>14} {s * 1e3:>9.3f} {intensity(n, 1)[0]:>8.1f} "
            f"{f'{pred.prefill_s * 1e3:.3f}' if pred else '-':>13} {frac:>12}"
        )

    # the cache donated, as the engine's pool and generation's loop carry are: written in place
    decode = jax.jit(
        lambda params, t, pos, c: kv_cache.decode_step(params, t, pos, c, cfg), donate_argnums=3
    )

    def timed_decode(batch: int, slots: int) -> float:
        """Seconds per decode step of `batch` rows at position live - 1 in a cache of `slots`."""
        cache = kv_cache.init_cache(cfg, batch, slots)
        tok, pos = jnp.zeros((batch,), jnp.int32), jnp.full((batch,), a.live - 1, jnp.int32)
        logits, cache = decode(params, tok, pos, cache)  # compile and warm up
        jax.block_until_ready(logits)
        t0 = time.perf_counter()
        for _ in range(a.reps):
            logits, cache = decode(params, tok, pos, cache)
        jax.block_until_ready(logits)
        return (time.perf_counter() - t0) / a.reps

    print(
        f"\n{'decode batch':>14} {'step ms':>9} {'tokens/s':>11} {'FLOP/B':>8} "
        f"{'predicted ms':>13} {'of roofline':>12}"
    )
    batches, bare = [int(x) for x in a.batches.split(",")], {}
    for b in batches:
        s = bare[b] = timed_decode(b, a.max_seq)
        pred = predicted(read, b, 1)
        step = pred.decode_per_token_s if pred else None
        frac = f"{step / s:.1%}" if pred else "-"
        print(
            f"{b:>14} {s * 1e3:>9.3f} {b / s:>11,.0f} {intensity(read, b)[1]:>8.1f} "
            f"{f'{step * 1e3:.3f}' if pred else '-':>13} {frac:>12}"
        )
    print(
        f"\n{'engine batch':>14} {'step ms':>9} {'host ms':>8} {'tokens/s':>11} "
        f"{'of decode':>10} {'of roofline':>12}   (the serving engine, {a.live}-token prompts)"
    )
    for b in batches:
        run = engine_step.steady(params, cfg, b, a.reps, prompt=a.live)
        s = run["step_ms"] / 1e3
        pred = predicted(read, b, 1)
        frac = f"{pred.decode_per_token_s / s:.1%}" if pred else "-"
        print(
            f"{b:>14} {s * 1e3:>9.3f} {run['host_ms']:>8.3f} {b / s:>11,.0f} "
            f"{bare[b] / s:>10.1%} {frac:>12}"
        )
    print(f"\n{'cache slots':>14} {'step ms':>9} {'vs smallest':>12}   (batch 1, {a.live} live)")
    first = None
    for n in slots:
        s = timed_decode(1, n)
        first = first or s
        print(f"{n:>14} {s * 1e3:>9.3f} {s / first:>11.2f}x")
    print(
        "\nFLOP/B: `calc inference`'s arithmetic intensity. A decode step reads every weight "
        "and the live\ncache for one token per row: about 1 FLOP/B per row for a bf16 model "
        "whose weights outweigh\nits cache, less where the cache dominates (as here). A "
        "prefill's grows with the prompt. Below a\ndevice's ridge point (H100: ~295 FLOP/B) a "
        "step is memory-bound: its time barely grows with\nthe batch, and tokens/s grows "
        "with it."
    )
    if device is not None:
        print(
            f"\nroofline: {device.name}, {device.bf16_tflops} TFLOP/s, {device.hbm_tb_s} TB/s; "
            f"'of roofline' = predicted minimum / measured"
        )


if __name__ == "__main__":
    main()
