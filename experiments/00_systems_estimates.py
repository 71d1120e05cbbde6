"""Seed 001 "Model Training and Distributed Systems", end to end: every section's tables and plots.

    .venv/bin/python experiments/00_systems_estimates.py [--seed-faithful] [--out results]

Sections (§) of seed 001 and the jaxscale command that reproduces each:
  §2 Chinchilla tokens           calc chinchilla     §3 MoE parameters         calc moe
  §4 GPUs and training time      calc time           §5 transformer FLOPs      calc flops
  §6 memory per strategy         calc memory         §7 communication          calc comm
  §8 parallelism rule            advisor_rules.seed001_recommend
  §9 inference latency, serving GPUs                 calc inference, calc serving
  §10 RL sync vs async           calc rl throughput
--seed-faithful passes the flag to the commands that have one (their output says which numbers
are the seed's defects; see docs/seed-notes.md). Plots go to results/00_systems_*.png.
"""

import argparse
import os

from jaxscale.calc.advisor_rules import seed001_recommend
from jaxscale.cli import main as jaxscale_main
from jaxscale.render import grid

# (section title, command line, takes --seed-faithful, plot file name or None)
SECTIONS = (
    ("2. Chinchilla-optimal training tokens", ["calc", "chinchilla"], False, "chinchilla"),
    ("3. Mixture-of-experts parameters", ["calc", "moe"], False, None),
    ("4. GPU requirements and training time", ["calc", "time"], False, "training_time"),
    ("5. FLOPs of a transformer block, 6N check", ["calc", "flops"], True, None),
    (
        "6. Memory per GPU for LLaMA-2-70B layouts",
        ["calc", "memory", "--scenario", "seed001"],
        True,
        None,
    ),
    ("7. Communication: TP and ZeRO/FSDP", ["calc", "comm"], True, None),
)
LATER_SECTIONS = (
    ("9. Inference latency and throughput", ["calc", "inference"], True, None),
    ("9. GPUs to serve a load", ["calc", "serving"], True, None),
    ("10. RL training: sync vs async", ["calc", "rl", "throughput"], True, "rl_throughput"),
)
# Seed 001's recommend_parallelism examples (§8): (name, parameters, GPUs).
RULE_CASES = (
    ("LLaMA-2-7B", 7e9, 64),
    ("LLaMA-2-13B", 13e9, 128),
    ("LLaMA-2-70B", 70e9, 512),
    ("GPT-3-175B", 175e9, 1024),
    ("GPT-4-1.7T (MoE)", 1700e9, 2048),
)


def banner(title: str) -> None:
    print(f"\n{'#' * 100}\n# {title}\n{'#' * 100}")


def run_section(title: str, argv: list[str], faithful: bool, plot: str | None, args) -> None:
    banner(title)
    argv = list(argv)
    if faithful and args.seed_faithful:
        argv.append("--seed-faithful")
    if plot:
        argv += ["--plot", os.path.join(args.out, f"00_systems_{plot}.png")]
    if jaxscale_main(argv) != 0:
        raise SystemExit(f"jaxscale {' '.join(argv)} failed")


def parallelism_rule() -> None:
    banner("8. Practical parallelism configuration (seed 001 recommend_parallelism)")
    rows = []
    for name, n_params, gpus in RULE_CASES:
        a = seed001_recommend(n_params, gpus)
        layout = a.error or f"TP={a.tp}, PP={a.pp}, DP={a.dp}"
        rows.append([name, gpus, layout, f"ZeRO-{a.zero_stage}", a.reason or "; ".join(a.notes)])
    print(grid(["Model", "GPUs", "Layout", "ZeRO", "Rationale"], rows))
    print("(`jaxscale advise` compares this rule with jaxscale's memory and communication model)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed-faithful", action="store_true", help="the seed's own numbers")
    parser.add_argument("--out", default="results", help="directory for the plots")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for section in SECTIONS:
        run_section(*section, args)
    parallelism_rule()
    for section in LATER_SECTIONS:
        run_section(*section, args)


if __name__ == "__main__":
    main()
