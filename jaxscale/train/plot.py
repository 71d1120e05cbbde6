"""`jaxscale plot RUN`: the curves of a run's metrics.jsonl as a PNG -- a training run's loss, eval
loss and learning-rate schedule, an RL run's episodic return, an RLHF run's true score,
reward-model score and KL.

RUN is a metrics.jsonl file or a directory holding one; the kind of run is told by the file's
keys. Where a resumed run recorded a step again, its later record wins, so a plot of an
interrupted-and-resumed run is one curve. A point whose value is not finite (null, NaN) is left
out. The learning rate is drawn from the run's schedule, rebuilt from config.json beside the
metrics, at every step; without a usable config.json, from the logged points.
"""

from __future__ import annotations

import json
import math
from argparse import ArgumentTypeError
from pathlib import Path
from typing import NamedTuple

from jaxscale.cliutil import guarded, writable_path
from jaxscale.render import figure


class Kind(NamedTuple):
    x: str  # the record key on the x axis
    xlabel: str
    panels: tuple  # ((y label, ((key, legend label, line style), ...)), ...)


# One entry per writer of metrics.jsonl; a file's kind is the first whose first panel's keys it
# holds (RLHF and RL records may carry a "loss" too, so the train kind is tried last).
KINDS = {
    "rlhf": Kind(  # jaxscale rlhf --out
        "iteration",
        "iteration",
        (
            ("true score (programmatic)", (("true_score", "true score", "-"),)),
            ("reward-model score", (("rm_score", "reward-model score", "-"),)),
            ("KL to the reference (nats/response)", (("kl", "KL(actor || reference)", "-"),)),
        ),
    ),
    "rl": Kind(  # jaxscale rl --out: update records, then evaluation records, per seed
        "env_steps",
        "environment steps",
        (
            (
                "episodic return",
                (
                    ("episode_return", "training episodes", "-"),
                    ("eval_return", "evaluation", "o"),
                ),
            ),
        ),
    ),
    "train": Kind(  # jaxscale train --out / --metrics
        "step",
        "step",
        (
            (
                "loss (nats/token)",
                (
                    ("loss", "train loss", "-"),
                    ("eval_loss", "eval loss", "o-"),
                    ("optimal_loss", "optimal loss", "--"),
                ),
            ),
            ("learning rate", (("lr", "learning rate (logged points)", "-"),)),
        ),
    ),
}
LR_LOGGED = "learning rate (logged points{why})"
MAX_LR_POINTS = 1_000_000


def metrics_file(run: str | Path) -> Path:
    """The metrics.jsonl that RUN names: the file itself, or the one in the directory."""
    path = Path(run)
    if path.is_dir() and path.suffix != ".jsonl":
        path = path / "metrics.jsonl"
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a metrics file")
    if not path.is_file():
        raise ValueError(f"{path}: no metrics file (write one with train, rl or rlhf --out)")
    return path


def read_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) for each non-blank line; ValueError naming the line otherwise."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise ValueError(f"{path}:{n}: not a JSON line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{n}: not a JSON object")
        records.append((n, record))
    return records


def detect(path: Path, records: list[tuple[int, dict]]) -> str:
    keys = set().union(*(r for _, r in records))
    for kind, spec in KINDS.items():
        if keys & {key for key, *_ in spec.panels[0][1]}:
            return kind
    known = ", ".join(key for spec in KINDS.values() for key, *_ in spec.panels[0][1])
    raise ValueError(f"{path}: not the metrics of a train, rl or rlhf run (no key among {known})")


def number(value, where: str) -> float:
    """A record's value as a float: NaN for null and the non-finite values a strict JSON writer
    spells as strings ("nan", "inf"), so the point is skipped; ValueError for anything else."""
    if value is None:
        return math.nan
    if isinstance(value, str) and value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} is {json.dumps(value)}, not a number")
    return float(value)


def series(path: Path, records, kind: Kind, key: str) -> dict:
    """{seed: {x: y}} of `key`'s finite points (seed None for a run of one); later records win."""
    out: dict = {}
    for n, record in records:
        if key not in record:
            continue
        where = f"{path}:{n}"
        if kind.x not in record:
            raise ValueError(f"{where}: a {key} record without {kind.x!r}")
        x = number(record[kind.x], f"{where}: {kind.x}")
        y = number(record[key], f"{where}: {key}")
        points = out.setdefault(record.get("seed"), {})
        points.pop(x, None)  # a later record of an x replaces the earlier one, even by a gap
        if math.isfinite(x) and math.isfinite(y):
            points[x] = y
    return out


def curves(run: str | Path) -> tuple[str, list[dict]]:
    """(kind, panels) of RUN's metrics: each panel {"ylabel", "xlabel", "lines": [(label, xs,
    ys, style, colour)]}, the learning rate from the run's schedule where config.json allows.
    Every problem with the file is a ValueError, raised before anything is drawn."""
    path = metrics_file(run)
    records = read_records(path)
    kind = detect(path, records)
    spec = KINDS[kind]
    panels = []
    for ylabel, keys in spec.panels:
        lines = []
        for k, (key, label, style) in enumerate(keys):
            by_seed = series(path, records, spec, key)
            for i, (seed, points) in enumerate(by_seed.items()):  # seeds in file order
                # one colour per seed where there are several (its training and eval points)
                name, color = (label, k) if len(by_seed) == 1 else (f"{label} (seed {seed})", i)
                xs = sorted(points)
                lines.append((name, xs, [points[x] for x in xs], style, f"C{color}"))
        panels.append({"ylabel": ylabel, "xlabel": spec.xlabel, "lines": lines})
    if kind == "train":
        panels[1]["lines"] = lr_lines(path.parent / "config.json", panels[1]["lines"])
    return kind, panels


def lr_lines(config: Path, logged: list) -> list:
    """The learning rate at every step from 0 to the last logged one, from the schedule the run
    trained with (a 20-step warmup logged every 100 steps would otherwise look like a 100-step
    ramp); the logged points, so labelled, where config.json is missing, unreadable or
    disagrees with them (e.g. it is another run's)."""
    if not logged:
        return logged
    _, xs, ys, style, color = logged[0]
    try:
        schedule = lr_schedule_of(json.loads(config.read_text()))
    except FileNotFoundError:
        return [(LR_LOGGED.format(why="; no config.json"), xs, ys, style, color)]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return [(LR_LOGGED.format(why="; config.json unusable"), xs, ys, style, color)]
    import numpy as np

    if not np.allclose(np.asarray(schedule(np.asarray(xs)), np.float64), ys, rtol=1e-3):
        return [(LR_LOGGED.format(why="; config.json's schedule differs"), xs, ys, style, color)]
    last = int(max(xs))
    stride = max(1, last // MAX_LR_POINTS)  # every step of a real run; bounded for any file
    steps = np.arange(0, last + 1, stride)
    lr = np.asarray(schedule(steps), np.float64)
    return [("learning rate (schedule from config.json)", steps.tolist(), lr.tolist(), "-", color)]


def lr_schedule_of(config: dict):
    """The optimizer's own schedule for a config.json's train section (jax imported here only:
    plotting the other kinds needs none)."""
    from jaxscale.config import TrainConfig
    from jaxscale.parallel.optim import lr_schedule

    return lr_schedule(TrainConfig(**config["train"]))


def plot_metrics(path: str | Path, out: str | Path) -> Path:
    """Draw RUN's curves (`curves`) into the PNG `out`, one panel per quantity."""
    path = metrics_file(path)
    kind, panels = curves(path)
    size = (11, 1.5 + 2.8 * len(panels))
    with figure(out, len(panels), 1, figsize=size, dpi=110) as (fig, axes):
        axes = axes if len(panels) > 1 else [axes]
        for ax, panel in zip(axes, panels, strict=True):
            draw(ax, panel)
        axes[0].set_title(f"{kind} run: {path}")
    return Path(out)


def draw(ax, panel: dict) -> None:
    for label, xs, ys, style, color in panel["lines"]:
        ax.plot(xs, ys, style, color=color, label=label, linewidth=1, markersize=4)
    ax.set(xlabel=panel["xlabel"], ylabel=panel["ylabel"])
    ax.grid(alpha=0.3)
    if panel["lines"]:  # beside the axes, so it never covers a curve
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=8)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plot",
        help="curves of a train, rl or rlhf run's metrics.jsonl (PNG)",
        description=__doc__.split("\n\n")[0],
        epilog="example: jaxscale plot runs/a  (writes runs/a/loss.png)",
    )
    p.add_argument("run", help="a run directory or a metrics.jsonl file")
    p.add_argument(
        "--out",
        type=writable_path,
        default=None,
        help="PNG to write (default: loss.png beside the metrics)",
    )
    p.set_defaults(func=main)


def main(args) -> int:
    return guarded(_main, ArgumentTypeError)(args)  # bad input: one line and exit 2


def _main(args) -> int:
    run = Path(args.run)
    base = run.parent if run.suffix == ".jsonl" or not run.is_dir() else run
    out = args.out or str(base / "loss.png")
    writable_path(out)  # the default path too, before any reading or drawing
    print(f"wrote {plot_metrics(run, out)}")
    return 0
