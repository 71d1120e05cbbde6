"""`jaxscale plot RUN`: loss, eval loss and learning-rate curves from a run's metrics (PNG).

RUN is a metrics.jsonl file or a run directory holding one. Where a resumed run recorded a step
again, its later record wins, so a plot of an interrupted-and-resumed run is one curve.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxscale.cliutil import fail, writable_path
from jaxscale.render import figure


def read_metrics(path: str | Path) -> tuple[dict[int, dict], dict[int, dict]]:
    """({step: train record}, {step: eval record}); later records win (ValueError on bad input)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path}: no metrics file (train with --run-dir or --metrics)")
    train, evals = {}, {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise ValueError(f"{path}:{n}: not a JSON line") from None
        if "eval_loss" in record:
            evals[record["step"]] = record
        elif "loss" in record:
            train[record["step"]] = record
    if not train and not evals:
        raise ValueError(f"{path}: holds no train or eval records")
    return dict(sorted(train.items())), dict(sorted(evals.items()))


def plot_metrics(path: str | Path, out: str | Path) -> Path:
    train, evals = read_metrics(path)
    with figure(out, 2, 1, figsize=(9, 7), dpi=110) as (fig, (ax_loss, ax_lr)):
        if train:
            ax_loss.plot(
                list(train), [r["loss"] for r in train.values()], label="train loss", linewidth=1
            )
        if evals:
            ax_loss.plot(
                list(evals), [r["eval_loss"] for r in evals.values()], "o-", label="eval loss"
            )
            optimum = next((r["optimal_loss"] for r in evals.values() if "optimal_loss" in r), None)
            if optimum is not None:
                ax_loss.axhline(
                    optimum, linestyle="--", color="gray", label=f"optimal loss {optimum:.3f}"
                )
        ax_loss.set(ylabel="loss (nats/token)", title=f"training run: {Path(path)}")
        ax_loss.legend()
        if train:
            ax_lr.plot(list(train), [r["lr"] for r in train.values()], color="tab:green")
        ax_lr.set(xlabel="step", ylabel="learning rate")
    return Path(out)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plot",
        help="loss / eval / learning-rate curves of a run (PNG)",
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
    run = Path(args.run)
    out = args.out or (run if run.is_dir() else run.parent) / "loss.png"
    try:
        read_metrics(run)  # every input problem before anything is written
        print(f"wrote {plot_metrics(run, out)}")
    except ValueError as e:
        return fail("plot", e)
    return 0
