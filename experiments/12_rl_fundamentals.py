"""RL fundamentals in pure JAX: seed 002 ch. 12 (ppo_cartpole.py, gae_visualizer.py, Try It 1-3).

    .venv/bin/python experiments/12_rl_fundamentals.py [--seeds 3] [--steps 262144] [--out results]

REINFORCE -> REINFORCE with a baseline -> actor-critic -> PPO on CartPole-v1, each a whole training
run in one jit, learning curves on one plot (results/rl_fundamentals.png); the gradient variance
with and without a baseline (Try It 2); the PPO clipping table (Try It 3); GAE for several lambda
on the seed's trajectory. The seed's PPO never updates its policy (seed defect 10): here PPO solves
CartPole. `--seed-faithful` trains on the seed's SimulatedCartPole instead.
"""

import argparse
import subprocess
import sys
from pathlib import Path

from jaxscale.devices import simulated_process

simulated_process()  # process edge: 8 simulated devices, XLA:CPU sized for them

from jaxscale.cliutil import positive_int  # noqa: E402


def banner(title: str) -> None:
    print(f"\n{'=' * 60}\n {title}\n{'=' * 60}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=positive_int, default=3, help="seeds per algorithm")
    p.add_argument("--steps", type=positive_int, default=262_144, help="env steps per run")
    p.add_argument("--out", default="results", help="directory for the PNG")
    p.add_argument(
        "--seed-faithful", action="store_true", help="train on the seed's SimulatedCartPole"
    )
    args = p.parse_args()
    from jaxscale.rl import run
    from jaxscale.rl.config import ALGOS, RLConfig

    env = "seed-cartpole" if args.seed_faithful else "cartpole"
    banner(f"Try It 1: four algorithms on {env}, {args.seeds} seeds x {args.steps:,} env steps")
    outcomes = {}
    for algo in reversed(ALGOS):  # reinforce first, ppo last: the seed's "RL Hierarchy" (ch12)
        cfg = RLConfig(
            algo=algo, env=env, total_steps=args.steps, num_steps=64 if algo == "ppo" else 256
        )
        out = run.train(cfg, list(range(args.seeds)))
        s = out.summary()
        outcomes[algo] = out
        print(
            f"{algo:<20} final eval return {np_mean(s['final_eval_return']):6.1f}  "
            f"seeds >= {s['threshold']:g}: {s['seeds_solved_at_end']}/{s['seeds']}  "
            f"(compile {s['compile_s']:.1f} s, train {s['train_s']:.1f} s)",
            flush=True,
        )
    png = run.plot_curves(outcomes, Path(args.out) / "rl_fundamentals.png")
    print(f"wrote {png}")
    banner("Try It 2: gradient variance, REINFORCE with and without a baseline")
    _jaxscale("rl", "variance")
    banner("Try It 3: PPO clipping")
    _jaxscale("rl", "clipping")
    banner("GAE on the seed's trajectory (gae_visualizer.py)")
    _jaxscale("calc", "gae")
    return 0


def np_mean(xs) -> float:
    return sum(xs) / len(xs)


def _jaxscale(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "jaxscale", *argv], check=True)


if __name__ == "__main__":
    raise SystemExit(main())
