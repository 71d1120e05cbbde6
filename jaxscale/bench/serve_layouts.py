"""`jaxscale bench serve --layouts`: the engine on each layout `jaxscale serve --mesh` takes, its
compiled programs' collectives beside the prediction, and its throughput on one workload.

Layouts: one device; tp=2 and tp=4 (tensor-parallel decode: the placed parameters and KV pages
split over `tensor`, the program partitioned by GSPMD); dp=2 (two one-device replicas behind
the router: no collective). For the decode program (B = max_num_seqs rows of one token) and a
prefill chunk (one row of `budget` tokens), the census of the compiled program
(analysis/hlo.py): the all-reduces in the layer loop (trips = L) against Megatron's two per
layer of [B, T, D] in the compute dtype (the attention and MLP outputs, row-parallel), and the
rest GSPMD's own choices around the layers (embedding, sampling over the vocabulary), measured
and shown, not predicted. Then tokens/s of the same greedy requests in process (replicas:
through the router's threads). On simulated CPU devices the tokens/s are indicative: the
tensor-parallel devices share the host's cores.
"""

from __future__ import annotations

import threading
import time

import jax

from jaxscale.config import ModelConfig

LAYOUTS = (None, "tp=2", "tp=4", "dp=2")
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def predicted_layer_bytes(cfg: ModelConfig, B: int, T: int) -> float:
    """Bytes per device of the layers' all-reduces in one program: 2 per layer of [B, T, D]."""
    return 2.0 * cfg.n_layers * B * T * cfg.d_model * _BYTES[cfg.compute_dtype]


def census(engine, B: int, T: int) -> dict:
    """{"layers": bytes of the all-reduces in the layer loop, "other": {op: bytes} of the
    rest} per device for the engine's program of B rows x T tokens."""
    from jaxscale.analysis import hlo
    from jaxscale.serve import program, sampling

    feed = engine.padding(B, T)
    feed["settings"] = sampling.as_arrays([sampling.SamplingParams(0.0)] * B)
    with program.on(engine.mesh):
        lowered = program.run.lower(
            engine.params, engine.pool, feed, engine._zeros, engine._zeros, engine.cfg
        )
        found = hlo.normalize(hlo.collectives_of(lowered.compile()))
    layers, other = 0.0, {}
    for c in found:
        if c.op == "all-reduce" and c.trips == engine.cfg.n_layers:
            layers += c.bytes_per_device * c.trips
        else:
            other[c.op] = other.get(c.op, 0.0) + c.bytes_per_device * c.trips
    return {"layers": layers, "other": other}


def throughput(engines, prompts: list[list[int]], max_new: int) -> float:
    """Generated tokens per second for `prompts` (greedy), the engines behind the router."""
    from jaxscale.serve.replicas import Router
    from jaxscale.serve.scheduler import Request

    router = Router(engines)
    done = threading.Event()
    left = [len(prompts)]
    tokens = [0]
    lock = threading.Lock()

    def callback(ev):
        with lock:
            tokens[0] += 1
            if ev.finish_reason is not None:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        router.submit(Request(f"r{i}", p, max_new), callback)
    finished = done.wait(timeout=600)
    seconds = time.perf_counter() - t0
    router.stop()
    if not finished:
        raise RuntimeError("the layout's requests did not finish in 600 s")
    return tokens[0] / seconds


def run(setup, params, prompts, progress=None) -> list[dict]:
    """One row per layout (bench/serve.py's Setup: model, slots, budget, page size, new tokens;
    the model's params; the workload's prompts)."""
    from jaxscale.serve.engine import Engine, EngineConfig
    from jaxscale.serve.replicas import replica_meshes

    ecfg = EngineConfig(
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.budget,
        page_size=setup.page_size,
        n_pages=256,
    )
    rows = []
    for spec in LAYOUTS:
        meshes = replica_meshes(spec, jax.devices())
        engines = [Engine(params, setup.cfg, ecfg, mesh=m) for m in meshes]
        for e in engines:
            e.warmup()
        decode = census(engines[0], setup.max_num_seqs, 1)
        prefill = census(engines[0], 1, setup.budget)
        rows.append(
            {
                "layout": spec or "1 device",
                "decode": decode,
                "decode_predicted": predicted_layer_bytes(setup.cfg, setup.max_num_seqs, 1)
                if spec and spec.startswith("tp")
                else 0.0,
                "prefill": prefill,
                "prefill_predicted": predicted_layer_bytes(setup.cfg, 1, setup.budget)
                if spec and spec.startswith("tp")
                else 0.0,
                "tokens_per_s": throughput(engines, prompts, setup.max_new),
            }
        )
        if progress:
            progress.update(1, note=f"layout {rows[-1]['layout']}")
    return rows


def format_rows(rows: list[dict]) -> str:
    def other(d):
        return ", ".join(f"{op} {b / 1024:.1f}" for op, b in sorted(d.items())) or "-"

    lines = [
        "layouts (jaxscale serve --mesh): per program, KiB per device of the layers' all-reduces "
        "measured/predicted (2 per layer of [B, T, D]) and GSPMD's other collectives; tokens/s "
        "of the same greedy requests in process",
        f"  {'layout':<9} {'tok/s':>7} {'decode layers':>15} {'prefill layers':>16}  "
        "decode: GSPMD's other collectives",
    ]
    for r in rows:
        d, p = r["decode"], r["prefill"]
        decode = f"{d['layers'] / 1024:.1f}/{r['decode_predicted'] / 1024:.1f}"
        prefill = f"{p['layers'] / 1024:.1f}/{r['prefill_predicted'] / 1024:.1f}"
        lines.append(
            f"  {r['layout']:<9} {r['tokens_per_s']:>7.0f} {decode:>15} {prefill:>16}  "
            f"{other(d['other'])}"
        )
    return "\n".join(lines)
