"""`jaxscale bench [meshes|collectives|rl]`: the mesh comparison (default), collective timings, or
PPO beside rejax's (`jaxscale.rl.bench`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxscale.cliutil import comma_list, positive_int, writable_dir, writable_path
from jaxscale.config import MODEL_PRESETS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare strategies x meshes: memory, FLOPs, collectives, equivalence (default), "
        "pipeline schedules against their formulas ('bench pipeline'), MoE rows with their "
        "all-to-alls ('bench experts'), strong/weak scaling ('bench scaling'), time collectives "
        "('bench collectives'), or PPO beside rejax ('bench rl')",
        description="The mesh comparison (default): every strategy x mesh compiled, its memory, "
        "FLOPs and collectives measured beside the predictions, and a short trajectory checked "
        "against one device. 'bench pipeline' runs each pipeline schedule: bubble and "
        "collective-permute bytes against their formulas, temporaries as M grows, the executed "
        "grids. 'bench experts' runs expert parallelism, TP of experts and the auto path on an "
        "MoE model: all-to-all bytes against 4 per MoE layer, the seed's EP-vs-TP table. "
        "'bench scaling' runs one strategy's strong and weak scaling over 1, 2, 4, 8 devices "
        "against its prediction (calc scaling's efficiencies). "
        "'bench collectives' times each collective over message sizes. "
        "'bench rl' "
        "times jaxscale's PPO beside rejax's on CartPole (steps/s, time to 475).",
        epilog="examples:\n  jaxscale bench --model tiny --strategies auto:fsdp,manual:zero3 "
        "--steps 3\n  jaxscale bench --strategies manual:zero3+tp --meshes 'fsdp=2,tp=4;"
        "fsdp=4,tp=2'\n  jaxscale bench --target tpu:v5e:2x4\n  jaxscale bench collectives "
        "--sizes 1K:16M\n  jaxscale bench pipeline --sweep 4,8,16\n  "
        "jaxscale bench scaling --strategies auto:fsdp"
        "\n  jaxscale bench rl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suites = ["meshes", "pipeline", "experts", "scaling", "serve", "collectives", "rl"]
    p.add_argument("suite", nargs="?", default="meshes", choices=suites)
    p.add_argument(
        "--model",
        default="small",
        choices=sorted(MODEL_PRESETS),
        help="model preset (default small)",
    )
    p.add_argument(
        "--strategies",
        default="",
        help="comma-separated labels (auto:dp, manual:zero3, or a bare name such as "
        "dp for both paths); with --meshes, 'auto' or 'manual:...' on every mesh "
        "given (default: the bench's rows)",
    )
    p.add_argument(
        "--target",
        default="cpu",
        help="'cpu' (run on the simulated devices; default) or a TPU topology such "
        "as tpu:v5e:2x4 (compile only; needs the tpu-aot extra)",
    )
    p.add_argument(
        "--meshes",
        default="",
        help="mesh specs, ';'-separated (dp=4,tp=2;...): the auto path on each, or "
        "every --strategies entry on each",
    )
    p.add_argument(
        "--global-batch", type=positive_int, default=16, help="sequences per step (default 16)"
    )
    p.add_argument(
        "--seq-len", type=positive_int, default=64, help="tokens per sequence (default 64)"
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=2,
        help="timed steps per row: the checked trajectory runs one more, untimed (default 2)",
    )
    p.add_argument(
        "--out",
        type=writable_dir,
        default="results",
        help="directory for the JSON report and the PNG (default results)",
    )
    p.add_argument(
        "--plot", type=writable_path, default=None, help="PNG path (default OUT/bench_<suite>.png)"
    )
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument(
        "--remat-layers",
        type=positive_int,
        default=8,
        help="layers of the model used for the remat vs sqrt(L) comparison (default 8)",
    )
    p.add_argument(
        "--sweep",
        type=comma_list(positive_int),
        default=[4, 8, 16, 32],
        help="pipeline suite: microbatch counts M at which every schedule is "
        "compiled for its compile time, tick programs and temporaries (default "
        "4,8,16,32; make bench runs 8,32)",
    )
    p.add_argument(
        "--devices",
        type=comma_list(positive_int),
        default=None,
        help="scaling suite: device counts, starting at 1 (default 1,2,4,... up to "
        "the devices there are), e.g. 1,2,4,8",
    )
    p.add_argument(
        "--mode",
        choices=("strong", "weak", "both"),
        default="both",
        help="scaling suite: strong (global batch fixed), weak (--global-batch per "
        "device) or both (default)",
    )
    p.add_argument(
        "--requests",
        type=positive_int,
        default=24,
        help="serve suite: requests per load level (default 24)",
    )
    p.add_argument("--no-http", action="store_true", help="serve suite: skip the HTTP runs")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of tables")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the arguments and list the rows, compile nothing",
    )
    from jaxscale.bench import collectives

    collectives.add_arguments(p)
    p.set_defaults(func=main)


def plot_path(args, name: str) -> str | None:
    if args.no_plot:
        return None
    return args.plot or str(Path(args.out) / f"{name}.png")


def _cases(args, n_devices: int):
    from jaxscale.bench import meshes

    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    extra = [m.strip() for m in args.meshes.split(";") if m.strip()]
    if names and extra:
        return meshes.cross_cases(names, extra, n_devices)
    if names or extra:
        return meshes.resolve_cases(names, extra, n_devices)
    return list(meshes.DEFAULT_CASES)


def main(args) -> int:
    if args.suite == "rl":
        from jaxscale.rl import bench as rl_bench

        return rl_bench.main(args)
    if args.suite in ("pipeline", "experts"):
        import jax

        from jaxscale.bench import experts, pipeline

        # On simulated CPU devices these suites are mostly compiling, their figures are bytes
        # and memory: at XLA's lowest backend optimisation level, as the test suite compiles
        # (the HLO passes that fix collectives and memory are the same; ~2x faster compiles)
        if jax.default_backend() == "cpu":
            jax.config.update("jax_disable_most_optimizations", True)
        return (pipeline if args.suite == "pipeline" else experts).main(args)
    if args.suite == "serve":
        from jaxscale.bench import serve

        return serve.main(args)
    if args.suite == "scaling":
        from jaxscale.bench import scaling

        return scaling.main(args)
    if args.suite == "collectives":
        from jaxscale.bench import collectives

        args.plot = plot_path(args, "bench_collectives")
        return collectives.main(args, dry_run=args.dry_run)
    import json

    import jax

    from jaxscale.bench import meshes, report
    from jaxscale.config import TrainConfig
    from jaxscale.progress import Progress

    try:
        cfg = MODEL_PRESETS[args.model]
        # no warmup: the trajectory compared with the reference has real updates from step 0
        tcfg = TrainConfig(
            global_batch=args.global_batch, seq_len=args.seq_len, steps=100, warmup_steps=0, lr=1e-3
        )
        if args.seq_len > cfg.max_seq:
            raise ValueError(f"--seq-len {args.seq_len} exceeds the model's max_seq {cfg.max_seq}")
        target, n_devices = None, jax.device_count()
        if args.target != "cpu":
            from jaxscale.analysis import aot

            try:
                target = aot.parse_target(args.target)
            except ValueError as e:
                raise ValueError(f"--target: {e}") from None
            reason = aot.aot_unavailable_reason()
            if reason:
                raise ValueError(f"--target {args.target}: {reason}")
            n_devices = len(aot.target_devices(target))
        cases = _cases(args, n_devices)
        meshes.check_cases(cases, tcfg, n_devices)  # the flags, before anything compiles
    except ValueError as e:
        print(f"jaxscale bench: error: {e}", file=sys.stderr)
        return 2
    env = report.environment(args.target)
    print(
        f"bench: model {args.model} (d_model {cfg.d_model}, {cfg.n_layers} layers), batch "
        f"{args.global_batch} x seq {args.seq_len}, {env['device_count']} {env['device_kind']} "
        f"devices, jax {env['jax']}, "
        f"{'run here' if target is None else f'compiled for {args.target}'}",
        file=sys.stderr,
    )
    if args.dry_run:
        print("\n".join(f"{c.label:<20} {c.mesh}" for c in cases))
        return 0
    if target is not None:
        return _main_aot(args, cfg, tcfg, cases, target, env)
    bar = Progress(len(cases) + 2, desc="bench")
    rows, ref_ms = meshes.run_bench(cfg, tcfg, cases, args.steps, progress=bar)
    remat = meshes.remat_report(cfg.replace(n_layers=args.remat_layers), tcfg)
    bar.update(1, note="remat")
    bar.close()
    paths = report.write_outputs(
        rows, env, args.out, extra={"remat": remat}, plot=plot_path(args, "bench_meshes")
    )
    if args.json:
        print(json.dumps(report.to_json(rows, env, {"remat": remat})))
    else:
        from jaxscale.model import counts

        flops = counts.train_step_flops(
            cfg, tcfg.global_batch, tcfg.seq_len, causal=True, executed=False
        )
        print(report.memory_table(rows, ref_ms, report.mfu_lines(rows, flops, env["device_kind"])))
        print()
        print(report.comm_table(rows))
        print()
        print(report.remat_lines(remat))
        if jax.default_backend() == "cpu":
            print(
                "* step ms on simulated CPU devices sharing the host's cores: indicative only;"
                " compare meshes by the compiler figures, not by wall-clock."
            )
        print("\nwrote " + ", ".join(str(p) for p in paths))
    ok = all(
        r.report is None or (r.equivalent and r.memory_ok and r.comm_ok is not False) for r in rows
    )
    return 0 if ok else 1


def _main_aot(args, cfg, tcfg, cases, target, env) -> int:
    """Compile for the TPU topology (no execution) and for the CPU devices, and compare."""
    import json

    from jaxscale.bench import meshes, report
    from jaxscale.progress import Progress

    bar = Progress(2 * len(cases), desc=f"compile {target}")
    tpu_rows, _ = meshes.run_bench(cfg, tcfg, cases, progress=bar, target=target)
    cfg_u = cfg.replace(unroll_layers=True)
    cpu_rows = []
    for case in cases:
        cpu_rows.append(meshes.bench_case(case, cfg_u, tcfg, 0, None, execute=False))
        bar.update(1, note=f"cpu {case.label}")
    bar.close()
    name = f"bench_{target.topology_name}"
    paths = report.write_outputs(tpu_rows, env, args.out, name=name, plot=plot_path(args, name))
    if args.json:
        print(json.dumps(report.to_json(tpu_rows, env)))
        return 0
    print(report.memory_table(tpu_rows, None))
    print()
    print(report.comm_table(tpu_rows))
    print()
    print(report.cross_backend_table(cpu_rows, tpu_rows, str(target)))
    print(
        "\nNothing ran: memory, FLOPs and collectives are the TPU compiler's; TPU pads buffers to "
        "memory tiles, so its argument bytes exceed the layout's (see docs/tpu-aot.md)."
    )
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
