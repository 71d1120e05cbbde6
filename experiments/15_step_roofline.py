"""What limits one training step on this device: the compiled step's FLOPs and bytes against the
device's roofline, its device-side time, and MFU (docs/hardware.md records the H100 runs).

    python experiments/15_step_roofline.py                       # tiny model, on any backend
    python experiments/15_step_roofline.py --d-model 1024 --layers 24 --heads 16 --d-ff 3584 \
        --seq-len 1024 --batch 32 --compute-dtype bfloat16 --attention cudnn     # ~365M, GPU

The step is `jaxscale train`'s: layers scanned unless --unroll-layers (the default path is the
one to measure; docs/performance.md, "The layer scan").

1. the compiled step: FLOPs and bytes accessed (cost_analysis with every trip of the layer loop
   counted, `analysis.loop_cost`), temporaries (memory_analysis); --hlo-out saves its optimized
   HLO, where the scan's slot copies show;
2. its roofline floor: max(FLOPs / peak, bytes / HBM bandwidth) from jaxscale/hardware.py, and
   which side binds (FLOPs: the larger of the compiled and the model count, since XLA:GPU's
   cost_analysis does not count cuBLAS and cuDNN calls);
3. the step timed alone (device-side: steps dispatched back to back, one wait at the end), so the
   gap to `jaxscale train`'s tokens/s is the training loop's host work;
4. MFU with model FLOPs (jaxscale/model/counts.py: causal attention halved, no remat).
"""

import argparse
import time
from pathlib import Path

import jax
import numpy as np

from jaxscale.analysis.compiled import compile_with_report
from jaxscale.analysis.loop_bytes import KINDS, by_kind, slot_access
from jaxscale.analysis.loop_cost import loop_cost
from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.devices import mfu
from jaxscale.hardware import for_device_kind
from jaxscale.model import counts
from jaxscale.parallel import auto


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads (MHA)")
    p.add_argument("--d-ff", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--compute-dtype", default="float32")
    p.add_argument("--param-dtype", default="float32")
    p.add_argument("--attention", default="jaxscale", choices=("jaxscale", "xla", "cudnn"))
    p.add_argument(
        "--remat", default="none", help="activation checkpointing policy (jaxscale train --help)"
    )
    p.add_argument("--unroll-layers", action="store_true", help="no layer loop in the program")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--hlo-out", help="write the compiled step's optimized HLO text to this file")
    a = p.parse_args()
    cfg = ModelConfig(
        d_model=a.d_model,
        n_layers=a.layers,
        n_heads=a.heads,
        n_kv_heads=a.kv_heads or a.heads,
        d_ff=a.d_ff,
        max_seq=a.seq_len,
        compute_dtype=a.compute_dtype,
        param_dtype=a.param_dtype,
        attention_impl=a.attention,
        remat=a.remat,
        unroll_layers=a.unroll_layers,
    )
    tcfg = TrainConfig(global_batch=a.batch, seq_len=a.seq_len, warmup_steps=0)
    kind = jax.devices()[0].device_kind
    device = for_device_kind(kind)
    print(
        f"device {kind}, jax {jax.__version__}; {counts.param_count(cfg) / 1e6:.1f}M params, "
        f"batch {a.batch} x {a.seq_len}, {a.compute_dtype} compute, {a.param_dtype} params, "
        f"attention {a.attention}{'' if a.remat == 'none' else f', remat {a.remat}'}, "
        f"layers {'unrolled' if a.unroll_layers else 'scanned'}"
    )

    # 1. the compiled step, every trip of the layer loop counted
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (a.batch, a.seq_len + 1), np.int32)
    state = auto.init_state(cfg, tcfg)
    step = auto.jit_train_step(cfg, tcfg)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (state, tokens))
    compiled, rep = compile_with_report(step, *abstract)
    flops, nbytes = _every_trip(compiled, rep)
    if a.hlo_out:
        Path(a.hlo_out).write_text(compiled.as_text())
    print(
        f"compiled in {rep.compile_s:.1f} s: {flops / 1e12:.2f} TFLOP, "
        f"{nbytes / 1e9:.2f} GB accessed, temporaries {rep.memory.temp / 2**30:.2f} GiB"
    )
    if not a.unroll_layers:
        # what the scan adds: its residual stacks' fill, slot writes and slot reads, which a
        # backend that fuses slices into its matmuls (XLA:GPU's dynamic-slice fusion) drops
        for label, read in (
            ("the layer scan's stack traffic", _stack_traffic),
            ("slot accesses a matmul makes itself (no copy)", _slot_matmuls),
        ):
            try:
                print(f"{label}: {read(compiled)}")
            except Exception as e:  # noqa: BLE001 -- HLO text the parser does not know: the
                # step is timed all the same
                print(f"{label}: not read ({type(e).__name__}: {e})")

    # 2. the roofline floor. The FLOPs side uses the larger of the compiled and the model
    # count: XLA:GPU's cost_analysis leaves out library calls (cuBLAS gemms, cuDNN attention),
    # so on a GPU the compiled figure can be a small fraction of the work.
    model = counts.train_step_flops(cfg, a.batch, a.seq_len, causal=True, executed=False)
    work = max(flops, model)
    if device is not None and device.flops_per_s and device.hbm_bytes_per_s:
        t_flops = work / device.flops_per_s
        t_bytes = nbytes / device.hbm_bytes_per_s
        bound = "compute" if t_flops >= t_bytes else "memory"
        print(
            f"roofline floor: FLOPs {t_flops * 1e3:.1f} ms, bytes {t_bytes * 1e3:.1f} ms "
            f"({bound}-bound); intensity {work / nbytes:.0f} FLOP/byte vs "
            f"ridge {device.flops_per_s / device.hbm_bytes_per_s:.0f}"
        )
    else:
        print("roofline: this device's peak is not in jaxscale/hardware.py")

    # 3. device-side step time: dispatch back to back, wait once
    state, metrics = compiled(state, tokens)  # warm-up (the first call pays the transfers)
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        state, metrics = compiled(state, tokens)
    jax.block_until_ready(metrics)
    step_s = (time.perf_counter() - t0) / a.steps
    print(
        f"step {step_s * 1e3:.1f} ms, {a.batch * a.seq_len / step_s:,.0f} tokens/s; model "
        f"{model / 1e12:.2f} TFLOP per step, compiled/model = "
        f"{flops / model:.2f}"
    )

    # 4. MFU (never on CPU: its peak is unknown)
    value = mfu(model, step_s, kind)
    print(f"MFU {value:.1%}" if value is not None else "MFU: no peak known for this device")


def _every_trip(compiled, rep) -> tuple[float, float]:
    """(FLOPs, bytes accessed) with each layer-loop trip counted. Where this backend cannot
    re-cost a loop body on its own, the compiler's figures (a loop body once) and why."""
    try:
        cost = loop_cost(compiled)
    except Exception as e:  # noqa: BLE001 -- a backend's cost analysis refusing a module
        print(f"loop trips not counted ({type(e).__name__}: {e}); figures count a body once")
        return rep.flops, rep.bytes_accessed
    return cost["flops"], cost["bytes accessed"]


def _stack_traffic(compiled) -> str:
    split = by_kind(compiled)
    stacks = ", ".join(f"{k} {split[k] / 1e9:.3f} GB" for k in KINDS if k != "compute")
    return f"{stacks} (of {sum(split.values()) / 1e9:.3f} GB)"


def _slot_matmuls(compiled) -> str:
    loops = [x for x in slot_access(compiled) if x["matmuls"]]  # the layer loops
    if not loops:  # the compiler unrolled them (XLA:GPU's full-unroll flag)
        return "no layer loop left in the compiled step"
    names = ("forward", "backward") if len(loops) == 2 else [f"loop {i}" for i in range(len(loops))]
    return "; ".join(
        f"{name} {x['matmul reads']} of {x['matmul reads'] + x['reads apart']} reads, "
        f"{x['matmul writes']} of {x['matmul writes'] + x['writes apart']} writes"
        for name, x in zip(names, loops, strict=True)
    )


if __name__ == "__main__":
    main()
