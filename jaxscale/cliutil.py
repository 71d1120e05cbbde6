"""Command-line plumbing shared by every subcommand: argparse types that name the bad value,
flags generated from frozen config dataclasses, the common output flags, and the one-line error
wrapper. Pure Python (no jax, nothing else of jaxscale)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path

# --- argparse types ---------------------------------------------------------------------------

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """'124M', '7B', '1.7T', '70e9' -> float (> 0, finite)."""
    match = re.fullmatch(r"\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text, re.I)
    if not match:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 124M, 7B, 70e9)")
    value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _number(text: str, kind, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


INT_MAX = 2**31 - 1  # counts, steps and seeds fit an int32 (jax and numpy take them as such)


def _int(text: str) -> int:
    value = _number(text, int, "an integer")
    if abs(value) > INT_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT_MAX}, got {text!r}")
    return value


def _finite(text: str) -> float:
    value = _number(text, float, "a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def finite_float(text: str) -> float:
    return _finite(text)


def positive_float(text: str) -> float:
    value = _finite(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _finite(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def writable_path(text: str) -> str:
    """A file path that can be written: not a directory, and its nearest existing ancestor is a
    directory a file can be created in (tried: a probe file is created and removed; missing
    parents are created when the file is written)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path")
    if path.exists():
        _probe_append(path)
        return text
    _probe_create(text, path.parent)
    return text


def writable_dir(text: str) -> str:
    """A directory that exists or can be created, and can be written into (tried: a probe
    file is created and removed in it, or in its nearest existing ancestor)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    _probe_create(text, path)
    return text


def _probe_create(text: str, directory: Path) -> None:
    """Create and remove a file in `directory`'s nearest existing ancestor: os.access alone
    says yes to root, and to paths such as /proc/x that refuse every new file."""
    ancestor = directory
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {text}: {ancestor} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".jaxscale-probe-", dir=ancestor)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise argparse.ArgumentTypeError(f"cannot create {text}: {ancestor}: {reason}") from None


def _probe_append(path: Path) -> None:
    try:
        with path.open("a"):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise argparse.ArgumentTypeError(f"cannot write {path}: {reason}") from None


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


def flag_of(f: dataclasses.Field) -> str:
    """A config field's command-line flag: its metadata's, else --field-name."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_dataclass_args(parser, cls, skip: tuple[str, ...] = ()) -> None:
    """One flag per field, with the field's help and choices from its metadata (`config.opt`),
    defaulting to None so only the flags given override a base config; `--flag/--no-flag`
    for booleans. A field whose flag differs from its name also answers to --field-name."""
    kinds = {"int": _int, "float": finite_float, "str": str, "bool": bool}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind, flag = kinds[str(f.type)], flag_of(f)
        help_text = f"{f.metadata.get('help', '')} (default {f.default})".strip()
        if kind is bool:
            action = parser.add_argument(
                flag,
                dest=f.name,
                default=None,
                help=help_text,
                action=argparse.BooleanOptionalAction,
            )
        else:
            choices = f.metadata.get("choices")
            metavar = None if choices else {_int: "INT", finite_float: "FLOAT"}.get(kind, "STR")
            const = f.metadata.get("const")  # the flag alone means `const` (`--remat`: block)
            action = parser.add_argument(
                flag,
                dest=f.name,
                type=kind,
                default=None,
                choices=choices,
                metavar=metavar,
                help=help_text + (f"; {flag} alone: {const}" if const is not None else ""),
                **({"nargs": "?", "const": const} if const is not None else {}),
            )
        plain = "--" + f.name.replace("_", "-")
        if plain != flag:
            hidden_alias(parser, action, plain)


def overrides(args: argparse.Namespace, cls) -> dict:
    """The fields of `cls` that were given on the command line."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


def build_config(cls, args: argparse.Namespace, base=None):
    """`cls` (or `base` with the given flags replaced) from the command line; a validation error
    comes back naming the flags, not the fields ("--layers must be ...")."""
    try:
        changes = overrides(args, cls)
        return dataclasses.replace(base, **changes) if base is not None else cls(**changes)
    except ValueError as e:
        raise ValueError(flag_names(str(e), cls)) from None


_JSON_KINDS = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": (
        "a finite number",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
    ),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
}


def check_section(where: str, values, kinds: dict, choices: dict | None = None) -> None:
    """One section of a config file, field by field as its flags would take it: an object,
    known keys, each value of its field's kind ("int", "float", "str", "bool"; "int?" and
    "str?" also take null) and among its choices. The error names the key and the value."""
    if not isinstance(values, dict):
        raise ValueError(f"{where}: expected an object of fields, got {json.dumps(values)}")
    for key, value in values.items():
        if key not in kinds:
            raise ValueError(f"{where}: unknown field {key!r} (known: {', '.join(kinds)})")
        kind = kinds[key]
        if kind.endswith("?") and value is None:
            continue
        word, ok = _JSON_KINDS[kind.rstrip("?")]
        if not ok(value):
            raise ValueError(f"{where}.{key}: expected {word}, got {json.dumps(value)}")
        allowed = (choices or {}).get(key)
        if allowed and value not in allowed:
            raise ValueError(f"{where}.{key}: {value!r} is not one of {', '.join(allowed)}")


def dataclass_kinds(cls) -> tuple[dict, dict]:
    """(kinds, choices) of a config dataclass's fields, for `check_section`."""
    fields = dataclasses.fields(cls)
    choices = {f.name: f.metadata["choices"] for f in fields if f.metadata.get("choices")}
    return {f.name: str(f.type) for f in fields}, choices


def flag_names(message: str, cls) -> str:
    """Replace the field names in a config's error message by their flags."""
    for f in sorted(dataclasses.fields(cls), key=lambda f: -len(f.name)):
        message = re.sub(rf"(?<![\w-]){f.name}\b", flag_of(f), message)
    return message


def hidden_alias(parser, action: argparse.Action, *old_flags: str) -> None:
    """Accept `old_flags` as a spelling of `action`'s flag without listing them in --help (one
    flag name per quantity across commands; the old spellings keep working)."""
    kw = {"dest": action.dest, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
    if action.nargs == 0:  # a switch
        parser.add_argument(*old_flags, action="store_const", const=action.const, **kw)
    else:
        parser.add_argument(
            *old_flags,
            type=action.type,
            choices=action.choices,
            nargs=action.nargs,
            metavar=action.metavar,
            **kw,
        )


# --- output flags and errors ------------------------------------------------------------------


def add_output_flags(p: argparse.ArgumentParser, *, plot: bool = False, faithful: bool = False):
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    if plot:
        p.add_argument("--plot", metavar="PATH", type=writable_path, help="write the plot as a PNG")
    if faithful:
        p.add_argument(
            "--seed-faithful",
            action="store_true",
            help="reproduce the seed's printed (defective) numbers instead of the corrected ones",
        )


def command_name(args: argparse.Namespace) -> str:
    """'calc kv', 'simulate pipeline', 'advise' ... from the parsed subcommands."""
    parts = [
        getattr(args, "command", None),
        getattr(args, "calc_name", None),
        getattr(args, "sim_name", None),
    ]
    return " ".join(p for p in parts if p)


def fail(command: str, message) -> int:
    """Print the one-line error every command gives for bad input, and return its exit code 2."""
    print(f"jaxscale {command}: error: {message}", file=sys.stderr)
    return 2


def check_implied(flag: str, value, paths) -> None:
    """The paths a directory flag implies ((writable_dir or writable_path, path) pairs: the
    files and folders a command will write inside it), probed as the flag itself was, before
    anything compiles: a bad one is the flag's error."""
    for check, path in paths:
        try:
            check(str(path))
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{flag} {value}: {e}") from None


def guarded(handler, *errors: type[Exception]):
    """Turn a ValueError from the library, or any of `errors` (the user-input errors that are
    not ValueErrors, e.g. a CheckpointError), into a one-line error and exit code 2. A handler
    that imports `errors` lazily calls `guarded(body, SomeError)(args)` from inside itself."""
    caught = (ValueError, *errors)

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except caught as err:
            return fail(command_name(args), err)

    return run


_COUNT_UNITS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


class HelpFormatter(argparse.HelpFormatter):
    """--help that states each flag's default once: "(default 8)" is appended unless the help
    already says "default" or there is none to state; indented lines (examples) stay as written."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if action.nargs == 0 or "default" in text or default in (None, argparse.SUPPRESS):
            return text
        if isinstance(default, list | tuple):
            default = ",".join(map(str, default))
        elif action.type is parse_count:  # as it is typed: 70B, not 7e+10
            scale, unit = next(((s, u) for s, u in _COUNT_UNITS if default >= s), (1, ""))
            default = f"{default / scale:g}{unit}"
        elif isinstance(default, float):
            default = f"{default:g}"
        return f"{text} (default {str(default).replace('%', '%%')})".lstrip()

    def _fill_text(self, text, width, indent):
        return "\n".join(
            indent + line
            if line.startswith(" ")
            else super(HelpFormatter, self)._fill_text(line, width, indent)
            for line in text.splitlines()
        )


def add_command(sub, name: str, *, help: str, description: str, example: str, **kw):
    """A subcommand's parser, its --help formatted by `HelpFormatter` and ending with an example
    command line."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        formatter_class=HelpFormatter,
        epilog=f"example:\n  {example}",
        **kw,
    )
