"""Formatting and argument parsing shared by the training calculators' command line."""

import argparse
import json
import re
import sys

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """'124M', '7B', '1.7T', '70e9' -> float (> 0); argparse type."""
    match = re.fullmatch(r"\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text, re.I)
    if not match:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 124M, 7B, 70e9)")
    value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
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


def format_bytes(num_bytes: float) -> str:
    """Decimal units with one decimal, as shared/seeds/000_*.txt L37-45 prints them."""
    if num_bytes == 0:
        return "0 B"
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB")):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes / 1e3:.1f} KB"


def format_count(n: float) -> str:
    """7e9 -> '7.0B', 124e6 -> '124M' (shared/seeds/000_*.txt L48-56)."""
    if n >= 1e12:
        return f"{n / 1e12:.1f}T"
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Aligned text table: first column left-aligned, the others right-aligned."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "-" * len(line(cells[0]))
    return "\n".join([line(cells[0]), rule] + [line(row) for row in cells[1:]])


def mode_line(seed_faithful: bool, what: str) -> str:
    if seed_faithful:
        return f"mode: seed-faithful — reproduces {what}"
    return f"mode: corrected (--seed-faithful reproduces {what})"


def emit(args: argparse.Namespace, report: dict, lines: list[str]) -> None:
    """Print one JSON object with --json, else the text lines."""
    if getattr(args, "json", False):
        print(json.dumps(report, sort_keys=False))
    else:
        print("\n".join(lines))


def add_output_flags(p: argparse.ArgumentParser, *, plot: bool = False, faithful: bool = False):
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    if plot:
        p.add_argument("--plot", metavar="PATH", help="write the seed's plot as a PNG")
    if faithful:
        p.add_argument(
            "--seed-faithful",
            action="store_true",
            help="reproduce the seed's printed (defective) numbers instead of the corrected ones",
        )


def guarded(handler):
    """Turn a ValueError from the library into a one-line error and exit code 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ValueError as err:
            print(f"jaxscale calc {args.calc_name}: error: {err}", file=sys.stderr)
            return 2

    return run


def gb(num_bytes: float) -> float:
    return num_bytes / 1e9
