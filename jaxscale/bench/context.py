"""`jaxscale bench context`: context parallelism's three forms side by side, on the compiled
programs.

  rows         each form as a mesh row of `bench meshes` (compiled, its collectives from the
               HLO census against cp.predict_comm summed with the other axes', a short
               trajectory checked against one device)
  balance      per-device attention FLOPs of causal attention over cp devices. The ring's
               conditionals decide at run time which chunk pairs run, so its per-device count
               is measured by running it (`cp.ring_attend_counted`), times one pair's FLOPs from
               cost_analysis; the all-gather and Ulysses programs have no such branch, so
               cost_analysis of the program is every device's figure. max/mean is the balance.
  temporaries  memory_analysis of the training step at T = 1k ... 8k tokens on cp devices,
               one sequence: per form, the slope of log(temporaries) against log(T), and the
               longest T within the stated per-device budget (doubling until it does not fit)

Expected (docs/context.md): the all-gather and Ulysses hold a [T/c, T] score matrix per head
(temporaries ~ T^2/c, slope 2); the ring a [s, s] block per chunk pair, s = T/(2c) (also
quadratic in T at fixed c, with a 4c-times-smaller constant) plus the K/V blocks of every hop
(linear). The zigzag split gives every device 2c+1 chunk pairs (max/mean 1); the contiguous
split gives device i i+1 pairs (max/mean 2c/(c+1)).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale import verify
from jaxscale.analysis.memory import memory_report
from jaxscale.bench import meshes
from jaxscale.compat import cost_analysis
from jaxscale.model import blockwise
from jaxscale.parallel import cp
from jaxscale.parallel.compose import Strategy, build

ROWS = verify.bench_cases("context")
CFG = verify.CFG.replace(unroll_layers=True)
LAYOUTS = (  # (strategy, form, split): the balance table's rows
    ("manual:cp_ring", "ring", "zigzag"),
    ("manual:cp_ring_contig", "ring", "contiguous"),
    ("manual:cp_gather", "gather", "zigzag"),
    ("manual:cp_ulysses", "ulysses", "zigzag"),
)
# the temporaries table's: each form once (the split moves work, not memory: the contiguous
# ring's temporaries are within 12% of the zigzag one's, `jaxscale bench context --all-splits`)
TEMP_LAYOUTS = ("manual:cp_ring", "manual:cp_gather", "manual:cp_ulysses")
BALANCE_T = 4096
TEMP_TS = (1024, 2048, 4096, 8192)
BUDGET_MIB = 256  # the per-device memory budget the longest-sequence column is measured against
MAX_T = 65536  # the doubling stops here
MIB = 2**20
KIB = 1024


@dataclass(frozen=True)
class Balance:
    layout: str
    split: str
    flops: list  # attention FLOPs (forward) per device
    how: str

    @property
    def ratio(self) -> float:
        return max(self.flops) / float(np.mean(self.flops))


@dataclass(frozen=True)
class Temps:
    layout: str
    temps: dict  # T -> temporaries per device, bytes
    longest: int  # the longest T (a power of two) within BUDGET_MIB
    slope: float  # d log(temp) / d log(T) over TEMP_TS


def _mesh(c: int):
    return jax.make_mesh((c,), (cp.AXIS,), devices=jax.devices()[:c])


def _qkv(c: int, T: int):
    """Abstract q, k, v [1, T, H, K] of CFG's attention, sequence-sharded over `context`."""
    sharding = NamedSharding(_mesh(c), P(None, cp.AXIS))
    q = jax.ShapeDtypeStruct((1, T, CFG.n_heads, CFG.head_dim), jnp.float32, sharding=sharding)
    kv = jax.ShapeDtypeStruct((1, T, CFG.n_kv_heads, CFG.head_dim), jnp.float32, sharding=sharding)
    return q, kv


def balance(form: str, split: str, c: int, T: int = BALANCE_T) -> Balance:
    """Per-device attention FLOPs of one causal attention over `c` devices (module docstring)."""
    mesh = _mesh(c)
    spec = P(None, cp.AXIS)
    if form == "ring":

        def counted(q, k, v):
            pos = cp.device_positions(jax.lax.axis_index(cp.AXIS), c, T, split)
            _, done = cp.ring_attend_counted(q, k, v, pos, c=c, split=split)
            return done[None]

        fn = jax.shard_map(counted, mesh=mesh, in_specs=(spec,) * 3, out_specs=P(cp.AXIS))
        q, kv = _qkv(c, T)
        zeros = [jnp.zeros(a.shape, a.dtype, device=a.sharding) for a in (q, kv, kv)]
        pairs = np.asarray(jax.jit(fn)(*zeros))
        s = T // (c * cp.n_chunks(split))
        one = jax.ShapeDtypeStruct((1, s, CFG.n_heads, CFG.head_dim), jnp.float32)
        one_kv = jax.ShapeDtypeStruct((1, s, CFG.n_kv_heads, CFG.head_dim), jnp.float32)
        pos = jax.ShapeDtypeStruct((s,), jnp.int32)
        block = jax.jit(blockwise.block_attend).lower(one, one_kv, one_kv, pos, pos).compile()
        per_pair = float(cost_analysis(block).get("flops", 0.0))
        how = f"measured chunk pairs {pairs.tolist()} x {per_pair / 1e6:.2f} MFLOP (cost_analysis)"
        return Balance(f"ring ({split})", split, (pairs * per_pair).tolist(), how)

    def attn(q, k, v):
        pos = cp.device_positions(jax.lax.axis_index(cp.AXIS), c, T, split)
        return cp.ATTEND[form](q, k, v, pos, pos, c=c, split=split)

    fn = jax.shard_map(attn, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    q, kv = _qkv(c, T)
    flops = float(cost_analysis(jax.jit(fn).lower(q, kv, kv).compile()).get("flops", 0.0))
    return Balance(form, split, [flops] * c, "cost_analysis of the SPMD program (no branches)")


def step_temp(text: str, mesh: str, T: int) -> int:
    """Temporaries per device (memory_analysis) of the training step on one sequence of T."""
    tcfg = verify.TCFG.replace(seq_len=T, global_batch=1)
    built = build(Strategy.parse(text, mesh), verify.CFG, tcfg)
    state, tokens = built.abstract_args(1, T)
    with jax.set_mesh(built.mesh):
        compiled = built.step.lower(state, tokens).compile()
    return memory_report(compiled).temp


def temps(text: str, mesh: str, ts=TEMP_TS, budget_mib: float = BUDGET_MIB) -> Temps:
    got = {T: step_temp(text, mesh, T) for T in ts}
    slope = float(np.polyfit(np.log(list(got)), np.log(list(got.values())), 1)[0])
    fits = [T for T, b in got.items() if b <= budget_mib * MIB]
    longest = max(fits, default=0)
    if longest == max(ts):  # the grid fits: double until it does not
        T = longest * 2
        while T <= MAX_T and step_temp(text, mesh, T) <= budget_mib * MIB:
            longest, T = T, T * 2
    return Temps(text, got, longest, slope)


# --- the tables -------------------------------------------------------------------------------


def format_rows(rows: list[meshes.BenchRow]) -> str:
    head = f"{'strategy':<30} {'mesh':<17} {'op':<19} {'KiB meas/pred':>21}  comm  ms/step  eq"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.report is None:
            lines.append(f"{r.label:<30} {r.case.mesh:<17} ✗ {r.error}")
            continue
        comm = r.comm if r.comm_predicted is not None else {}
        ops = sorted(comm) or ["(GSPMD)"]
        for n, op in enumerate(ops):
            got, want, ok = comm.get(op, (0.0, None, None))
            pred = "-" if want is None else f"{want / KIB:.1f}"
            text = f"{got / KIB:.1f}/{pred}" if op in comm else _gspmd(r)
            first = n == 0
            lines.append(
                f"{r.label if first else '':<30} {r.case.mesh if first else '':<17} "
                f"{op:<19} {text:>21}  {'✓' if ok else '✗' if ok is False else '·':>4}"
                + (f"  {r.step_ms_median:>7.1f}  {'✓' if r.equivalent else '✗'}" if first else "")
            )
    return "\n".join(lines)


def _gspmd(r: meshes.BenchRow) -> str:
    totals = r.report.collective_totals()
    return ", ".join(f"{op} {t.total_bytes / KIB:.0f}" for op, t in sorted(totals.items()))


def format_balance(rows: list[Balance], c: int, T: int) -> str:
    lines = [
        f"causal attention over cp={c}, T={T}: forward attention MFLOP per device "
        f"(min / max / mean), max/mean; expected 1.0 balanced, {2 * c / (c + 1):.2f} = "
        f"2c/(c+1) for the contiguous ring",
        f"  {'layout':<22} {'min':>8} {'max':>8} {'mean':>8} {'max/mean':>9}  how",
    ]
    for b in rows:
        f = np.asarray(b.flops) / 1e6
        lines.append(
            f"  {b.layout:<22} {f.min():>8.1f} {f.max():>8.1f} {f.mean():>8.1f} "
            f"{b.ratio:>9.2f}  {b.how}"
        )
    return "\n".join(lines)


def format_temps(rows: list[Temps], mesh: str) -> str:
    ts = sorted(rows[0].temps)
    cols = " ".join(f"{f'T={t // 1024}k':>8}" for t in ts)
    lines = [
        f"training-step temporaries per device (MiB, memory_analysis), one sequence on {mesh}; "
        f"slope of log(temp) vs log(T); longest T within {BUDGET_MIB} MiB per device",
        f"  {'layout':<24} {cols} {'slope':>6} {'longest':>8}",
    ]
    for r in rows:
        vals = " ".join(f"{r.temps[t] / MIB:>8.1f}" for t in ts)
        lines.append(f"  {r.layout:<24} {vals} {r.slope:>6.2f} {r.longest:>8}")
    return "\n".join(lines)


def plot(path: str, temp_rows: list[Temps], bal: list[Balance]) -> None:
    from jaxscale.render import figure

    # legends below the axes: they never cover a point or a bar
    with figure(path, 1, 2, figsize=(13, 5.2), dpi=110) as (_, (ax_t, ax_b)):
        for r in temp_rows:
            ts = sorted(r.temps)
            label = f"{r.layout} (slope {r.slope:.2f})"
            ax_t.loglog(ts, [r.temps[t] / MIB for t in ts], "o-", base=2, label=label)
        ax_t.axhline(BUDGET_MIB, color="grey", ls=":", label=f"budget {BUDGET_MIB} MiB")
        ax_t.set_xlabel("sequence length T (tokens)")
        ax_t.set_ylabel("temporaries per device (MiB)")
        ax_t.set_title("training-step temporaries vs T")
        ax_t.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
        width = 0.8 / len(bal)
        for n, b in enumerate(bal):
            x = np.arange(len(b.flops)) + (n - (len(bal) - 1) / 2) * width
            label = f"{b.layout}: max/mean {b.ratio:.2f}"
            ax_b.bar(x, np.asarray(b.flops) / 1e6, width, label=label)
        ax_b.set_xticks(np.arange(len(bal[0].flops)))
        ax_b.set_xlabel("device on the context axis")
        ax_b.set_ylabel("attention MFLOP (forward)")
        ax_b.set_title("per-device attention work")
        ax_b.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)


def main(args) -> int:
    """`jaxscale bench context`."""
    from jaxscale.progress import Progress

    c = args.cp
    if jax.device_count() < c:
        print(f"jaxscale bench context: error: --cp {c} needs {c} devices", file=sys.stderr)
        return 2
    mesh = f"cp={c}"
    ts = tuple(args.seq_lens)
    if args.dry_run:
        print("\n".join(f"{r.strategy.label():<30} {r.mesh}" for r in ROWS))
        temp_layouts = [t for t, *_ in LAYOUTS] if args.all_splits else TEMP_LAYOUTS
        print("\n".join(f"{text:<30} {mesh} T={','.join(map(str, ts))}" for text in temp_layouts))
        return 0
    tcfg = verify.TCFG
    temp_layouts = [t for t, *_ in LAYOUTS] if args.all_splits else TEMP_LAYOUTS
    bar = Progress(
        len(ROWS) + len(LAYOUTS) + len(temp_layouts) + 1,
        desc="bench context",
        enabled=not args.json,
        eta=False,
    )
    ref, _ = meshes.reference(CFG, tcfg, args.steps + 1)
    bar.update(1, note="reference")
    rows = []
    for case in ROWS:
        rows.append(meshes.bench_case(case, CFG, tcfg, args.steps, ref))
        bar.update(1, note=f"{rows[-1].label} {case.mesh}")
    bal = []
    for _, form, split in LAYOUTS:
        bal.append(balance(form, split, c, args.balance_t))
        bar.update(1, note=f"balance {form} {split}")
    temp_rows = []
    for text in temp_layouts:
        temp_rows.append(temps(text, mesh, ts, args.budget_mib))
        bar.update(1, note=f"temporaries {text}")
    bar.close()
    record = {
        "rows": [
            {
                "label": r.label,
                "mesh": r.case.mesh,
                "comm": r.comm if r.report else None,
                "comm_ok": r.comm_ok if r.report else None,
                "equivalent": r.equivalent,
                "step_ms": r.step_ms_median,
                "error": r.error,
            }
            for r in rows
        ],
        "balance": [{**asdict(b), "max_over_mean": b.ratio} for b in bal],
        "temporaries": [asdict(t) for t in temp_rows],
        "budget_mib": args.budget_mib,
        "balance_t": args.balance_t,
        "cp": c,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench_context.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    png = None if args.no_plot else (args.plot or str(out / "bench_context.png"))
    if png:
        plot(png, temp_rows, bal)
    if args.json:
        print(json.dumps(record, default=str))
    else:
        print(
            f"context parallelism: d_model {CFG.d_model}, {CFG.n_layers} layers, heads "
            f"{CFG.n_heads}/{CFG.n_kv_heads}, batch {tcfg.global_batch} x seq {tcfg.seq_len}"
        )
        print(format_rows(rows))
        print()
        print(format_balance(bal, c, args.balance_t))
        print()
        print(format_temps(temp_rows, mesh))
        print(f"wrote {path}" + (f" and {png}" if png else ""), file=sys.stderr)
    ok = all(r.report is not None and r.equivalent and r.comm_ok is not False for r in rows)
    return 0 if ok and math.isfinite(sum(b.ratio for b in bal)) else 1
