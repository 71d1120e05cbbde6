"""The bench's MoE rows: expert parallelism, TP of experts and the auto path on one MoE model.

Each row is a mesh row of `bench meshes` (jaxscale/bench/meshes.py: compiled, census, a short
trajectory checked against one device) on an MoE model, printed with the all-to-alls first: their
count and bytes per device from the HLO census against `ep.predict_comm` (4 per MoE layer:
dispatch and combine, forward and backward, each E x B_l x C x D values).

The seed's EP-vs-TP table (seed 002 ch7 "EP vs TP": TP 2S, EP 2kS/N) is then measured on the
compiled forward programs: the bytes one MoE layer adds (a 2-layer model minus a 1-layer one) on
tp=8 (TP of experts: the attention's and the MoE's all-reduce) and on ep=8 with E = 16 experts,
against both readings of N, EP ranks and experts. Capacity factor 1 there, so C = T k / E.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import jax

from jaxscale import verify
from jaxscale.analysis.compiled import compile_with_report
from jaxscale.bench import meshes
from jaxscale.config import ModelConfig
from jaxscale.parallel.compose import Strategy, build
from jaxscale.tolerances import COMM_RTOL

# the bench's MoE rows, from the one case list: expert parallelism (with DP, with ZeRO-1), TP of
# experts (every expert's F split, one all-reduce) and the auto path (GSPMD places the collectives)
ROWS = verify.bench_cases("experts")
CFG = verify.CFG.replace(**dict(verify.MOE), unroll_layers=True)
SEED_CFG = CFG.replace(n_experts=16, capacity_factor=1.0)  # the EP-vs-TP measurement's model
KIB = 1024


@dataclass(frozen=True)
class SeedRow:
    layout: str
    op: str
    measured: float  # bytes per device one MoE layer's forward adds
    formula: str
    predicted: float


def _forward_bytes(text: str, mesh: str, cfg: ModelConfig, op: str, batch: int, seq: int):
    """Bytes of `op` per device in the compiled forward (loss) program."""
    built = build(Strategy.parse(text, mesh), cfg, verify.TCFG)
    state, tokens = built.abstract_args(batch, seq)
    with jax.set_mesh(built.mesh):
        _, report = compile_with_report(built.loss, state["params"], tokens)
    totals = report.collective_totals()
    return totals[op].total_bytes if op in totals else 0.0


def seed_table(batch: int, seq: int) -> list[SeedRow]:
    """TP 2S and EP 2kS/N, measured per MoE layer (2-layer minus 1-layer forward program)."""
    cfg, k, n_ranks = SEED_CFG, SEED_CFG.top_k, 8
    S = batch * seq * cfg.d_model * 4  # the batch's activations, f32 bytes

    def per_layer(text, mesh, op):
        two = _forward_bytes(text, mesh, cfg.replace(n_layers=2), op, batch, seq)
        return two - _forward_bytes(text, mesh, cfg.replace(n_layers=1), op, batch, seq)

    tp = per_layer("manual:tp", "tp=8", "all-reduce")
    ep = per_layer("manual:ep", "ep=8", "all-to-all")
    return [
        SeedRow("TP of experts, tp=8", "all-reduce", tp, "2S", 2 * S),
        SeedRow("EP, ep=8, E=16", "all-to-all", ep, "2kS/N, N = 8 EP ranks", 2 * k * S / n_ranks),
        SeedRow(
            "EP, ep=8, E=16", "all-to-all", ep, "2kS/N, N = 16 experts", 2 * k * S / cfg.n_experts
        ),
    ]


def a2a(row: meshes.BenchRow) -> tuple[int, float, float]:
    """(count, measured bytes, predicted bytes) of the row's all-to-alls."""
    totals = row.report.collective_totals()
    t = totals.get("all-to-all")
    return (
        t.count if t else 0,
        t.total_bytes if t else 0.0,
        (row.comm_predicted or {}).get("all-to-all", 0.0),
    )


def format_rows(rows: list[meshes.BenchRow]) -> str:
    head = (
        f"{'strategy':<32} {'mesh':<10} {'a2a':>4} {'a2a KiB meas/pred':>19} "
        f"{'all-reduce KiB meas/pred':>25} {'other KiB':>9} {'comm':>5} {'ms':>7}"
        "  eq"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.report is None:
            lines.append(f"{r.label:<32} {r.case.mesh:<10} ✗ {r.error}")
            continue
        n, got, want = a2a(r)
        totals = {op: t.total_bytes for op, t in r.report.collective_totals().items()}
        ar = totals.get("all-reduce", 0.0)
        ar_pred = (r.comm_predicted or {}).get("all-reduce")
        other = sum(b for op, b in totals.items() if op not in ("all-to-all", "all-reduce"))
        pred = "GSPMD" if r.comm_predicted is None else f"{want / KIB:.1f}"
        ar_text = f"{ar / KIB:.1f}/" + ("-" if ar_pred is None else f"{ar_pred / KIB:.1f}")
        ok = {True: "✓", False: "✗", None: "·"}[r.comm_ok]
        lines.append(
            f"{r.label:<32} {r.case.mesh:<10} {n:>4} {f'{got / KIB:.1f}/{pred}':>19} "
            f"{ar_text:>25} {other / KIB:>9.1f} {ok:>5} {r.step_ms_median:>7.1f}  "
            f"{'✓' if r.equivalent else '✗'}"
        )
    return "\n".join(lines)


def format_seed(rows: list[SeedRow], batch: int, seq: int) -> str:
    cfg = SEED_CFG
    lines = [
        f"seed 002 ch. 7, EP vs TP per MoE layer forward, per device (S = B*T*D*4 = "
        f"{batch}*{seq}*{cfg.d_model}*4 bytes, k = {cfg.top_k}, capacity factor 1):",
        f"  {'layout':<22} {'op':<11} {'measured KiB':>12}  {'formula':<24} {'KiB':>7} "
        f"within {COMM_RTOL:.0%}",
    ]
    for r in rows:
        mark = "✓" if abs(r.measured - r.predicted) <= COMM_RTOL * r.predicted else "✗"
        lines.append(
            f"  {r.layout:<22} {r.op:<11} {r.measured / KIB:>12.1f}  {r.formula:<24} "
            f"{r.predicted / KIB:>7.1f} {mark}"
        )
    return "\n".join(lines)


def main(args) -> int:
    """`jaxscale bench experts`: the MoE rows and the EP-vs-TP table."""
    from jaxscale.progress import Progress

    tcfg = verify.TCFG
    if args.dry_run:
        print("\n".join(f"{c.strategy.label():<20} {c.mesh}" for c in ROWS))
        return 0
    bar = Progress(len(ROWS) + 2, desc="bench experts", enabled=not args.json)
    ref, _ = meshes.reference(CFG, tcfg, args.steps + 1)
    bar.update(1, note="reference")
    rows = []
    for case in ROWS:
        rows.append(meshes.bench_case(case, CFG, tcfg, args.steps, ref))
        bar.update(1, note=f"{rows[-1].label} {case.mesh}")
    seed = seed_table(tcfg.global_batch, tcfg.seq_len)
    bar.update(1, note="EP vs TP")
    bar.close()
    record = {
        "model": {
            k: getattr(CFG, k)
            for k in ("d_model", "n_layers", "n_experts", "top_k", "capacity_factor", "d_ff")
        },
        "rows": [
            {
                "label": r.label,
                "mesh": r.case.mesh,
                "a2a": dict(zip(("count", "measured", "predicted"), a2a(r), strict=True))
                if r.report
                else None,
                "comm": r.comm if r.report else None,
                "comm_ok": r.comm_ok if r.report else None,
                "equivalent": r.equivalent,
                "step_ms": r.step_ms_median,
                "error": r.error,
            }
            for r in rows
        ],
        "seed_ep_vs_tp": [vars(r) for r in seed],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench_experts.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    if args.json:
        print(json.dumps(record, default=str))
    else:
        print(
            f"MoE: E={CFG.n_experts} top-{CFG.top_k} cf={CFG.capacity_factor:g}, "
            f"{CFG.n_layers} MoE layers, d_model {CFG.d_model}, batch {tcfg.global_batch} x "
            f"seq {tcfg.seq_len}; a2a per step = 4 per MoE layer (dispatch + combine, "
            f"forward and backward)"
        )
        print(format_rows(rows))
        if jax.default_backend() == "cpu" and jax.config.read("jax_disable_most_optimizations"):
            print(
                "ms: median step on simulated CPU devices at XLA's backend optimisation level 0 "
                "(how `jaxscale bench experts` compiles on CPU): compare the bytes, not the ms"
            )
        print()
        print(format_seed(seed, tcfg.global_batch, tcfg.seq_len))
        for r in rows:
            if r.report is not None and r.case.strategy.path == "auto" and a2a(r)[0] == 0:
                ops = ", ".join(sorted(r.report.collective_totals()))
                print(f"\n{r.label} on {r.case.mesh}: GSPMD places no all-to-all ({ops}).")
        print(f"wrote {path}", file=sys.stderr)
    ok = all(r.report is not None and r.equivalent and r.comm_ok is not False for r in rows)
    return 0 if ok else 1
