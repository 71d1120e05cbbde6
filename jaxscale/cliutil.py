"""argparse flags generated from frozen config dataclasses (`--d-model 64`, `--remat`)."""

from __future__ import annotations

import argparse
import dataclasses


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One flag per field, defaulting to None so only the flags given override a base config."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)]
        if kind is bool:
            action = argparse.BooleanOptionalAction
            parser.add_argument(
                flag, dest=f.name, default=None, action=action, help=f"(default {f.default})"
            )
        else:
            metavar = kind.__name__.upper()
            parser.add_argument(
                flag,
                dest=f.name,
                type=kind,
                default=None,
                metavar=metavar,
                help=f"(default {f.default})",
            )


def overrides(args: argparse.Namespace, cls) -> dict:
    """The fields of `cls` that were given on the command line."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}
