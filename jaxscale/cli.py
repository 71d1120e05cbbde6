"""`jaxscale` command line. Thin: every subcommand's logic lives in the package below.

Subcommands that need jax import it inside their handler, so `jaxscale calc …` and
`jaxscale simulate …` start without loading jax. Each handler returns a process exit code.
"""

import argparse
import sys


def _add_doctor(sub):
    p = sub.add_parser("doctor", help="versions, backend, devices, and a psum smoke test")
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
    "jaxscale.bench.cli",  # bench [meshes|collectives]
    "jaxscale.verify_cli",  # verify
    "jaxscale.sim.cli",  # simulate …
    "jaxscale.advise_cli",  # advise
    "jaxscale.launch",  # launch -n N -- …
    "jaxscale.lessons.hello",  # hello
)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0 if rc is None else int(rc)
