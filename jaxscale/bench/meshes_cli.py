"""`jaxscale bench meshes` (the default suite): the rows from the flags, run here or compiled
for a TPU topology, printed and written (bench/meshes.py measures, bench/report.py renders).
Its flags are registered in bench/cli.py."""

from __future__ import annotations

import sys
from pathlib import Path

from jaxscale.bench.report import plot_path
from jaxscale.config import MODEL_PRESETS


def _cases(args, n_devices: int):
    from jaxscale.bench import meshes

    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    extra = [m.strip() for m in args.meshes.split(";") if m.strip()]
    if names and extra:
        return meshes.cross_cases(names, extra, n_devices)
    if names or extra:
        return meshes.resolve_cases(names, extra, n_devices)
    return list(meshes.DEFAULT_CASES)


def _meshes_setup(args):
    """(model config, train config, cases, TPU target or None), every flag checked before
    anything compiles; a ValueError names the flag."""
    import jax

    from jaxscale.bench import meshes
    from jaxscale.config import TrainConfig

    cfg = MODEL_PRESETS[args.model]
    # no warmup: the trajectory compared with the reference has real updates from step 0
    tcfg = TrainConfig(
        global_batch=args.global_batch, seq_len=args.seq_len, steps=100, warmup_steps=0, lr=1e-3
    )
    if args.seq_len > cfg.max_seq:
        raise ValueError(f"--seq-len {args.seq_len} exceeds the model's max_seq {cfg.max_seq}")
    target, n_devices = None, jax.device_count()
    if args.target != "cpu":
        target, n_devices = _aot_target(args.target)
    cases = _cases(args, n_devices)
    meshes.check_cases(cases, tcfg, n_devices)  # the flags, before anything compiles
    return cfg, tcfg, cases, target


def _aot_target(text: str):
    """--target's TPU topology and its device count."""
    from jaxscale.analysis import aot

    try:
        target = aot.parse_target(text)
    except ValueError as e:
        raise ValueError(f"--target: {e}") from None
    reason = aot.aot_unavailable_reason()
    if reason:
        raise ValueError(f"--target {text}: {reason}")
    return target, len(aot.target_devices(target))


def run(args) -> int:
    from jaxscale.bench import meshes, report
    from jaxscale.progress import Progress

    try:
        cfg, tcfg, cases, target = _meshes_setup(args)
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
    args.time = args.time or bool(args.profile)  # a kept trace is --time's trace
    bar = Progress(len(cases) + 2 + bool(args.time), desc="bench")
    time_steps = args.time_steps if args.time else 0
    rows, ref_ms = meshes.run_bench(
        cfg, tcfg, cases, args.steps, bar, time_steps=time_steps, profile=args.profile
    )
    remat = meshes.remat_report(cfg.replace(n_layers=args.remat_layers), tcfg)
    bar.update(1, note="remat")
    fits = None
    if args.time:
        from jaxscale.bench import timing

        fits = {key: timing.fit(*key) for key in sorted(timing.needed(rows))}
        bar.update(1, note="alpha-beta fits")
    bar.close()
    paths = report.write_outputs(
        rows, env, args.out, extra={"remat": remat}, plot=plot_path(args, "bench_meshes")
    )
    _print_meshes(args, rows, ref_ms, remat, env, cfg, tcfg, paths)
    if fits is not None:
        import json

        path = Path(args.out) / "bench_time.json"
        path.write_text(json.dumps(timing.record(rows, fits), indent=1))
        if not args.json:
            print()
            print(timing.format_table(rows, fits))
            print(f"wrote {path}", file=sys.stderr)
    ok = all(
        r.report is None or (r.equivalent and r.memory_ok and r.comm_ok is not False) for r in rows
    )
    return 0 if ok else 1


def _print_meshes(args, rows, ref_ms, remat, env, cfg, tcfg, paths) -> None:
    import json

    import jax

    from jaxscale.bench import report

    if args.json:
        print(json.dumps(report.to_json(rows, env, {"remat": remat})))
        return
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
            "* step ms on simulated CPU devices sharing the host's cores, compiled at XLA's "
            "backend optimisation level 0 (its memory, FLOP and collective figures are level "
            "2's): indicative only; compare meshes by the compiler figures, not by wall-clock."
        )
    print("\nwrote " + ", ".join(str(p) for p in paths))


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
