"""Seed 002 chapter 10, advanced scheduling and CUDA graphs, on the real model: what a compiled
program saves, what shape buckets bound, and what overlapping the host with the device buys.

    python experiments/10_scheduling.py [--batch 8] [--steps 40] [--sched-frac 0.4]

1. "capture and replay": a decode step's first call (trace + compile, the analogue of capturing a
   CUDA graph) against later calls (replaying the compiled executable);
2. the seed's exercise 1: 100 small matmuls op by op (one dispatch each) against one jitted
   program (one dispatch), measured;
3. shape buckets (exercise 2): the serving engine pads the batch to a power of two and prefill
   chunks to a bucket, so a run with many distinct batch shapes compiles a few programs; the
   programs compiled against the shapes an unbucketed engine would have compiled;
4. overlap scheduling (the seed's FutureMap, in JAX form): a decode loop with host work S before
   each step (scheduling) and P after it (reading the tokens back and post-processing), run
   sequentially (S, step, wait, P) and overlapped: step n+1 takes step n's sampled tokens as a
   device array (no round trip to the host), and the host does S of step n+1 and P of step n
   while the device computes, thanks to JAX's asynchronous dispatch. Measured beside
   `jaxscale simulate overlap`'s prediction for the measured device time C. Host work is
   `time.sleep` (as in the seed), which releases the interpreter lock;
5. the same in the serving engine (`EngineConfig.overlap`, on by default): its step's wall time in
   steady decoding, reading each step's tokens before the next (off) and a step late (on),
   beside its device step alone (the program it launches, dispatched back to back on the same
   inputs): the engine's host work is what the ratio adds.
CPU timings are indicative; the ratios are the result.
"""

import argparse
import time

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxscale.bench import engine_step  # noqa: E402
from jaxscale.cliutil import positive_int  # noqa: E402
from jaxscale.config import ModelConfig  # noqa: E402
from jaxscale.model import kv_cache  # noqa: E402
from jaxscale.model import state as ms  # noqa: E402
from jaxscale.serve import sampling  # noqa: E402
from jaxscale.sim import overlap as ov  # noqa: E402
from jaxscale.sim import timeline  # noqa: E402


def banner(title: str) -> None:
    print(f"\n{'=' * 72}\n {title}\n{'=' * 72}", flush=True)


def make_step(cfg: ModelConfig):
    """One decode step that samples on the device: (cache, tokens [B], positions [B], seeds [B],
    index) -> (cache, next tokens [B]). The tokens stay on the device for the next step."""

    @jax.jit
    def step(params, cache, tok_B, pos_B, seed_B, index):
        logits_BV, cache = kv_cache.decode_step(params, tok_B, pos_B, cache, cfg)
        keys_B = sampling.request_keys(seed_B, index)
        B = tok_B.shape[0]
        ones = jnp.ones((B,), jnp.float32)
        nxt = sampling.sample(logits_BV, keys_B, ones, jnp.zeros((B,), jnp.int32), ones)
        return cache, nxt

    return step


def capture_and_replay(cfg, params, B) -> None:
    banner("1. capture and replay: a decode step's first call against the next ones")
    step = make_step(cfg)
    cache = kv_cache.init_cache(cfg, B)
    args = (
        jnp.full((B,), 65, jnp.int32),
        jnp.zeros((B,), jnp.int32),
        jnp.arange(B, dtype=jnp.uint32),
        0,
    )
    t0 = time.perf_counter()
    cache, tok = step(params, cache, *args)
    tok.block_until_ready()
    first = time.perf_counter() - t0
    reps = 20
    t0 = time.perf_counter()
    for i in range(reps):
        cache, tok = step(params, cache, tok, jnp.full((B,), i + 1, jnp.int32), args[2], i + 1)
    tok.block_until_ready()
    replay = (time.perf_counter() - t0) / reps
    print(f"  batch {B}: first call {first * 1e3:8.1f} ms (trace + compile + run)")
    print(f"           replays   {replay * 1e3:8.2f} ms each ({first / replay:,.0f}x less)")
    print(f"  a new shape compiles again: batch {B + 1} ->", end=" ")
    t0 = time.perf_counter()
    c2 = kv_cache.init_cache(cfg, B + 1)
    step(
        params,
        c2,
        jnp.full((B + 1,), 65, jnp.int32),
        jnp.zeros((B + 1,), jnp.int32),
        jnp.arange(B + 1, dtype=jnp.uint32),
        0,
    )[1].block_until_ready()
    print(
        f"{(time.perf_counter() - t0) * 1e3:.1f} ms (JAX recompiles; a CUDA graph must be "
        "recaptured)"
    )


def small_matmuls(n: int = 100, d: int = 64) -> None:
    banner(f"2. exercise 1: {n} small matmuls ({d}x{d}), op by op against one program")
    x = jnp.ones((d, d), jnp.float32) / d
    w = jnp.eye(d, dtype=jnp.float32) * 1.0001

    def chain(x, w):
        for _ in range(n):
            x = x @ w
        return x

    jitted = jax.jit(chain)
    looped = jax.jit(lambda x, w: jax.lax.fori_loop(0, n, lambda _, y: y @ w, x))
    rows = []
    for name, fn in (("op by op", chain), ("jit (unrolled)", jitted), ("jit (fori_loop)", looped)):
        fn(x, w).block_until_ready()  # compile (jit) or warm the op cache (eager)
        t0 = time.perf_counter()
        for _ in range(5):
            out = fn(x, w)
        out.block_until_ready()
        rows.append((name, (time.perf_counter() - t0) / 5 * 1e3, out))
    ref = rows[0][2]
    for name, ms_, out in rows:
        same = bool(jnp.allclose(out, ref, rtol=1e-5))
        print(f"  {name:<16} {ms_:9.3f} ms per call   {rows[0][1] / ms_:7.1f}x   same: {same}")
    print(
        f"  per dispatch (op by op): {rows[0][1] / n * 1e3:.1f} us: the launch cost a compiled "
        "program pays once"
    )


def buckets(cfg, params, B) -> None:
    from jaxscale.serve.engine import Engine, EngineConfig
    from jaxscale.serve.sampling import SamplingParams
    from jaxscale.serve.scheduler import Request

    banner("3. exercise 2: shape buckets bound the compiles")
    eng = Engine(
        params,
        cfg,
        EngineConfig(max_num_seqs=B, max_num_batched_tokens=4 * B, page_size=16, n_pages=128),
    )
    rng = np.random.default_rng(0)
    for i in range(3 * B):  # prompts of 1..40 bytes, outputs of 1..24 tokens: ragged batches
        prompt = [int(t) for t in rng.integers(32, 127, rng.integers(1, 41))]
        eng.add(Request(str(i), prompt, int(rng.integers(1, 25)), SamplingParams(0.0)))
    t0 = time.perf_counter()
    while eng.has_work():
        eng.step()
    wall = time.perf_counter() - t0
    print(f"  {3 * B} requests, {eng.steps} engine steps, {wall:.1f} s (compiles included)")
    print(f"  programs compiled (bucketed): {eng.compiles}  {sorted(eng.shapes)}")
    print(f"  shapes an unbucketed engine would compile: {len(eng.exact_shapes)}")
    print(
        f"  the bound: {len(eng.batch_sizes)} batch sizes x (decode + {len(eng.buckets)} "
        f"prefill buckets), and {len(eng.mixed)} steps mixing decode rows with chunks = "
        f"{eng.compile_bound}"
    )


def overlap(cfg, params, B, steps, sched_frac, post_frac) -> dict:
    banner("4. overlap scheduling: host work beside the device, measured and simulated")
    step = make_step(cfg)
    seeds = jnp.arange(B, dtype=jnp.uint32)

    def fresh():
        return kv_cache.init_cache(cfg, B), jnp.full((B,), 65, jnp.int32)

    # C: the device step alone, steps dispatched back to back (warm), the host waiting once
    cache, tok = fresh()
    cache, tok = step(params, cache, tok, jnp.zeros((B,), jnp.int32), seeds, 0)
    tok.block_until_ready()
    t0 = time.perf_counter()
    for i in range(steps):
        cache, tok = step(params, cache, tok, jnp.full((B,), i + 1, jnp.int32), seeds, i + 1)
    tok.block_until_ready()
    C = (time.perf_counter() - t0) / steps * 1e3
    S, P = sched_frac * C, post_frac * C

    def sequential():
        cache, tok = fresh()
        out = []
        for i in range(steps):
            time.sleep(S / 1e3)  # schedule step i
            cache, tok = step(params, cache, tok, jnp.full((B,), i, jnp.int32), seeds, i)
            out.append(np.asarray(tok))  # wait for the tokens on the host
            time.sleep(P / 1e3)  # post-process them (detokenize, stop checks)
        return out

    def overlapped():
        cache, tok = fresh()
        out, prev = [], None
        for i in range(steps):
            time.sleep(S / 1e3)  # schedule step i while step i-1 runs
            # launch: tok is step i-1's device output (the FutureMap's placeholder)
            cache, tok = step(params, cache, tok, jnp.full((B,), i, jnp.int32), seeds, i)
            if prev is not None:  # post-process step i-1 while step i runs
                out.append(np.asarray(prev))
                time.sleep(P / 1e3)
            prev = tok
        out.append(np.asarray(prev))
        time.sleep(P / 1e3)
        return out

    res = {}
    for name, fn in (("sequential", sequential), ("futuremap", overlapped)):
        fn()  # warm
        t0 = time.perf_counter()
        toks = fn()
        res[name] = ((time.perf_counter() - t0) * 1e3, np.stack(toks))
    same = bool((res["sequential"][1] == res["futuremap"][1]).all())
    sim_cfg = ov.SchedulingConfig(batches=steps, scheduling_ms=S, compute_ms=C, postprocess_ms=P)
    pred = {
        m: timeline.makespan(ov.simulate_scheduling(sim_cfg, m))
        for m in ("sequential", "futuremap")
    }
    print(
        f"  batch {B}, {steps} decode steps; device step C = {C:.2f} ms (measured), host "
        f"S = {S:.2f} ms before and P = {P:.2f} ms after each step"
    )
    print(f"  {'loop':<12}{'measured ms':>13}{'simulate overlap ms':>21}")
    for m in ("sequential", "futuremap"):
        print(f"  {m:<12}{res[m][0]:>13.1f}{pred[m]:>21.1f}")
    got = res["sequential"][0] / res["futuremap"][0]
    want = pred["sequential"] / pred["futuremap"]
    print(f"  speedup: measured {got:.2f}x, predicted {want:.2f}x; the same tokens: {same}")
    print(
        "  (the sequential loop also waits for each step's tokens to reach the host, a round "
        "trip the simulation does not count; the overlapped loop hides it)"
    )
    return {
        "C_ms": C,
        "measured": {k: v[0] for k, v in res.items()},
        "predicted": pred,
        "same_tokens": same,
    }


def engine_overlap(cfg, params, B, steps) -> dict:
    banner("5. the engine: its step beside its device step, host work read a step late or not")
    res = engine_step.compare(params, cfg, B, steps)
    device = res["device_ms"]
    print(f"  {B} requests decoding, {steps} steps timed (median)")
    print(f"  {'':<28}{'ms per step':>12}{'vs device':>11}{'host ms':>9}")
    print(f"  {'device step alone':<28}{device:>12.2f}{1:>10.2f}x")
    for on, name in ((False, "engine, tokens read first"), (True, "engine, read a step late")):
        ms = res["engine_ms"][on]
        print(f"  {name:<28}{ms:>12.2f}{ms / device:>10.2f}x{res['host_ms'][on]:>9.2f}")
    print("  host ms: a step's wall time less its wait for the device's tokens")
    print(f"  the same tokens: {res['same_tokens']}")
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=positive_int, default=8, help="decode batch (8)")
    p.add_argument("--steps", type=positive_int, default=40, help="decode steps timed (40)")
    p.add_argument(
        "--sched-frac",
        type=float,
        default=0.4,
        help="host scheduling S, a fraction of the device step (0.4)",
    )
    p.add_argument(
        "--post-frac",
        type=float,
        default=0.2,
        help="host post-processing P, a fraction of the device step (0.2)",
    )
    a = p.parse_args()
    if not (a.sched_frac > 0 and a.post_frac > 0):
        p.error("--sched-frac and --post-frac must be > 0")
    cfg = ModelConfig(d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=768, max_seq=256)
    params = ms.init_params(cfg, 0)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}; model d_model "
        f"{cfg.d_model}, {cfg.n_layers} layers, context {cfg.max_seq}"
    )
    capture_and_replay(cfg, params, a.batch)
    small_matmuls()
    buckets(cfg, params, a.batch)
    overlap(cfg, params, a.batch, a.steps, a.sched_frac, a.post_frac)
    engine_overlap(cfg, params, a.batch, a.steps)


if __name__ == "__main__":
    main()
