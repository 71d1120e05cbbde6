"""`jaxscale rlhf --algo ppo|grpo`: SFT -> reward model -> RLHF on the lab's transformer, on a
mesh, co-located or disaggregated (seed 002 ch13-14)."""

from __future__ import annotations

import sys
from pathlib import Path

from jaxscale.cliutil import (
    add_command,
    add_dataclass_args,
    build_config,
    guarded,
    positive_int,
    writable_dir,
)

SUMMARY_KEYS = (
    "true_score",
    "parses_rate",
    "ends_rate",
    "rm_score",
    "kl",
    "beta",
    "clip_frac",
    "value_loss",
    "length",
)


def add_parser(sub) -> None:
    from jaxscale.rlhf.config import RLHFConfig

    p = add_command(
        sub,
        "rlhf",
        help="RLHF on a mesh: actor, critic, reward model, reference; PPO or GRPO",
        description="Pre-train the actor (SFT, cached), train a reward model from comparisons "
        "ranked by a programmatic true score (cached), then run PPO or GRPO with KV-cached "
        "rollouts and a KL penalty to the frozen reference, on a mesh, co-located or "
        "disaggregated; report the true score, the KL, the phase times, the weight transfers "
        "and (--memory) each phase's compiled memory beside the calculator.",
        example="jaxscale rlhf --algo ppo --mesh fsdp=8 --out runs/rlhf/ppo",
    )
    add_dataclass_args(p, RLHFConfig)
    p.add_argument(
        "--mesh",
        default="fsdp=-1",
        help="training mesh (disaggregated: over the training devices), e.g. fsdp=8, "
        "dp=2,tp=4 (default fsdp=-1)",
    )
    add_stage_flags(p)
    p.add_argument(
        "--out", type=writable_dir, default=None, help="directory for metrics.jsonl and rlhf.png"
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="print each phase's compiled memory beside the calculator's",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the flags and meshes, print the plan, train nothing",
    )
    p.set_defaults(func=guarded(_main))


def add_stage_flags(p) -> None:
    """The stages before RLHF (SFT, reward model) and where they are cached: `jaxscale rlhf` and
    experiments 13 and 14 share them."""
    p.add_argument("--sft-steps", type=positive_int, default=600, help="SFT steps (cached)")
    p.add_argument("--rm-steps", type=positive_int, default=200, help="reward-model steps")
    p.add_argument("--runs", default="runs/rlhf", help="cache of the SFT run and reward model")


def _fmt(r: dict) -> str:
    return (
        f"true {r['true_score']:.3f} rm {r['rm_score']:+.2f} kl {r['kl']:.2f} beta {r['beta']:.3f}"
    )


def _main(args) -> int:
    import json

    import numpy as np

    from jaxscale.progress import Progress
    from jaxscale.render import grid
    from jaxscale.rlhf import report, run, setup
    from jaxscale.rlhf.config import RLHFConfig
    from jaxscale.rlhf.task import TaskConfig

    rc = build_config(RLHFConfig, args).check()
    task = TaskConfig()
    if args.dry_run:
        m = run.placement(rc, args.mesh)
        print(
            f"rlhf {rc.algo}: {rc.iterations} iterations x {rc.rows} responses "
            f"({rc.prompts} prompts), {rc.placement}: train {dict(m.train.shape)}, generate "
            f"{dict(m.gen.shape)}; SFT {args.sft_steps} steps and reward model "
            f"{args.rm_steps} steps cached in {args.runs}"
        )
        return 0
    say = (lambda line: print(line, file=sys.stderr)) if not args.json else (lambda line: None)
    cfg, sft, rm, acc, train_p, held_p = setup.prepare(
        args.runs, task, args.sft_steps, args.rm_steps, say=say
    )
    lab = run.build(rc, cfg, sft, rm, args.mesh, task)
    where = (
        f"{rc.placement}: train {dict(lab.meshes.train.shape)}, generate "
        f"{dict(lab.meshes.gen.shape)}"
    )
    say(f"rlhf {rc.algo}: {rc.iterations} iterations x {rc.rows} responses, {where}")
    out = Path(args.out) if args.out else None
    log = None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        metrics = open(out / "metrics.jsonl", "w")  # noqa: SIM115 (closed below)
        log = lambda r: metrics.write(json.dumps(r) + "\n")  # noqa: E731
    bar = Progress(rc.iterations, desc=f"rlhf {rc.algo}", enabled=args.progress and not args.json)
    try:
        res = run.iterate(
            lab, train_p, held_p, task, log=log, progress=lambda r: bar.update(1, _fmt(r))
        )
    finally:
        bar.close()
        if out:
            metrics.close()
    h = res.history
    k = min(5, len(h))
    summary = {
        "algo": rc.algo,
        "placement": rc.placement,
        "mesh": args.mesh,
        "reward_model": acc,
        "held_out_true_score": {"initial": res.initial_true, "final": res.final_true},
        "first_iterations": {
            key: float(np.mean([r[key] for r in h[:k] if key in r]))
            for key in SUMMARY_KEYS
            if key in h[0]
        },
        "last_iterations": {
            key: float(np.mean([r[key] for r in h[-k:] if key in r]))
            for key in SUMMARY_KEYS
            if key in h[0]
        },
        "time_per_iteration_s": report.time_breakdown(h),
        "transfers": report.transfer_rows(res.transfers),
    }
    if args.memory:
        summary["memory"] = report.phase_memory(lab, train_p)
    if out:
        summary["metrics"] = str(out / "metrics.jsonl")
        summary["plot"] = report.plot({rc.algo: h}, out / "rlhf.png", rc.kl_target)
    if args.json:
        print(json.dumps(summary))
        return 0
    f, last = summary["first_iterations"], summary["last_iterations"]
    print(
        grid(
            ["", f"first {k} iterations", f"last {k} iterations"],
            [[key, f"{f[key]:.4f}", f"{last[key]:.4f}"] for key in f],
        )
    )
    ho = summary["held_out_true_score"]
    print(f"held-out true score (fixed seeds): {ho['initial']:.4f} -> {ho['final']:.4f}")
    t = summary["time_per_iteration_s"]
    print(
        "time per iteration: " + ", ".join(f"{key[2:-2]} {v * 1e3:.1f} ms" for key, v in t.items())
    )
    print(
        grid(
            [
                "transfer",
                "bytes moved",
                "predicted",
                "ms (here)",
                "zero copy",
                "calc NVLink ms",
                "calc IB ms",
            ],
            [
                [
                    r["transfer"],
                    f"{r['bytes_moved']:,}",
                    f"{r['bytes_predicted']:,}",
                    f"{r['seconds'] * 1e3:.2f}",
                    r["zero_copy"],
                    f"{r['calc_nccl_nvlink_s'] * 1e3:.2f}",
                    f"{r['calc_nccl_ib_s'] * 1e3:.2f}",
                ]
                for r in summary["transfers"]
            ],
        )
    )
    if args.memory:
        print("memory per device (MB): compiled (memory_analysis) vs calc rl memory's rows")
        print(
            grid(
                ["phase", "holds", "arguments", "calc fixed", "temp", "calc scaling"],
                [
                    [
                        r["phase"],
                        r["holds"],
                        f"{r['arguments'] / 1e6:.3f}",
                        f"{r['calc_fixed'] / 1e6:.3f}",
                        f"{r['temp'] / 1e6:.3f}",
                        f"{r['calc_scaling'] / 1e6:.3f}",
                    ]
                    for r in summary["memory"]
                ],
            )
        )
    for key in ("metrics", "plot"):
        if key in summary:
            print(f"wrote {summary[key]}")
    return 0
