"""Prefill time against prompt length and decode step time against batch size (seed 002 ch. 8,
exercise 2), measured on the KV-cached model beside the roofline calculator's prediction
(`jaxscale calc inference`: time = max(FLOPs / peak, bytes / HBM bandwidth)).

    python experiments/08_inference_roofline.py                          # tiny model, any backend
    python experiments/08_inference_roofline.py --d-model 1024 --layers 24 --heads 16 --d-ff 3584 \
        --max-seq 1024 --dtype bfloat16                                # ~365M, on a GPU

The cached attention reads every slot of the cache (S = --max-seq), masked, so a decode step
moves the weights plus batch x S tokens of K/V: the prediction uses that S. On CPU there is no
peak in jaxscale/hardware.py: the measurements print without the fraction of roofline.
"""

import argparse
import time

import jax
import jax.numpy as jnp

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
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--unroll-layers", action="store_true", help="no layer loop in the program")
    a = p.parse_args()
    cfg = ModelConfig(
        d_model=a.d_model,
        n_layers=a.layers,
        n_heads=a.heads,
        n_kv_heads=a.kv_heads or a.heads,
        d_ff=a.d_ff,
        max_seq=a.max_seq,
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
        f"{kv_per_token / 1024:.1f} KiB/token, cache S = {cfg.max_seq}"
    )

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
        s = timed(prefill, params, tokens, kv_cache.init_cache(cfg, 1), reps=a.reps)
        pred = predicted(n, 1, 1)
        frac = f"{pred.prefill_s / s:.1%}" if pred else "-"
        print(
            f"{n:>14} {s * 1e3:>9.3f} {intensity(n, 1)[0]:>8.1f} "
            f"{f'{pred.prefill_s * 1e3:.3f}' if pred else '-':>13} {frac:>12}"
        )

    decode = jax.jit(lambda params, t, pos, c: kv_cache.decode_step(params, t, pos, c, cfg)[0])
    print(
        f"\n{'decode batch':>14} {'step ms':>9} {'tokens/s':>11} {'FLOP/B':>8} "
        f"{'predicted ms':>13} {'of roofline':>12}"
    )
    for b in [int(x) for x in a.batches.split(",")]:
        cache = kv_cache.init_cache(cfg, b)
        pos = jnp.full((b,), cfg.max_seq // 2, jnp.int32)
        s = timed(decode, params, jnp.zeros((b,), jnp.int32), pos, cache, reps=a.reps)
        pred = predicted(cfg.max_seq, b, 1)  # every slot of the cache is read
        step = pred.decode_per_token_s if pred else None
        frac = f"{step / s:.1%}" if pred else "-"
        print(
            f"{b:>14} {s * 1e3:>9.3f} {b / s:>11,.0f} {intensity(cfg.max_seq, b)[1]:>8.1f} "
            f"{f'{step * 1e3:.3f}' if pred else '-':>13} {frac:>12}"
        )
    print(
        "\nFLOP/B: `calc inference`'s arithmetic intensity. A decode step reads every weight "
        "and the whole\ncache for one token per row: about 1 FLOP/B per row for a bf16 model "
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
