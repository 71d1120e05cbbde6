"""`jaxscale train`: train the transformer on a mesh, by any strategy the composer builds.

Configuration, lowest precedence first: the `--model` preset and the dataclass defaults, a
`--config FILE` (the `config.json` every run directory holds), then the flags given. Everything
that can be checked is checked before anything compiles (`--dry-run` stops there and prints
the resolved configuration).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from pathlib import Path

from jaxscale.cliutil import (
    add_dataclass_args,
    build_config,
    check_implied,
    check_section,
    dataclass_kinds,
    guarded,
    non_negative_int,
    positive_int,
    writable_dir,
    writable_path,
)
from jaxscale.config import MODEL_PRESETS, ModelConfig, TrainConfig

RUN_KINDS = {  # a config file's run section, as the flags take it
    "mesh": "str",
    "strategy": "str",
    "schedule": "str?",
    "microbatches": "int?",
    "virtual_stages": "int?",
    "grad_buckets": "int?",
    "data": "str",
    "prompt": "str",
    "sample_tokens": "int",
}
RUN_FIELDS = tuple(RUN_KINDS)
RUN_MINIMA = {"microbatches": 1, "virtual_stages": 1, "grad_buckets": 1, "sample_tokens": 0}
EXAMPLES = """examples:
  jaxscale train --mesh dp=2,fsdp=2,tp=2 --steps 300 --out runs/a
  jaxscale train --strategy manual:zero3+tp --mesh fsdp=4,tp=2 --steps 20
  jaxscale train --mesh pp=2,dp=2,tp=2 --strategy manual:dp+tp --schedule 1f1b --microbatches 8
  jaxscale train --mesh ep=4,dp=2 --strategy manual:dp+ep --experts 8 --top-k 2   # MoE
  jaxscale train --out runs/a --resume --steps 600     # continue, on any mesh and strategy
  jaxscale train --config runs/a/config.json --dry-run     # check and print, compile nothing"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train on a mesh: progress bar, JSON-lines metrics, eval loss, sample, checkpoints",
        description=textwrap.fill(
            "Train the transformer by any strategy on any mesh. "
            + " ".join(__doc__.split("\n\n")[1].split())
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mesh", default=None, help="mesh spec, e.g. dp=2,fsdp=2,tp=2 (default dp=-1)")
    p.add_argument(
        "--strategy",
        default=None,
        help="'auto' (jit + the rules table; default) or 'manual:' + dp/zero1/"
        "zero2/zero3 and/or tp/tp_sp/tp_gather joined by '+', e.g. "
        "manual:zero3+tp",
    )
    p.add_argument(
        "--schedule",
        default=None,
        choices=("gpipe", "1f1b", "interleaved", "zb-h1"),
        help="pipeline schedule over the mesh's pp axis (joins a manual --strategy; "
        "with 'auto' the strategy becomes manual:dp), e.g. 1f1b",
    )
    p.add_argument(
        "--microbatches",
        type=positive_int,
        default=None,
        help="pipeline microbatches per data shard, the gradient accumulation of a "
        "pipeline (default: the pipe size P), e.g. 8",
    )
    p.add_argument(
        "--virtual-stages",
        type=positive_int,
        default=None,
        help="model chunks per pipeline device, for --schedule interleaved (default 2)",
    )
    p.add_argument(
        "--model",
        default=None,
        choices=sorted(MODEL_PRESETS),
        help="model preset the model flags modify (default tiny)",
    )
    p.add_argument(
        "--data",
        default=None,
        help="'stdlib' (Python's own sources; default), 'markov' (synthetic, known "
        "optimal loss), 'copy' (needs attention: each window's second half repeats "
        "its first) or a path to a text file",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a config.json (as a run directory holds) to start from",
    )
    p.add_argument(
        "--out",
        "--run-dir",  # the older spelling; `--out` is every command's output directory
        dest="run_dir",
        type=writable_dir,
        default=None,
        metavar="DIR",
        help="one directory for the run: config.json, metrics.jsonl, checkpoints/, loss.png",
    )
    p.add_argument(
        "--ckpt-dir",
        type=writable_dir,
        default=None,
        metavar="DIR",
        help="write checkpoints here (default with --out: RUN_DIR/checkpoints)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint (any mesh, any strategy)",
    )
    p.add_argument(
        "--metrics",
        type=writable_path,
        default=None,
        metavar="FILE",
        help="append JSON-lines metrics here (default with --out: RUN_DIR/metrics.jsonl)",
    )
    p.add_argument(
        "--prompt", default=None, help="prompt of the greedy sample at the end (default 'def ')"
    )
    p.add_argument(
        "--sample-tokens",
        type=non_negative_int,
        default=None,
        help="tokens to sample at the end; 0: no sample (default 48)",
    )
    p.add_argument(
        "--grad-buckets",
        type=positive_int,
        default=None,
        metavar="N",
        help="manual:dp (and +tp): all-reduce the layers' gradients in N buckets inside the "
        "backward, each as soon as its layers' gradients exist (default: one all-reduce after "
        "the backward)",
    )
    p.add_argument(
        "--tensorboard",
        type=writable_dir,
        default=None,
        metavar="DIR",
        help="also write the metrics as TensorBoard scalars here (tensorboardX: pip install "
        "-e '.[profile]'); with --profile DIR, one TensorBoard shows both",
    )
    p.add_argument(
        "--profile",
        type=writable_dir,
        default=None,
        metavar="DIR",
        help="write a jax.profiler trace of the steps after the first (TensorBoard, Perfetto) "
        "and print their compute / collective / idle split",
    )
    p.add_argument(
        "--profile-steps",
        type=positive_int,
        default=3,
        metavar="N",
        help="steps the --profile trace holds (default 3)",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=positive_int,
        default=3,
        metavar="N",
        help="keep the newest N finished checkpoints, delete older ones (default 3)",
    )
    p.add_argument(
        "--stop-after",
        type=positive_int,
        default=None,
        metavar="STEP",
        help="stop at this step, as if interrupted (the LR schedule still spans --steps)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything, print the resolved configuration, compile nothing",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar: each logged step (--log-every) is a line instead",
    )
    add_dataclass_args(p.add_argument_group("model (on top of --model)"), ModelConfig)
    add_dataclass_args(p.add_argument_group("training"), TrainConfig)
    p.set_defaults(func=main)


def resolve(args) -> tuple[ModelConfig, TrainConfig, dict, dict]:
    """(model, training, run settings, paths) from preset, config file and flags."""
    saved = _load_config(args)
    if saved and args.model:
        raise ValueError("--model and --config both set the model; give one of them")
    model = MODEL_PRESETS[args.model or "tiny"].replace(**saved.get("model", {}))
    cfg = build_config(ModelConfig, args, base=model)
    tcfg = build_config(TrainConfig, args, base=TrainConfig(**saved.get("train", {})))
    run = {
        "mesh": "dp=-1",
        "strategy": "auto",
        "schedule": None,
        "microbatches": None,  # a pipeline's default: the pipe size (loop.prepare)
        "virtual_stages": None,  # 2 for the interleaved schedule, else 1
        "grad_buckets": None,  # one all-reduce after the backward
        "data": "stdlib",
        "prompt": "def ",
        "sample_tokens": 48,
        **saved.get("run", {}),
    }
    run.update({k: getattr(args, k) for k in RUN_FIELDS if getattr(args, k) is not None})
    run_dir = Path(args.run_dir) if args.run_dir else None
    paths = {
        "run_dir": run_dir,
        "ckpt_dir": args.ckpt_dir or (str(run_dir / "checkpoints") if run_dir else None),
        "metrics": args.metrics or (str(run_dir / "metrics.jsonl") if run_dir else None),
    }
    _check_run_paths(paths)
    return cfg, tcfg, run, paths


def _check_run_paths(paths: dict) -> None:
    """The paths --out implies, checked as the flags are (before anything compiles):
    RUN_DIR/checkpoints a directory, RUN_DIR/metrics.jsonl and RUN_DIR/loss.png files."""
    run_dir = paths["run_dir"]
    if run_dir is None:
        return
    implied = [(writable_dir, paths["ckpt_dir"]), (writable_path, paths["metrics"])]
    implied.append((writable_path, run_dir / "loss.png"))
    check_implied("--out", run_dir, implied)


def _load_config(args) -> dict:
    path = args.config
    if (
        path is None
        and args.resume
        and args.run_dir
        and (Path(args.run_dir) / "config.json").is_file()
    ):
        path = Path(args.run_dir) / "config.json"  # resuming a run directory: its own config
    if path is None:
        return {}
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--config {path}: cannot read it as JSON ({type(e).__name__})") from None
    if not isinstance(saved, dict):
        raise ValueError(f"--config {path}: expected an object with model, train and run")
    model = saved.get("model")
    if isinstance(model, dict) and isinstance(model.get("remat"), bool):  # before the policies
        model["remat"] = "block" if model["remat"] else "none"
    stray = set(saved) - {"model", "train", "run"}
    if stray:
        raise ValueError(
            f"--config {path}: unknown section(s) {sorted(stray)}; expected model, train, run"
        )
    for section, cls in (("model", ModelConfig), ("train", TrainConfig)):
        check_section(f"--config {path}: {section}", saved.get(section, {}), *dataclass_kinds(cls))
    schedules = {"schedule": ("gpipe", "1f1b", "interleaved", "zb-h1")}
    check_section(f"--config {path}: run", saved.get("run", {}), RUN_KINDS, schedules)
    for key, low in RUN_MINIMA.items():  # the ranges the flags' types enforce
        value = saved.get("run", {}).get(key)
        if value is not None and value < low:
            where = f"--config {path}: run.{key}"
            raise ValueError(f"{where}: expected an integer >= {low}, got {value}")
    try:  # the values' ranges, checked by the configs themselves (a file sets the tiny preset)
        MODEL_PRESETS["tiny"].replace(**saved.get("model", {}))
        TrainConfig(**saved.get("train", {}))
    except ValueError as e:
        raise ValueError(f"--config {path}: {e}") from None
    return saved


def main(args) -> int:
    from jaxscale.train.checkpoint import CheckpointError

    return guarded(_main, CheckpointError)(args)  # bad input: one line and exit 2


def _main(args) -> int:
    from jaxscale.devices import describe_devices
    from jaxscale.train.loop import Interrupted, NonFiniteLoss, RunSetup, prepare, train

    cfg, tcfg, run, paths = resolve(args)
    setup = RunSetup(
        mesh=run["mesh"],
        strategy=run["strategy"],
        schedule=run["schedule"],
        microbatches=run["microbatches"],
        virtual_stages=run["virtual_stages"],
        dataset=run["data"],
        ckpt_dir=paths["ckpt_dir"],
        resume=args.resume,
        metrics_path=paths["metrics"],
        prompt=run["prompt"],
        sample_tokens=run["sample_tokens"],
        progress=not args.no_progress,
        stop_after=args.stop_after,
        keep_checkpoints=args.keep_checkpoints,
        grad_buckets=run["grad_buckets"] or 0,
        profile_dir=args.profile,
        tensorboard=args.tensorboard,
        profile_steps=args.profile_steps,
    )
    plan = prepare(cfg, tcfg, setup)
    config = {"model": dataclasses.asdict(cfg), "train": dataclasses.asdict(tcfg), "run": run}
    print(f"devices: {describe_devices()}")
    steps = f"steps {plan.start}..{plan.end}" if plan.start < plan.end else "nothing to train"
    print(
        f"run: {plan.built.label} on {plan.built.strategy.mesh}, data {run['data']}, {steps}"
        + (f", run dir {paths['run_dir']}" if paths["run_dir"] else "")
    )
    print("config: " + json.dumps(config))
    for note in plan.notes:
        print(note)
    if args.dry_run:
        return 0
    if paths["run_dir"]:
        paths["run_dir"].mkdir(parents=True, exist_ok=True)
        (paths["run_dir"] / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    try:
        result = train(cfg, tcfg, setup, plan, say=print)
    except NonFiniteLoss as e:
        print(f"jaxscale train: {e}", file=sys.stderr)
        return 3
    except Interrupted as e:
        print(f"jaxscale train: {e}", file=sys.stderr)
        return 130
    _report(result)
    if result.profile:
        from jaxscale.profiling import describe

        print(describe(result.profile, args.profile))
    if paths["run_dir"] and paths["metrics"]:
        from jaxscale.train.plot import plot_metrics

        print(f"plot: {plot_metrics(paths['metrics'], paths['run_dir'] / 'loss.png')}")
    return 0


def _report(result) -> None:
    floor = "" if result.optimal_loss is None else f"  (optimum {result.optimal_loss:.4f})"
    for ev in result.evals:
        print(f"step {ev['step']:5d}  eval loss {ev['eval_loss']:.4f}{floor}")
    if result.history:
        last = result.history[-1]
        rate = f"  ({last['tokens_per_s']:.0f} tokens/s)" if "tokens_per_s" in last else ""
        print(f"final train loss {last['loss']:.4f}{rate}")
    if result.sample:
        print(f"sample: {result.sample!r}")
