"""Seed 000 "Training & Serving at Scale": its four exercises, tables and plots (results/00_*.png).

    .venv/bin/python experiments/00_training_and_serving_at_scale.py [--trials 200] [--requests 50]

1. training memory per GPU, ZeRO 0-3 (jaxscale.calc.memory; its Exercise 1);
2. speculative decoding, draft length and match probability (jaxscale.sim.speculative; Exercise 2);
3. static vs continuous batching (jaxscale.sim.batching; Exercise 3);
4. the parallelism advisor, configurations (a)-(e) (jaxscale.calc.advisor; Exercise 4).
Where a seed's text contradicts its own code, both values are printed.
"""

import argparse
import math
from pathlib import Path

from jaxscale.calc.advisor import advise
from jaxscale.calc.advisor_model import Hardware, Workload
from jaxscale.calc.advisor_rules import seed000_decision_tree
from jaxscale.calc.memory import training_memory_per_device
from jaxscale.cliutil import positive_int, writable_dir
from jaxscale.render import figure, grid
from jaxscale.sim import batching, speculative

GB = 1e9
A100_GB = 80
MODELS = {"GPT-2 (124M)": 124e6, "LLaMA 7B": 7e9, "LLaMA 70B": 70e9}  # Exercise 1's models
CONFIGS = [
    ("(a) GPT-2, 1 GPU", 124e6, 1),
    ("(b) GPT-2, 4 GPUs", 124e6, 4),  # Exercise 4's configs
    ("(c) LLaMA 7B, 4 GPUs", 7e9, 4),
    ("(d) LLaMA 70B, 8 GPUs", 70e9, 8),
    ("(e) 175B Model, 64 GPUs", 175e9, 64),
]


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def exercise1(gpus: int, out: Path) -> None:
    print(f"=== Exercise 1: training memory (12 B/param), per GPU on {gpus} GPUs ===")
    header = ["stage", "weights", "grads", "optimizer", "total/GPU", "fits A100"]
    for name, n in MODELS.items():
        mems = [training_memory_per_device(n, dp=gpus, zero_stage=z) for z in range(4)]
        rows = [
            [
                f"ZeRO-{z}",
                *map(_gb, (m.weights, m.gradients, m.optimizer, m.total)),
                ("NO", "YES")[m.total <= A100_GB * GB],
            ]
            for z, m in enumerate(mems)
        ]
        print(f"--- {name}: {_gb(12 * n)} on one GPU\n" + grid(header, rows))
    zero1 = lambda n, g: _gb(training_memory_per_device(n, dp=g, zero_stage=1).total)  # noqa: E731
    z1 = [[name] + [zero1(n, g) for g in (1, 2, 4, 8)] for name, n in MODELS.items()]
    print("ZeRO-1 on 1/2/4/8 GPUs (seed 003, Exercise 1):")
    print(grid(["model", "1", "2", "4", "8"], z1))
    print(f"70B ZeRO-1 on 8: {zero1(70e9, 8)} per GPU (seed 000 Exercise 1's text says ~210 GB)\n")
    with figure(out / "00_ex1_zero_70b.png", figsize=(9, 5)) as (_, ax):
        bottom = [0.0] * 4
        for key in ("weights", "gradients", "optimizer"):  # `mems` is the 70B model's, the last
            vals = [getattr(m, key) / GB for m in mems]
            ax.bar([f"ZeRO-{z}" for z in range(4)], vals, bottom=bottom, label=key)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.axhline(A100_GB, color="red", linestyle="--", label=f"A100 ({A100_GB} GB)")
        ax.set(ylabel="GB per GPU", title=f"LLaMA 70B training memory per GPU on {gpus} GPUs")
        ax.legend()


def exercise2(trials: int, out: Path) -> None:
    cfg = speculative.SweepConfig(num_trials=trials)
    points = speculative.k_sweep(cfg)
    print(f"=== Exercise 2: speculative decoding, {cfg.total_tokens} tokens x {trials} trials")
    expect = lambda k: speculative.expected_tokens_per_pass(cfg.match_prob, k)  # noqa: E731
    rows = [
        [
            str(p.k),
            f"{p.avg_accepted_per_round:.2f}",
            f"{p.avg_tokens_per_round:.2f}",
            f"{expect(p.k):.2f}",
            f"{p.avg_rounds:.1f}",
            f"{p.avg_time_ms:.0f}",
            f"{p.baseline_time_ms:.0f}",
            f"{p.speedup:.2f}x",
        ]
        for p in points
    ]
    header = ["K", "acc/round", "tok/round", "E[tok]", "rounds", "time ms", "baseline", "speedup"]
    print(grid(header, rows, label_column=False))
    top = speculative.best(points)
    print(f"Optimal K={top.k} ({top.speedup:.2f}x); P(all 8 match) = {cfg.match_prob**8:.3f}")
    k = 5  # Exercise 2: a perfect draft gives (K+1)T/(Kd+T); the seed prints K*T/(Kd+T)
    perfect = [speculative.perfect_draft_speedup(k, 10, 50, seed_faithful=f) for f in (False, True)]
    print(f"Perfect draft, K={k}: {perfect[0]:.2f}x (seed, no +1 token: {perfect[1]:.2f}x)")
    sweep = speculative.match_prob_sweep(cfg)
    print(
        grid(
            ["match_prob", "best K", "speedup"],
            [
                [f"{mp}", str(speculative.best(p).k), f"{speculative.best(p).speedup:.2f}x"]
                for mp, p in sweep.items()
            ],
        )
        + "\n"
    )
    with figure(out / "00_ex2_speculative.png", 1, 2, figsize=(13, 5)) as (_, (ax1, ax2)):
        ks = speculative.DRAFT_LENGTHS  # what k_sweep and match_prob_sweep run
        ax1.plot(ks, [p.speedup for p in points], marker="o")
        ax1.set(xlabel="draft length K", ylabel="speedup", title=f"match_prob={cfg.match_prob}")
        for mp, pts in sweep.items():
            ax2.plot(ks, [p.speedup for p in pts], marker="o", label=f"match_prob={mp}")
        ax2.set(xlabel="draft length K", ylabel="speedup", title="match probability vs optimal K")
        ax2.legend()


def exercise3(requests: int, batch_size: int, out: Path) -> None:
    lengths = batching.Workload(num_requests=requests).lengths()
    static = batching.simulate_static(lengths, batch_size)
    cont = batching.simulate_continuous(lengths, batch_size)
    print(f"=== Exercise 3: {requests} requests, batch {batch_size}, first {lengths[:10].tolist()}")
    rows = [
        [
            name,
            str(r.total_steps),
            f"{r.avg_utilization:.1%}",
            f"{r.avg_service_latency:.0f}",
            f"{r.avg_completion:.0f}",
            f"{r.wasted_slot_steps} ({r.waste_fraction:.1%})",
        ]
        for name, r in (("static", static), ("continuous", cont))
    ]
    header = ["strategy", "steps", "utilization", "latency", "completion", "wasted"]
    print(grid(header, rows))
    print(f"Throughput: {static.total_steps / cont.total_steps:.2f}x fewer steps with continuous")
    s3 = batching.simulate_static(list(batching.SEED_003_LENGTHS), 8)
    claim = batching.seed_003_claimed_waste()
    print(f"Seed 003 batch: {s3.waste_fraction:.2%} wasted (it claims {claim:.1%})\n")
    with figure(out / "00_ex3_batching.png", 2, 1, figsize=(13, 7)) as (_, axes):
        for ax, (name, r) in zip(axes, (("static", static), ("continuous", cont)), strict=True):
            ax.fill_between(range(len(r.utilization)), r.utilization, alpha=0.4)
            ax.axhline(r.avg_utilization, linestyle="--", label=f"average {r.avg_utilization:.1%}")
            ax.set(ylim=(0, 1.1), ylabel="utilization", title=f"{name} batching")
            ax.legend()
        axes[1].set_xlabel("step")


def exercise4() -> None:
    print("=== Exercise 4: parallelism advisor on 80 GB GPUs, seed 000's tree vs jaxscale")
    rows = []
    for name, n, gpus in CONFIGS:
        seed = seed000_decision_tree(n, gpus, A100_GB)
        own = advise(Workload(n), Hardware(gpus, A100_GB * GB)).best
        own_cells = [own.layout.label(), _gb(own.memory.total)] if own else ["nothing fits", "-"]
        seed_mem = _gb(seed.per_gpu_bytes) if seed.per_gpu_bytes else "-"
        rows.append([name, seed.strategy, seed_mem, *own_cells])
    print(grid(["config", "seed 000 tree", "per GPU", "jaxscale", "per GPU"], rows))
    print(f"175B, ZeRO-3 alone: {math.ceil(175e9 * 12 / (A100_GB * GB))} GPUs (no activations)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=positive_int, default=8, help="GPUs for exercise 1 (8)")
    p.add_argument(
        "--trials", type=positive_int, default=200, help="speculative trials per point (200)"
    )
    p.add_argument("--requests", type=positive_int, default=50, help="batching requests (50)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="batching slots (8)")
    p.add_argument(
        "--out", type=writable_dir, default="results", help="folder for the plots (results)"
    )
    args = p.parse_args()
    exercise1(args.gpus, Path(args.out))
    exercise2(args.trials, Path(args.out))
    exercise3(args.requests, args.batch_size, Path(args.out))
    exercise4()
    print(f"\nplots: {args.out}/00_ex1_zero_70b.png, 00_ex2_speculative.png, 00_ex3_batching.png")


if __name__ == "__main__":
    main()
