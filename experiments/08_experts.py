"""Mixture of experts and expert parallelism (seed 002 ch. 7, seed 003).

    .venv/bin/python experiments/08_experts.py            # all four parts
    .venv/bin/python experiments/08_experts.py --skip-training

1. The seed's exercise 2 computed: 64 experts, top-2, h = 4096, 4 x 1024 tokens in bf16:
   TP's 2S = 64 MiB (56 MiB on a ring) against EP's 2kS/N = 2 MiB (N = 64 experts) or 16 MiB
   (N = 8 EP ranks); the seed leaves N ambiguous.
2. The same comparison on the compiled small model (jaxscale/bench/experts.py): the bytes one
   MoE layer adds to the forward program on tp=8 and on ep=8 with 16 experts. The measurement
   settles the ambiguity: N is the number of EP ranks.
3. Total against active parameters: the seed's DeepSeek-V3 and Mixtral figures from `calc moe`,
   and jaxscale's own MoE config counted exactly against jax.eval_shape.
4. Load balance while training under ep=4,dp=2: Switch's balance loss keeps the experts' max/mean
   load under a band; without it the load skews and more tokens drop. Plot:
   results/08_expert_load.png.
"""

import argparse
import math
import os

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

from jaxscale.calc import comm  # noqa: E402
from jaxscale.calc import scaling_laws as sl  # noqa: E402
from jaxscale.cliutil import positive_int, writable_dir  # noqa: E402
from jaxscale.render import Col, table  # noqa: E402

MIB = 2**20


def part1() -> list[dict]:
    tokens, hidden, k = 4 * 1024, 4096, 2
    rows = []
    for n, reading in ((64, "N = 64 experts"), (8, "N = 8 EP ranks")):
        v = comm.moe_layer_volumes(tokens, hidden, k, n)
        rows.append(
            {
                "reading": reading,
                "S": v["S"] / MIB,
                "tp": v["tp_2S"] / MIB,
                "ring": v["tp_2S_ring"] / MIB,
                "ep": v["ep_2kS_over_n"] / MIB,
            }
        )
    print("1. seed ex. 2: 64 experts, top-2, h=4096, 4x1024 tokens, bf16 (MiB)")
    cols = [
        Col("reading", "EP's N"),
        Col("S", "S", ".0f"),
        Col("tp", "TP 2S", ".0f"),
        Col("ring", "TP 2S ring", ".0f"),
        Col("ep", "EP 2kS/N", ".0f"),
    ]
    print(table(cols, rows))
    return rows


def part2() -> None:
    from jaxscale import verify
    from jaxscale.bench import experts

    tcfg = verify.TCFG
    print(
        "\n2. "
        + experts.format_seed(
            experts.seed_table(tcfg.global_batch, tcfg.seq_len), tcfg.global_batch, tcfg.seq_len
        )
    )


def part3() -> None:
    import jax

    from jaxscale.lessons.experts import MOE
    from jaxscale.model import counts
    from jaxscale.model import state as ms

    rows = [
        {
            "model": name,
            "total": m.total_params / 1e9,
            "active": m.active_params / 1e9,
            "ratio": m.total_params / m.active_params,
        }
        for name, m in sl.MOE_MODELS.items()
    ]
    print("\n3. total vs active parameters (calc moe; billions)")
    cols = [
        Col("model", "model"),
        Col("total", "total", ".1f"),
        Col("active", "active", ".1f"),
        Col("ratio", "total/active", ".2f"),
    ]
    print(table(cols, rows))
    shared, expert = counts.moe_split(MOE)
    calc = sl.MoEConfig(shared, MOE.n_experts, expert, MOE.top_k)
    measured = sum(math.prod(x.shape) for x in jax.tree.leaves(ms.abstract_params(MOE)))
    print(
        f"jaxscale MoE (E={MOE.n_experts}, top-{MOE.top_k}, d_model {MOE.d_model}): calc moe "
        f"total {calc.total_params:,.0f}, active {calc.active_params:,.0f}; eval_shape total "
        f"{measured:,} ({'equal' if measured == calc.total_params else 'DIFFERENT'})"
    )


def part4(steps: int, out: str) -> None:
    from jaxscale.lessons import experts

    runs = experts.load_balance(steps, progress=True)
    print(
        f"\n4. load balance over {steps} steps (ep=4,dp=2, markov data), last {experts.LATE} steps:"
    )
    rows = [
        {
            "w": w,
            "mean": experts.late(r).mean(),
            "max": experts.late(r).max(),
            "drop": experts.late(r, "drop").mean(),
            "ce": r["ce"][-1],
        }
        for w, r in runs.items()
    ]
    print(
        table(
            [
                Col("w", "aux weight", "g"),
                Col("mean", "max/mean load (mean)", ".2f"),
                Col("max", "max/mean load (worst)", ".2f"),
                Col("drop", "drop fraction", ".3f"),
                Col("ce", "final ce", ".3f"),
            ],
            rows,
        )
    )
    path = os.path.join(out, "08_expert_load.png")
    experts.plot(runs, path)
    print(f"band: max/mean <= {experts.BAND:g} with the balance loss; wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=150, help="training steps per run")
    p.add_argument("--skip-training", action="store_true", help="parts 1-3 only")
    p.add_argument("--out", type=writable_dir, default="results", help="plot directory")
    args = p.parse_args()
    part1()
    part2()
    part3()
    if not args.skip_training:
        part4(args.steps, args.out)


if __name__ == "__main__":
    main()
