"""`jaxscale` command line. Thin: every subcommand's logic lives in the package below.

`main` is the process edge (the `jaxscale` console script and `python -m jaxscale` both enter
here): before jax initialises, an unset CPU device count defaults to 8 simulated devices (only
the CPU backend reads it, so a GPU or TPU host still uses its accelerators), and a process started
by `jaxscale launch` joins its peers. Subcommands that need jax import it inside their handler, so
`jaxscale calc …` and `jaxscale simulate …` start without loading jax. Each handler returns a
process exit code.
"""

import argparse
import sys


def _add_doctor(sub):
    p = sub.add_parser(
        "doctor",
        help="versions, backend, devices, and a psum smoke test",
        description="Versions, backend, devices and processes, and a psum over "
        "every device checked against its closed form.",
        epilog="example: jaxscale doctor --json",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=lambda a: _lazy("jaxscale.devices", "doctor_main")(a))


def _lazy(module: str, attr: str):
    import importlib

    return getattr(importlib.import_module(module), attr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxscale",
        description="A JAX sharding laboratory: DP, FSDP/ZeRO, TP, PP, EP on one NNX transformer.",
    )
    parser.add_argument("--version", action="version", version=f"jaxscale {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_doctor(sub)
    from jaxscale.calc import cli as calc_cli

    calc_cli.add_parser(sub)
    for module in _OPTIONAL_COMMAND_MODULES:
        _lazy(module, "add_parser")(sub)
    return parser


# Command groups that live in their own modules; each exposes add_parser(subparsers).
_OPTIONAL_COMMAND_MODULES = (
    "jaxscale.train.cli",  # train
    "jaxscale.bench.cli",  # bench [SUITE]
    "jaxscale.verify_cli",  # verify
    "jaxscale.sim.cli",  # simulate …
    "jaxscale.advise_cli",  # advise
    "jaxscale.launch",  # launch -n N -- …
    "jaxscale.lessons.hello",  # hello
    "jaxscale.train.plot",  # plot
    "jaxscale.rl.cli",  # rl …
    "jaxscale.rlhf.cli",  # rlhf
    "jaxscale.serve.cli",  # serve
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxscale")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """`jaxscale ARGV`: the exit code. `parser`: one `build_parser()` made earlier, for callers
    that run many commands in one process (the fuzz suites: building the tree of every command's
    flags is most of a refused command's time)."""
    from jaxscale.compat import use_fast_compile_xla_flags
    from jaxscale.devices import (
        DEFAULT_CPU_DEVICES,
        VERIFY_CPU_DEVICES,
        collective_threads,
        cpu_devices_error,
        default_cpu_devices,
        patient_rendezvous,
    )
    from jaxscale.launch import maybe_initialize_distributed

    words = sys.argv[1:] if argv is None else argv
    verifying = words[:1] == ["verify"]
    default_cpu_devices(VERIFY_CPU_DEVICES if verifying else DEFAULT_CPU_DEVICES)
    if error := cpu_devices_error():
        print(f"jaxscale: error: {error}", file=sys.stderr)
        return 2
    use_fast_compile_xla_flags()  # jax 0.10's XLA:CPU: the same program in ~60% of the compile
    patient_rendezvous()  # a held-up simulated device is not a hang
    collective_threads()  # a thread for each device's second collective: no starved rendezvous
    maybe_initialize_distributed()  # joins `jaxscale launch`'s processes; no-op otherwise
    parser = parser or build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0 if rc is None else int(rc)


def entry() -> None:
    """The `jaxscale` console script and `python -m jaxscale`: `main`'s exit code, through
    `stopping.end_process` (a stopped run skips the interpreter's teardown, where a second
    Ctrl-C would kill it by the signal)."""
    from jaxscale.stopping import end_process

    end_process(main())
