"""Command-line plumbing shared by every subcommand: argparse types that name the bad value,
flags generated from frozen config dataclasses, the common output flags, and the one-line error
wrapper. Pure Python (no jax, nothing else of jaxscale)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

# --- argparse types ---------------------------------------------------------------------------

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """'124M', '7B', '1.7T', '70e9' -> float (> 0)."""
    match = re.fullmatch(r"\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text, re.I)
    if not match:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 124M, 7B, 70e9)")
    value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _number(text: str, kind, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def positive_int(text: str) -> int:
    value = _number(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def probability(text: str) -> float:
    """A number in [0, 1]."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1], got {text!r}")
    return value


def arg_type(func):
    """Wrap a library parser so argparse shows its ValueError message (not 'invalid value')."""

    def parse(text: str):
        try:
            return func(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = func.__name__
    return parse


def comma_list(item_type):
    """argparse type for '512,1024,2048' -> [512, 1024, 2048] with each item checked."""

    def parse(text: str) -> list:
        items = [part for part in text.split(",") if part.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return [arg_type(item_type)(part.strip()) for part in items]

    return parse


# --- flags from dataclasses -------------------------------------------------------------------


def add_dataclass_args(parser, cls, skip: tuple[str, ...] = ()) -> None:
    """One flag per field (`--d-model 64`, `--remat/--no-remat`), defaulting to None so only the
    flags given override a base config; the help shows the field's default."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)]
        if kind is bool:
            parser.add_argument(flag, dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction,
                                help=f"(default {f.default})")  # fmt: skip
        else:
            parser.add_argument(flag, dest=f.name, type=kind, default=None,
                                metavar=kind.__name__.upper(),
                                help=f"(default {f.default})")  # fmt: skip


def overrides(args: argparse.Namespace, cls) -> dict:
    """The fields of `cls` that were given on the command line."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


# --- output flags and errors ------------------------------------------------------------------


def add_output_flags(p: argparse.ArgumentParser, *, plot: bool = False, faithful: bool = False):
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    if plot:
        p.add_argument("--plot", metavar="PATH", help="write the plot as a PNG")
    if faithful:
        p.add_argument(
            "--seed-faithful",
            action="store_true",
            help="reproduce the seed's printed (defective) numbers instead of the corrected ones",
        )


def command_name(args: argparse.Namespace) -> str:
    """'calc kv', 'simulate pipeline', 'advise' ... from the parsed subcommands."""
    parts = [getattr(args, "command", None), getattr(args, "calc_name", None),
             getattr(args, "sim_name", None)]  # fmt: skip
    return " ".join(p for p in parts if p)


def guarded(handler):
    """Turn a ValueError from the library into a one-line error and exit code 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ValueError as err:
            print(f"jaxscale {command_name(args)}: error: {err}", file=sys.stderr)
            return 2

    return run
