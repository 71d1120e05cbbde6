"""`jaxscale bench [meshes|collectives]`: the mesh comparison (default) or collective timings."""

from __future__ import annotations

import argparse
import sys

from jaxscale.config import MODEL_PRESETS
from jaxscale.sharding import STRATEGY_MESHES


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare strategies x meshes: memory, FLOPs, collectives, equivalence (default), "
        "or time collectives ('bench collectives')",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("suite", nargs="?", default="meshes", choices=["meshes", "collectives"])
    p.add_argument("--model", default="small", choices=sorted(MODEL_PRESETS))
    p.add_argument("--strategies", default=",".join(STRATEGY_MESHES),
                   help=f"comma-separated, from: {', '.join(STRATEGY_MESHES)}")  # fmt: skip
    p.add_argument("--meshes", default="", help="extra mesh specs, ';'-separated (dp=4,tp=2;...)")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="timed steps per row (after a warm-up)")
    p.add_argument("--out", default="results", help="directory for JSON and PNG")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of a table")
    from jaxscale.bench import collectives

    collectives.add_arguments(p)
    p.set_defaults(func=main)


def main(args) -> int:
    if args.suite == "collectives":
        from jaxscale.bench import collectives

        return collectives.main(args)
    import json

    import jax

    from jaxscale.bench import meshes, report
    from jaxscale.config import TrainConfig
    from jaxscale.progress import Progress

    try:
        cfg = MODEL_PRESETS[args.model]
        tcfg = TrainConfig(global_batch=args.global_batch, seq_len=args.seq_len, steps=100)
        names = [s.strip() for s in args.strategies.split(",") if s.strip()]
        extra = [m.strip() for m in args.meshes.split(";") if m.strip()]
        strategies = meshes.resolve_strategies(names, extra)
        if args.seq_len > cfg.max_seq:
            raise ValueError(f"--seq-len {args.seq_len} exceeds the model's max_seq {cfg.max_seq}")
    except ValueError as e:
        print(f"jaxscale bench: error: {e}", file=sys.stderr)
        return 2
    env = report.environment()
    print(f"bench: model {args.model} ({cfg.d_model=}, {cfg.n_layers=}), batch {args.global_batch}"
          f" x seq {args.seq_len}, {env['device_count']} {env['device_kind']} devices, "
          f"jax {env['jax']}", file=sys.stderr)  # fmt: skip
    bar = Progress(len(strategies) + 1, desc="bench")
    rows = meshes.run_bench(cfg, tcfg, strategies, args.steps, progress=bar)
    bar.close()
    paths = report.write_outputs(rows, env, args.out)
    if args.json:
        print(json.dumps(report.to_json(rows, env)))
    else:
        print(report.format_table(rows, jax.default_backend()))
        print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0 if all(r.equivalent or r.report is None for r in rows) else 1
