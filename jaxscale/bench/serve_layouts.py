"""`jaxscale bench serve --layouts`: the engine on each layout `jaxscale serve --mesh` takes, its
compiled programs' collectives beside the prediction, and its throughput on one workload.

Layouts: one device; tp=2 and tp=4 (tensor-parallel decode: the placed parameters and KV pages
split over `tensor`, the program partitioned by GSPMD); dp=2 (two one-device replicas behind
the router: no collective); and an MoE model of the same size (8 experts, top-2, every layer)
on one device and on ep=4 (expert-parallel decode, serve/program.expert_moe: each device holds
2 experts). For the decode program (B = max_num_seqs rows of one token) and a prefill chunk
(one row of `budget` tokens), the census of the compiled program (analysis/hlo.py): the
all-reduces in the layer loop (one trip per layer) against the prediction -- Megatron's two per
layer of [B, T, D] in the compute dtype (the attention and MLP outputs, row-parallel), expert
parallelism's one per MoE layer (the experts' outputs summed) -- and the rest GSPMD's own
choices around the layers (embedding, sampling over the vocabulary), measured and shown, not
predicted. Then tokens/s of the same greedy requests in process (replicas: through the router's
threads). On simulated CPU devices the tokens/s are indicative: the devices share the host's
cores.
"""

from __future__ import annotations

import threading
import time

import jax

from jaxscale.config import ModelConfig

# (layout, MoE model?): the dense model's layouts, then the MoE model's
LAYOUTS = ((None, False), ("tp=2", False), ("tp=4", False), ("dp=2", False), (None, True))
LAYOUTS += (("ep=4", True),)
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def moe_model(cfg: ModelConfig) -> ModelConfig:
    """The MoE model of the layouts' table: `cfg` with 8 experts, top-2, in every layer."""
    return cfg.replace(n_experts=8, top_k=2, moe_every=1, moe_mode="dropless")


def predicted_layer_bytes(cfg: ModelConfig, spec: str | None, B: int, T: int) -> float:
    """Bytes per device of the layers' all-reduces in one program: tensor parallelism's 2 per
    layer of [B, T, D], expert parallelism's 1 per MoE layer; 0 on one device."""
    per = {"tp": 2.0 * cfg.n_layers, "ep": float(cfg.n_moe_layers)}.get((spec or "")[:2], 0.0)
    return per * B * T * cfg.d_model * _BYTES[cfg.compute_dtype]


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
    cfg = engine.cfg
    trips = cfg.n_layers // (cfg.moe_every if cfg.n_experts else 1)  # the layer scan's
    layers, other = 0.0, {}
    for c in found:
        if c.op == "all-reduce" and c.trips == trips:
            layers += c.bytes_per_device * c.trips
        else:
            other[c.op] = other.get(c.op, 0.0) + c.bytes_per_device * c.trips
    return {"layers": layers, "other": other}


def throughput(engines, prompts: list[list[int]], max_new: int) -> float:
    """Generated tokens per second for `prompts` (greedy), the engines behind the router."""
    from jaxscale.serve.replicas import Router
    from jaxscale.serve.sampling import SamplingParams
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
        router.submit(Request(f"r{i}", p, max_new, SamplingParams(0.0)), callback)
    finished = done.wait(timeout=600)
    seconds = time.perf_counter() - t0
    router.stop()
    if not finished:
        raise RuntimeError("the layout's requests did not finish in 600 s")
    return tokens[0] / seconds


def run(setup, params, prompts, progress=None) -> list[dict]:
    """One row per layout (bench/serve_setup.py's Setup: model, slots, budget, page size, new
    tokens; the model's params; the workload's prompts)."""
    from jaxscale.bench.serve_setup import engine
    from jaxscale.model import state as ms
    from jaxscale.serve.replicas import replica_meshes

    moe_cfg = moe_model(setup.cfg)
    moe_params = ms.init_params(moe_cfg, 0)
    rows = []
    for spec, moe in LAYOUTS:
        cfg = moe_cfg if moe else setup.cfg
        meshes = replica_meshes(spec, jax.devices())
        model = moe_params if moe else params
        engines = [engine(setup, model, 256, cfg=cfg, mesh=m) for m in meshes]
        for e in engines:
            e.warmup()
        decode = census(engines[0], setup.max_num_seqs, 1)
        prefill = census(engines[0], 1, setup.budget)
        rows.append(
            {
                "layout": (spec or "1 device") + (" MoE" if moe else ""),
                "decode": decode,
                "decode_predicted": predicted_layer_bytes(cfg, spec, setup.max_num_seqs, 1),
                "prefill": prefill,
                "prefill_predicted": predicted_layer_bytes(cfg, spec, 1, setup.budget),
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
        "measured/predicted (tp: 2 per layer of [B, T, D]; ep: 1 per MoE layer) and GSPMD's "
        "other collectives; tokens/s of the same greedy requests in process (MoE: 8 experts, "
        "top-2, every layer)",
        f"  {'layout':<14} {'tok/s':>7} {'decode layers':>15} {'prefill layers':>16}  "
        "decode: GSPMD's other collectives",
    ]
    for r in rows:
        d, p = r["decode"], r["prefill"]
        decode = f"{d['layers'] / 1024:.1f}/{r['decode_predicted'] / 1024:.1f}"
        prefill = f"{p['layers'] / 1024:.1f}/{r['prefill_predicted'] / 1024:.1f}"
        lines.append(
            f"  {r['layout']:<14} {r['tokens_per_s']:>7.0f} {decode:>15} {prefill:>16}  "
            f"{other(d['other'])}"
        )
    return "\n".join(lines)
