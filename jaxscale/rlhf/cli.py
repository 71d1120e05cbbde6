"""`jaxscale rlhf --algo ppo|grpo`: SFT -> reward model -> RLHF on the lab's transformer, on a
mesh, co-located or disaggregated (seed 002 ch13-14)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxscale.cliutil import (
    add_command,
    add_dataclass_args,
    build_config,
    guarded,
    non_negative_int,
    positive_int,
    writable_dir,
    writable_path,
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
        example="jaxscale rlhf --algo ppo --mesh fsdp=8 --out runs/rlhf/ppo\n"
        "  jaxscale serve --ckpt-dir runs/rlhf/ppo/policy     # serve the trained policy",
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
        "--out",
        type=writable_dir,
        default=None,
        help="directory for metrics.jsonl, rlhf.png and the trained policy: OUT/policy, a "
        "checkpoint `jaxscale serve --ckpt-dir OUT/policy` serves",
    )
    p.add_argument(
        "--tensorboard",
        type=writable_dir,
        default=None,
        metavar="DIR",
        help="also write each iteration's scores, KL and losses as TensorBoard scalars here "
        "(tensorboardX: pip install -e '.[profile]')",
    )
    p.add_argument(
        "--profile",
        type=writable_dir,
        default=None,
        metavar="DIR",
        help="trace the iterations after the first (every program: generation, scoring, the "
        "updates) into DIR and print their compute / collective / idle split",
    )
    p.add_argument(
        "--profile-steps",
        type=positive_int,
        default=2,
        metavar="N",
        help="iterations the --profile trace holds",
    )
    p.add_argument(
        "--ckpt-every",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="with --out: checkpoint the policy every N iterations too, so --resume can "
        "continue (default 0: only after the last)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --out: continue from OUT/policy's newest checkpoint with the same flags "
        "(--iterations may grow); the metrics are the uninterrupted run's",
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
    p.add_argument(
        "--runs",
        type=writable_dir,
        default="runs/rlhf",
        help="cache of the SFT run and reward model, relative to the working directory (the run "
        "header prints where it is and what it holds)",
    )


def _fmt(r: dict) -> str:
    return (
        f"true {r['true_score']:.3f} rm {r['rm_score']:+.2f} kl {r['kl']:.2f} beta {r['beta']:.3f}"
    )


def _check_paths(args, task) -> None:
    """The files and directories --runs and --out imply, checked as the flags are (before
    anything compiles or is written): a directory where one belongs, files writable."""
    from jaxscale.rlhf import checkpoint as ckpt
    from jaxscale.rlhf import setup

    if args.tensorboard:
        from jaxscale.scalars import check_available

        check_available()
    c = setup.cache(args.runs, task, args.sft_steps, args.rm_steps)
    implied = [("--runs", args.runs, writable_dir, c.sft_dir)]
    implied += [("--runs", args.runs, writable_path, f) for f in c.files()]
    if args.out:
        out = Path(args.out)
        files = (out / "metrics.jsonl", out / "rlhf.png", ckpt.policy_dir(out) / "config.json")
        implied += [("--out", args.out, writable_path, f) for f in files]
        implied += [("--out", args.out, writable_dir, ckpt.ckpt_dir(out))]
    for flag, value, check, path in implied:
        try:
            check(str(path))
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{flag} {value}: {e}") from None


def _resume_point(args, rc):
    """The checkpoint to continue from (None: start at iteration 0), every refusal before
    anything runs: a policy already in --out without --resume, a resume with other flags."""
    import dataclasses

    from jaxscale.rlhf import checkpoint as ckpt

    for flag, given in (("--ckpt-every", args.ckpt_every), ("--resume", args.resume)):
        if given and not args.out:
            raise ValueError(f"{flag} needs --out (the policy's checkpoints go to OUT/policy)")
    done = ckpt.latest(args.out) if args.out else None
    if done is None:
        return None
    where = ckpt.ckpt_dir(args.out)
    if not args.resume:
        raise ValueError(
            f"--out {args.out}: {where} holds a policy checkpoint (iteration {done}); pass "
            "--resume to continue that run, or choose another --out"
        )
    if done >= rc.iterations:
        raise ValueError(
            f"--resume: {where} already holds iteration {done} of --iterations "
            f"{rc.iterations}; raise --iterations to continue"
        )
    saved = ckpt.read_saved(args.out, done)
    now = dataclasses.asdict(rc)
    diff = [k for k in now if k != "iterations" and saved.config.get(k) != now[k]]
    if diff:
        flags = ", ".join(f"--{k.replace('_', '-')} {saved.config.get(k)}" for k in diff)
        raise ValueError(f"--resume: {where} was trained with {flags}; give the same flags")
    return saved


def _main(args) -> int:
    from jaxscale.train.checkpoint import CheckpointError

    return guarded(_run, CheckpointError)(args)  # a checkpoint that cannot be read: one line


def _run(args) -> int:
    from jaxscale.rlhf import run, setup
    from jaxscale.rlhf.config import RLHFConfig
    from jaxscale.rlhf.task import TaskConfig

    # once, absolute: the cache must not move with the working directory unnoticed
    args.runs = str(Path(args.runs).resolve())
    rc = build_config(RLHFConfig, args).check()
    task = TaskConfig()
    _check_paths(args, task)
    saved = _resume_point(args, rc)
    if args.dry_run:
        m = run.placement(rc, args.mesh)
        print(
            f"rlhf {rc.algo}: {rc.iterations} iterations x {rc.rows} responses "
            f"({rc.prompts} prompts), {rc.placement}: train {dict(m.train.shape)}, generate "
            f"{dict(m.gen.shape)}"
        )
        c = setup.cache(args.runs, task, args.sft_steps, args.rm_steps)
        print("\n".join(setup.cache_lines(c, args.sft_steps, args.rm_steps)))
        if saved:
            print(f"resuming at iteration {saved.iteration}")
        return 0
    from jaxscale.stopping import stop_on_signal

    with stop_on_signal(STOP_NOTE, ABORT_NOTE) as stop:
        try:
            result = _train(args, rc, task, saved, stop)
        except Stopped as e:
            _say(f"jaxscale rlhf: {e}")
            return 130
        except RuntimeError:  # SFT's `jaxscale train` child stopped by the same Ctrl-C
            if not stop.is_set():
                raise
            _say("jaxscale rlhf: stopped during SFT (its run directory resumes it next time)")
            return 130
        return _report(args, rc, *result)  # its plot too: a second Ctrl-C there is an abort


STOP_NOTE = (
    "stopping after this iteration (saving the policy with --out); Ctrl-C again to abort "
    "without saving"
)
ABORT_NOTE = "aborted: nothing saved since the last checkpoint"


class Stopped(Exception):
    """Ctrl-C or SIGTERM: the run stopped at a safe point (the message says where)."""


def _say(line: str) -> None:
    # stderr: with --json, stdout holds the one JSON object
    print(line, file=sys.stderr)


def _train(args, rc, task, saved, stop):
    """SFT and the reward model (cached), then the RLHF iterations, checkpointed under --out:
    (result, lab, reward-model accuracy, training prompts). `stop` (set by Ctrl-C): the run
    stops after the cached stages, or after the iteration under way (saved with --out)."""
    from jaxscale.progress import Progress
    from jaxscale.rlhf import run, setup
    from jaxscale.scalars import Scalars

    show = args.progress and not args.json
    cfg, sft, rm, acc, train_p, held_p = setup.prepare(
        args.runs, task, args.sft_steps, args.rm_steps, say=_say, progress=show
    )
    if stop.is_set():
        raise Stopped("stopped after the SFT model and reward model (cached for the next run)")
    lab = run.build(rc, cfg, sft, rm, args.mesh, task)
    where = (
        f"{rc.placement}: train {dict(lab.meshes.train.shape)}, generate "
        f"{dict(lab.meshes.gen.shape)}"
    )
    _say(f"rlhf {rc.algo}: {rc.iterations} iterations x {rc.rows} responses, {where}")
    start = _restore(args, lab, saved)
    out = Path(args.out) if args.out else None
    after, metrics = None, None
    scalars = Scalars(args.tensorboard)
    if out:
        metrics = _open_metrics(args, cfg, rc, saved)
        after = _checkpointer(args, cfg, rc, lab, metrics)

    def log(r):
        if metrics is not None:
            metrics.write(json.dumps(r) + "\n")
        scalars.record("rlhf", r["iteration"], r)

    after = _stopper(args, cfg, rc, lab, stop, after)
    window = None
    if args.profile:
        from jaxscale.profiling import StepWindow

        window = StepWindow(args.profile, args.profile_steps, _say, unit="iteration")
        checked = after

        def after(done: int, beta: float, res) -> None:
            window.step(lab.tree)  # before a stop can leave the loop
            checked(done, beta, res)

    bar = Progress(rc.iterations - (start.iteration if start else 0), f"rlhf {rc.algo}", show)
    try:
        res = run.iterate(
            lab,
            train_p,
            held_p,
            task,
            log=log,
            progress=lambda r: bar.update(1, _fmt(r)),
            start=start,
            after=after,
        )
    finally:
        bar.close()
        scalars.close()
        if metrics:
            metrics.close()
        if window:
            window.finish(lab.tree)
    return res, lab, acc, train_p


def _restore(args, lab, saved):
    """The loop's start from a checkpoint, its state put into `lab`; None for a fresh run."""
    from jaxscale.rlhf import checkpoint as ckpt
    from jaxscale.rlhf import run

    if not saved:
        return None
    _, behind = ckpt.restore(args.out, lab, saved.iteration)
    _say(f"resuming at iteration {saved.iteration} from {ckpt.ckpt_dir(args.out)}")
    return run.Start(saved.iteration, saved.beta, saved.initial_true, saved.history, behind)


def _open_metrics(args, cfg, rc, saved):
    """OUT/metrics.jsonl, begun with a resumed run's saved records (the file is then the
    uninterrupted run's); and OUT/policy/config.json."""
    import dataclasses

    from jaxscale.rlhf import checkpoint as ckpt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = {"mesh": args.mesh, "runs": args.runs, "sft_steps": args.sft_steps}
    ckpt.write_config(out, cfg, {"rlhf": dataclasses.asdict(rc), "run": run})
    metrics = open(out / "metrics.jsonl", "w")  # noqa: SIM115 (the caller closes it)
    for r in saved.history if saved else ():
        metrics.write(json.dumps(r) + "\n")
    return metrics


def _checkpointer(args, cfg, rc, lab, metrics):
    """`iterate`'s `after`: the policy saved every --ckpt-every iterations and after the last."""
    import dataclasses

    from jaxscale.rlhf import checkpoint as ckpt

    def after(done: int, beta: float, res) -> None:
        if done == rc.iterations or (args.ckpt_every and done % args.ckpt_every == 0):
            metrics.flush()  # the records up to a checkpoint are on disk with it
            saved = ckpt.Saved(done, beta, res.initial_true, res.history, dataclasses.asdict(rc))
            ckpt.save(args.out, cfg, lab, saved, args.mesh, behind=res.behind)

    return after


def _stopper(args, cfg, rc, lab, stop, after):
    """`after`, then, once a signal came, the policy saved (with --out) and the loop left."""
    import dataclasses

    from jaxscale.rlhf import checkpoint as ckpt

    def stopping_after(done: int, beta: float, res) -> None:
        if after:
            after(done, beta, res)
        if not stop.is_set() or done == rc.iterations:
            return
        if not args.out:
            raise Stopped(
                f"stopped after iteration {done} of {rc.iterations} (no --out: not saved)"
            )
        if not ckpt.latest(args.out) == done:  # not saved by --ckpt-every just now
            saved = ckpt.Saved(done, beta, res.initial_true, res.history, dataclasses.asdict(rc))
            ckpt.save(args.out, cfg, lab, saved, args.mesh, behind=res.behind)
        raise Stopped(
            f"stopped after iteration {done} of {rc.iterations}, saved in "
            f"{ckpt.ckpt_dir(args.out)}: continue with --resume"
        )

    return stopping_after


def _report(args, rc, res, lab, acc, train_p) -> int:
    import numpy as np

    from jaxscale.rlhf import checkpoint as ckpt
    from jaxscale.rlhf import report

    out = Path(args.out) if args.out else None
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
        summary["policy"] = str(ckpt.policy_dir(out))
    if args.json:
        print(json.dumps(summary))
        return 0
    print(report.summary_text(summary, k))
    for key in ("metrics", "plot"):
        if key in summary:
            print(f"wrote {summary[key]}")
    if "policy" in summary:
        print(
            f"wrote {summary['policy']} (serve it: jaxscale serve --ckpt-dir {summary['policy']})"
        )
    return 0
