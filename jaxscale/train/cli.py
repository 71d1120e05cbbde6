"""`jaxscale train`: train the transformer on a mesh, by any strategy the composer builds: the auto
path (jit + shardings from the rules) or a manual one (shard_map, explicit collectives)."""

from __future__ import annotations

import argparse
import sys

from jaxscale.cliutil import add_dataclass_args, overrides
from jaxscale.config import MODEL_PRESETS, ModelConfig, TrainConfig


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train on a mesh: progress bar, JSON-lines metrics, eval loss, sample, checkpoints",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--mesh", default="dp=-1", help="mesh spec, e.g. dp=2,fsdp=2,tp=2")
    p.add_argument("--strategy", default="auto",
                   help="'auto' (jit + the rules table) or 'manual:' + dp/zero1/zero2/zero3 "
                   "and/or tp/tp_sp/tp_gather joined by '+', e.g. manual:zero3+tp")  # fmt: skip
    p.add_argument("--model", default="tiny", choices=sorted(MODEL_PRESETS), help="model preset")
    p.add_argument("--data", default="stdlib",
                   help="'stdlib' (Python's own sources), 'markov' (synthetic, known optimal "
                   "loss), 'copy' (needs attention: each window's second half repeats its "
                   "first) or a path to a text file")  # fmt: skip
    p.add_argument("--ckpt-dir", default=None, help="write checkpoints here")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--metrics", default=None, help="append JSON-lines metrics to this file")
    p.add_argument("--prompt", default="def ", help="prompt for the greedy sample at the end")
    p.add_argument("--sample-tokens", type=int, default=48)
    p.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="stop at this step, as if interrupted (the LR schedule still spans --steps)",
    )
    p.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("model overrides (on top of --model)")
    add_dataclass_args(g, ModelConfig)
    g = p.add_argument_group("training")
    add_dataclass_args(g, TrainConfig)
    p.set_defaults(func=main)


def main(args) -> int:
    from jaxscale.train.checkpoint import CheckpointError
    from jaxscale.train.loop import NonFiniteLoss, RunSetup, train

    try:
        cfg = MODEL_PRESETS[args.model].replace(**overrides(args, ModelConfig))
        tcfg = TrainConfig(**overrides(args, TrainConfig))
        setup = RunSetup(
            mesh=args.mesh, strategy=args.strategy, dataset=args.data, ckpt_dir=args.ckpt_dir,
            resume=args.resume,
            metrics_path=args.metrics, prompt=args.prompt, sample_tokens=args.sample_tokens,
            progress=not args.no_progress, stop_after=args.stop_after,
        )  # fmt: skip
        result = train(cfg, tcfg, setup)
    except (ValueError, FileNotFoundError, CheckpointError) as e:
        print(f"jaxscale train: error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLoss as e:
        print(f"jaxscale train: {e}", file=sys.stderr)
        return 3
    if result.resumed_from is not None:
        print(f"resumed from step {result.resumed_from}")
    for ev in result.evals:
        print(f"step {ev['step']:5d}  eval loss {ev['eval_loss']:.4f}")
    if result.history:
        last = result.history[-1]
        print(f"final train loss {last['loss']:.4f}  ({last['tokens_per_s']:.0f} tokens/s)")
    if result.sample:
        print(f"sample: {result.sample!r}")
    return 0
