"""The serving engine in steady decoding, timed beside its device step alone: what the engine's
host work (scheduling, the step's arrays, the launch, reading tokens back, events) adds to a
step, and how much of it the device's step hides (`EngineConfig.overlap`). Experiments 08 and 10
print it.

A step's host time is its wall time less the time it sat blocked reading sampled tokens back
(`Engine.wait_s`): with overlap, step n + 1 is scheduled and launched while step n runs, so the
host work hides behind the device as long as it is shorter than the device step.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.serve import program
from jaxscale.serve.engine import Engine, EngineConfig
from jaxscale.serve.sampling import SamplingParams
from jaxscale.serve.scheduler import Request

PAGE = 16


def engine_for(
    params, cfg: ModelConfig, batch: int, prompt: int, tokens: int, overlap: bool = True
) -> Engine:
    """An engine of `batch` slots whose pool holds `batch` rows of `tokens` tokens, and whose
    step budget prefills `batch` prompts of `prompt` tokens at once."""
    per_row = -(-tokens // PAGE)
    ecfg = EngineConfig(
        max_num_seqs=batch,
        max_num_batched_tokens=max(64, batch * prompt),
        page_size=PAGE,
        n_pages=batch * per_row + 1,  # page 0 is reserved
        overlap=overlap,
        prefix_cache=False,  # the prompts are distinct; nothing to look up
    )
    return Engine(params, cfg, ecfg)


def steady(
    params,
    cfg: ModelConfig,
    batch: int,
    steps: int,
    prompt: int = 16,
    overlap: bool = True,
    device: bool = False,
) -> dict:
    """`batch` requests of `prompt`-token prompts decoding together: the median over `steps`
    engine steps of the step's wall time and its host time (ms), after the prefill and two
    steps' compiles; with `device`, the device step alone at the same point (`device_step_ms`);
    and the tokens each request sampled (seeded, temperature 1).

    Raises if a timed step compiled a program (the timing would include the compile)."""
    tokens = prompt + steps + 8
    if tokens > cfg.max_seq:
        raise ValueError(f"prompt {prompt} + {steps} steps + 8 exceeds max_seq {cfg.max_seq}")
    eng = engine_for(params, cfg, batch, prompt, tokens, overlap)
    rng = np.random.default_rng(0)
    reqs = [
        Request(
            str(i),
            [int(t) for t in rng.integers(32, 127, prompt)],
            steps + 8,
            SamplingParams(1.0, seed=i),
        )
        for i in range(batch)
    ]
    for r in reqs:
        eng.add(r)
    for _ in range(3):  # the prefill, then two decode steps: every program compiled
        eng.step()
    compiled, walls, hosts = eng.compiles, [], []
    for _ in range(steps):
        waited, t0 = eng.wait_s, time.perf_counter()
        eng.step()
        wall = time.perf_counter() - t0
        walls.append(wall)
        hosts.append(wall - (eng.wait_s - waited))
    if eng.compiles != compiled:
        raise RuntimeError("a timed engine step compiled a program; raise the warm-up")
    # the device step over the running rows; it rewrites the slots the next step writes, so the
    # tokens stay the same
    device_ms = device_step_ms(eng, reqs, steps) if device else None
    while eng.has_work():
        eng.step()
    return {
        "step_ms": float(np.median(walls)) * 1e3,
        "device_ms": device_ms,
        "host_ms": float(np.median(hosts)) * 1e3,
        "tokens": [r.out for r in reqs],
    }


def device_step_ms(eng: Engine, reqs: list[Request], steps: int) -> float:
    """The engine's decode program over the running `reqs` (one token each), dispatched back to
    back on the same inputs with no host work between: the device step alone (ms)."""
    feed = eng.feed([(r, 1) for r in reqs], 1)
    feed["src"][:] = -1
    prev = (jnp.zeros((eng.b_max,), jnp.int32),) * 2
    with program.on(eng.mesh):
        pool, out = program.run(eng.params, eng.pool, feed, *prev, eng.cfg)
        jax.block_until_ready(out)
        t0 = time.perf_counter()
        for _ in range(steps):
            pool, out = program.run(eng.params, pool, feed, *prev, eng.cfg)
        jax.block_until_ready(out)
    eng.pool = pool  # the pool was donated
    return (time.perf_counter() - t0) / steps * 1e3


def compare(params, cfg: ModelConfig, batch: int, steps: int, prompt: int = 16) -> dict:
    """The engine's step with its tokens read first (no overlap) and a step late (overlap),
    beside its device step alone: ms per step, and whether both sampled the same tokens."""
    runs = {on: steady(params, cfg, batch, steps, prompt, on, device=on) for on in (False, True)}
    return {
        "device_ms": runs[True]["device_ms"],
        "engine_ms": {k: v["step_ms"] for k, v in runs.items()},
        "host_ms": {k: v["host_ms"] for k, v in runs.items()},
        "same_tokens": runs[False]["tokens"] == runs[True]["tokens"],
    }
