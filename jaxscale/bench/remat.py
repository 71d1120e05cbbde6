"""`jaxscale bench remat`: the activation-checkpointing policies side by side, on the compiled
training step (one device).

Each policy (`--remat`: none, block, dots, every:K, sqrt) compiles the step twice: with its
layers scanned (what `jaxscale train` runs) for the temporaries (memory_analysis), and unrolled
for the FLOPs (a loop body counts once, so only the unrolled program counts every layer's
recompute): all of them (cost_analysis) and the matmuls' (analysis/matmuls.py, the HLO's dots).
Recompute = the policy's FLOPs over none's.

Predicted beside them:
  segments  the segment model behind seed 001 §6's "memory ~ N/(C+1)" (C checkpoints cut N
            layers into C+1 segments; one segment's saved activations are live at a time):
            temp(K) = base + ceil(L/K) x + K A, x = B T D x 4 bytes (one kept block input), A one
            layer's saved activations, base what no policy changes. A and base are solved from
            the none and block rows (temp(L) = base + L A, temp(1) = base + L x + A), so the
            every:K and sqrt rows are predictions; dots is outside the model (it keeps parts).
  seed 004  checkpoints every sqrt(L) layers keep sqrt(L)/L of the activations (§12).
  recompute one more forward of the layers (model/counts.forward_flops less the head), less
            each recomputed run's last matmul (the MLP's down-projection, whose output only
            feeds the kept run output): near seed 001 §6's +33% (the backward costs two
            forwards; its +100% is recomputing twice); dots recomputes only attention's two
            batched matmuls (q.k and p.v). Against the HLO's dots; cost_analysis's total also
            holds the recomputed elementwise work (softmax, norms, activations).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import jax
import numpy as np

from jaxscale.analysis.matmuls import matmul_flops
from jaxscale.analysis.memory import memory_report
from jaxscale.compat import cost_analysis
from jaxscale.config import ModelConfig, TrainConfig, remat_group
from jaxscale.model.counts import forward_flops
from jaxscale.parallel import auto

MIB = 2**20
CFG = ModelConfig(d_model=128, n_layers=16, n_heads=4, n_kv_heads=2, d_ff=512, max_seq=512)


@dataclass(frozen=True)
class Row:
    policy: str
    group: int | None  # blocks recomputed together (every:K's K); None: per block or none
    temp: int  # bytes, memory_analysis of the scanned step
    flops: float  # cost_analysis of the unrolled step
    matmul_flops: float  # its dots (analysis/matmuls.py)
    predicted_temp: float | None = None  # the segment model's, for every:K and sqrt
    predicted_recompute: float | None = None  # FLOPs over none's, from the model's counts


def _compile(cfg: ModelConfig, tcfg: TrainConfig):
    args = (
        jax.eval_shape(lambda: auto.init_state(cfg, tcfg)),
        jax.ShapeDtypeStruct((tcfg.global_batch, tcfg.seq_len + 1), np.int32),
    )
    return auto.jit_train_step(cfg, tcfg).lower(*args).compile()


def temporaries(cfg: ModelConfig, tcfg: TrainConfig, policy: str) -> int:
    """Bytes of temporaries of the scanned single-device step under `policy`."""
    return memory_report(_compile(cfg.replace(remat=policy), tcfg)).temp


def measure(cfg: ModelConfig, tcfg: TrainConfig, policy: str) -> Row:
    temp = temporaries(cfg, tcfg, policy)
    unrolled = _compile(cfg.replace(remat=policy, unroll_layers=True), tcfg)
    flops, dots = cost_analysis(unrolled)["flops"], matmul_flops(unrolled.as_text())
    return Row(policy, remat_group(policy, cfg.n_layers), temp, flops, dots)


def kept_input_bytes(cfg: ModelConfig, tcfg: TrainConfig) -> int:
    """x: one block input [B, T, D] in f32 (the residual stream is kept in float32)."""
    return tcfg.global_batch * tcfg.seq_len * cfg.d_model * 4


def segment_model(cfg: ModelConfig, tcfg: TrainConfig, none: int, block: int):
    """(base, A) solved from the none and block temporaries (module docstring)."""
    L, x = cfg.n_layers, kept_input_bytes(cfg, tcfg)
    per_layer = (none - block + L * x) / (L - 1)
    return none - L * per_layer, per_layer


def predicted_recompute(cfg: ModelConfig, tcfg: TrainConfig, policy: str) -> float | None:
    """Matmul FLOPs a policy adds to a dense model's step (None: none). A recomputed run of
    layers skips its last matmul, the MLP's down-projection: its output only feeds the run's
    output, which is kept. dots recomputes attention's q.k^T and p.v ([B, H, T, T] x K each)."""
    B, T, L = tcfg.global_batch, tcfg.seq_len, cfg.n_layers
    if policy == "none":
        return None
    if policy == "dots":
        return float(L * 2 * 2 * B * T * T * cfg.n_heads * cfg.head_dim)
    k = remat_group(policy, L) or 1  # block: runs of one layer
    layers = forward_flops(cfg, B, T) - 2.0 * B * T * cfg.d_model * cfg.vocab  # less the head
    return layers - math.ceil(L / min(k, L)) * 2.0 * B * T * cfg.d_model * cfg.d_ff


def run(cfg: ModelConfig, tcfg: TrainConfig, policies, progress=None) -> list[Row]:
    """Every policy measured (none and block always, first: the segment model needs them)."""
    order = ["none", "block"] + [p for p in policies if p not in ("none", "block")]
    rows = {}
    for policy in order:
        rows[policy] = measure(cfg, tcfg, policy)
        if progress:
            progress.update(1, note=policy)
    base, per_layer = segment_model(cfg, tcfg, rows["none"].temp, rows["block"].temp)
    x, L = kept_input_bytes(cfg, tcfg), cfg.n_layers
    out = []
    for r in rows.values():
        k = None if r.group is None else min(r.group, L)
        out.append(
            replace(
                r,
                predicted_temp=None if k is None else base + math.ceil(L / k) * x + k * per_layer,
                predicted_recompute=predicted_recompute(cfg, tcfg, r.policy),
            )
        )
    return out


def format_table(rows: list[Row], cfg: ModelConfig, tcfg: TrainConfig) -> str:
    none = rows[0]
    L = cfg.n_layers
    lines = [
        f"activation checkpointing, one device: d_model {cfg.d_model}, {L} layers, batch "
        f"{tcfg.global_batch} x seq {tcfg.seq_len}; temporaries from memory_analysis (scanned "
        "step), FLOPs from cost_analysis and the HLO's dots (unrolled step)",
        f"  {'policy':<9} {'K':>3} {'temp MiB':>9} {'x none':>7} {'segments':>9} "
        f"{'GFLOP':>7} {'recompute':>10} {'matmuls':>8} {'predicted':>10}",
    ]
    for r in rows:
        k = "-" if r.group is None else str(min(r.group, L))
        seg = "-" if r.predicted_temp is None else f"{r.predicted_temp / MIB:.1f}"
        pred = "-" if r.predicted_recompute is None else f"{r.predicted_recompute / 1e9:.3f}"
        lines.append(
            f"  {r.policy:<9} {k:>3} {r.temp / MIB:>9.1f} {r.temp / none.temp:>7.2f} {seg:>9} "
            f"{r.flops / 1e9:>7.2f} {r.flops / none.flops - 1:>+10.1%} "
            f"{(r.matmul_flops - none.matmul_flops) / 1e9:>8.3f} {pred:>10}"
        )
    s = math.sqrt(L)
    lines.append(
        "  recompute: all FLOPs over none's; matmuls: the added dots' GFLOP, predicted: the "
        "recomputed layers' matmul count (module docstring)\n"
        f"  seeds: 001 §6 memory ~ N/(C+1) of the activations (every:K keeps K/L: the segments "
        f"column), compute +33% to +100%; 004 §12 sqrt(L)/L = {s / L:.2f} of the activations "
        f"at checkpoints every sqrt(L) = {s:.1f} layers"
    )
    return "\n".join(lines)


def plot(path: str, rows: list[Row]) -> None:
    from jaxscale.render import figure

    none = rows[0]
    with figure(path, figsize=(8, 5.5), dpi=110) as (_, ax):
        for r in rows:
            extra = 100 * (r.flops / none.flops - 1)
            ax.plot(extra, r.temp / MIB, "o", ms=8)
            ax.annotate(r.policy, (extra, r.temp / MIB), xytext=(6, 4), textcoords="offset points")
            if r.predicted_temp is not None and r.group is not None:
                ax.plot(extra, r.predicted_temp / MIB, "x", color="grey", ms=8)
        ax.plot([], [], "x", color="grey", label="segment model (from none and block)")
        ax.set_xlabel("recompute: FLOPs over none's (%)")
        ax.set_ylabel("temporaries of the step (MiB)")
        ax.set_title("activation checkpointing: memory vs recompute per policy")
        ax.legend(fontsize=8, loc="upper right")


def main(args) -> int:
    """`jaxscale bench remat`."""
    from jaxscale.progress import Progress

    cfg = CFG.replace(n_layers=args.layers, max_seq=max(CFG.max_seq, args.seq_len))
    tcfg = TrainConfig(global_batch=args.global_batch, seq_len=args.seq_len)
    policies = list(dict.fromkeys(args.policies))
    if args.dry_run:
        print("\n".join(policies))
        return 0
    n = len(set(policies) | {"none", "block"})
    bar = Progress(n, desc="bench remat", enabled=not args.json, eta=False)
    rows = run(cfg, tcfg, policies, bar)
    bar.close()
    record = {
        "model": asdict(cfg),
        "global_batch": tcfg.global_batch,
        "seq_len": tcfg.seq_len,
        "rows": [asdict(r) for r in rows],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench_remat.json"
    path.write_text(json.dumps(record, indent=1))
    png = None if args.no_plot else (args.plot or str(out / "bench_remat.png"))
    if png:
        plot(png, rows)
    if args.json:
        print(json.dumps(record))
    else:
        print(format_table(rows, cfg, tcfg))
        print(f"wrote {path}" + (f" and {png}" if png else ""), file=sys.stderr)
    return 0
