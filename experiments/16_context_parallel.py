"""Context parallelism (seed 001, strategy 6) on the compiled model.

    .venv/bin/python experiments/16_context_parallel.py
    .venv/bin/python experiments/16_context_parallel.py --seq-len 1024 --budget-mib 64

Seed 001 says of context parallelism: "Split sequence length across devices", "Each GPU
processes part of the sequence", "Communication: AllGather for attention (Ring Attention)",
"Use case: Very long sequences (>100k tokens)". Each claim, on the compiled training step of the
verify model (jaxscale/parallel/cp/; docs/context.md):

1. Each device processes part of the sequence: per-device FLOPs (cost_analysis) and
   temporaries (memory_analysis) of one step at a fixed T on cp = 1, 2, 4, 8 devices, in the
   seed's all-gather form (cost_analysis counts a loop's body once, and the ring's hops are a
   loop).
2. The communication: the collectives each form's compiled step runs (the HLO census). The ring
   is point-to-point (collective-permute), not an all-gather: the seed's parenthesis names the
   other form (docs/seed-notes.md).
3. The use case: the longest sequence whose step fits a per-device memory budget, as cp grows
   (ring attention, zigzag split). Plot: results/16_context_parallel.png.
"""

import argparse
import os

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

from jaxscale.cliutil import positive_int, writable_dir  # noqa: E402
from jaxscale.render import Col, table  # noqa: E402

MIB = 2**20
CPS = (1, 2, 4, 8)
FORMS = ("manual:cp_ring", "manual:cp_gather", "manual:cp_ulysses")


def _compile(text: str, c: int, seq_len: int):
    """(compiled step, its report) of `text` on c context devices (c = 1: one device, no CP)."""
    import jax

    from jaxscale import verify
    from jaxscale.analysis.compiled import compile_with_report
    from jaxscale.parallel.compose import Strategy, build

    strategy = Strategy.parse("auto", "dp=1") if c == 1 else Strategy.parse(text, f"cp={c}")
    tcfg = verify.TCFG.replace(seq_len=seq_len, global_batch=1)
    cfg = verify.CFG.replace(unroll_layers=True)  # cost_analysis counts every layer
    built = build(strategy, cfg, tcfg, devices=jax.devices()[:c])
    with jax.set_mesh(built.mesh):
        return compile_with_report(built.step, *built.abstract_args(1, seq_len))


def part1(seq_len: int) -> list[dict]:
    rows = []
    for c in CPS:
        _, report = _compile("manual:cp_gather", c, seq_len)
        rows.append({"cp": c, "gflop": report.flops / 1e9, "temp": report.memory.temp / MIB})
    one = rows[0]
    for r in rows:
        r["flop_share"], r["temp_share"] = r["gflop"] / one["gflop"], r["temp"] / one["temp"]
    print(f"1. one training step at T = {seq_len}, all-gather CP, per device")
    cols = [
        Col("cp", "cp"),
        Col("gflop", "GFLOP/device", ".3f"),
        Col("flop_share", "x of cp=1", ".3f"),
        Col("temp", "temp MiB", ".1f"),
        Col("temp_share", "x of cp=1", ".3f"),
    ]
    print(table(cols, rows))
    return rows


def part2(seq_len: int) -> list[dict]:
    rows = []
    for text in FORMS:
        _, report = _compile(text, 8, seq_len)
        totals = report.collective_totals()
        ops = {op: t for op, t in totals.items() if op != "all-reduce"}
        rows.append(
            {
                "form": text.removeprefix("manual:"),
                "ops": ", ".join(f"{op} x{t.count}" for op, t in sorted(ops.items())),
                "kib": sum(t.total_bytes for t in ops.values()) / 1024,
            }
        )
    print(f"\n2. the attention's collectives on cp=8, T = {seq_len} (besides the all-reduce of")
    print("   the loss and gradients), from the compiled step's HLO census")
    print(table([Col("form", "form"), Col("ops", "collectives"), Col("kib", "KiB", ".0f")], rows))
    ring = rows[0]["ops"]
    print(
        "the ring runs "
        + ("no all-gather: " if "all-gather" not in ring else "an all-gather (?): ")
        + "its K/V blocks move point to point; the all-gather is cp_gather's"
    )
    return rows


def part3(budget_mib: int, start: int) -> list[dict]:
    from jaxscale.bench import context

    rows = []
    for c in CPS:
        longest, T = 0, start
        while T <= context.MAX_T:
            _, report = _compile("manual:cp_ring", c, T)
            if report.memory.temp > budget_mib * MIB:
                break
            longest, T = T, T * 2
        rows.append({"cp": c, "longest": longest})
        print(f"   cp={c}: longest T within {budget_mib} MiB: {longest}", flush=True)
    print(f"\n3. the longest sequence (a power of two from {start}) whose step fits {budget_mib}")
    print("   MiB of temporaries per device, ring attention")
    print(table([Col("cp", "cp"), Col("longest", "longest T")], rows))
    return rows


def plot(path: str, p1: list[dict], p3: list[dict]) -> None:
    from jaxscale.render import figure

    with figure(path, 1, 2, figsize=(12, 4.4), dpi=110) as (_, (ax1, ax3)):
        cps = [r["cp"] for r in p1]
        ax1.plot(cps, [r["flop_share"] for r in p1], "o-", label="GFLOP/device")
        ax1.plot(cps, [r["temp_share"] for r in p1], "s-", label="temporaries/device")
        ax1.plot(cps, [1 / c for c in cps], ":", color="grey", label="1/cp")
        ax1.set_xscale("log", base=2)
        ax1.set_yscale("log", base=2)
        ax1.set_xlabel("context devices cp")
        ax1.set_ylabel("x of one device")
        ax1.set_title("each device processes part of the sequence")
        ax1.legend(fontsize=8)
        ax3.plot([r["cp"] for r in p3], [r["longest"] for r in p3], "o-")
        ax3.set_xscale("log", base=2)
        ax3.set_yscale("log", base=2)
        ax3.set_xlabel("context devices cp")
        ax3.set_ylabel("longest T within the budget")
        ax3.set_title("the sequence a memory budget admits")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=positive_int, default=2048, help="T of parts 1 and 2")
    p.add_argument(
        "--budget-mib", type=positive_int, default=128, help="per-device budget of part 3 (MiB)"
    )
    p.add_argument("--start", type=positive_int, default=512, help="part 3's first T")
    p.add_argument("--out", type=writable_dir, default="results", help="plot directory")
    args = p.parse_args()
    import jax

    jax.config.update("jax_disable_most_optimizations", True)  # figures only: compile fast
    p1 = part1(args.seq_len)
    part2(args.seq_len)
    p3 = part3(args.budget_mib, args.start)
    path = os.path.join(args.out, "16_context_parallel.png")
    plot(path, p1, p3)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
