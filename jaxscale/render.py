"""The render layer: a command builds its records once; the text tables, the `--json` object and
the plots all come from those records.

    report = Report("calc kv")
    report.mode(args.seed_faithful, "seed 002's 2x KV figure")
    report.say("KV cache per token, bf16")
    report.table("models", [Col("name", "model"), Col("kv_bytes", "KV/token", fmt_bytes)], rows)
    report.put(total=total)             # JSON only
    report.emit(args)                   # --json: one object; else the text

Pure Python: no jax and nothing else of jaxscale, so `jaxscale calc` and `jaxscale simulate` start
instantly. matplotlib is imported only when a figure is drawn (`figure`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --- units ------------------------------------------------------------------------------------

_DECIMAL = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"))
_BINARY = ((1 << 50, "PiB"), (1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def fmt_bytes(n: float, *, binary: bool = False, digits: int = 1) -> str:
    """1.5e9 -> '1.5 GB' (decimal, as the seeds print memory); binary=True -> KiB/MiB/GiB."""
    if n == 0:
        return "0 B"
    for scale, unit in _BINARY if binary else _DECIMAL:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.{digits}f} B" if binary else f"{n / 1e3:.{digits}f} KB"


def fmt_count(n: float) -> str:
    """7e9 -> '7.0B', 124e6 -> '124M', 1.7e12 -> '1.7T' (seed 000's format_params)."""
    if n >= 1e12:
        return f"{n / 1e12:.1f}T"
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


def fmt_mark(ok: bool | None) -> str:
    """✓ / ✗, or 'n/a' where nothing was checked."""
    return "n/a" if ok is None else ("✓" if ok else "✗")


Format = str | Callable[[Any], str]


def fmt_cell(value: Any, fmt: Format = "") -> str:
    """One cell: None -> '-', a format spec ('.2f', ',') or a function of the value."""
    if value is None:
        return "-"
    if callable(fmt):
        return fmt(value)
    return format(value, fmt)


# --- tables -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A table column: the record field it shows, its header, and how a value is written."""

    key: str
    head: str
    fmt: Format = ""


def grid(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, label_column=True) -> str:
    """Aligned text table of ready cells: the first column left-aligned (labels), the others
    right-aligned, two spaces apart, a dashed rule under the header."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 and label_column else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    rule = "-" * len(line(cells[0]))
    return "\n".join([line(cells[0]), rule] + [line(row) for row in cells[1:]])


def table(cols: Sequence[Col], records: Sequence[dict], *, label_column=True) -> str:
    """Text table of records: one row per record, one column per `Col`."""
    rows = [[fmt_cell(r.get(c.key), c.fmt) for c in cols] for r in records]
    return grid([c.head for c in cols], rows, label_column=label_column)


# --- a command's output -----------------------------------------------------------------------


def mode_line(seed_faithful: bool, what: str) -> str:
    if seed_faithful:
        return f"mode: seed-faithful — reproduces {what}"
    return f"mode: corrected (--seed-faithful reproduces {what})"


class Report:
    """One command's output. Records go into `data` (the --json object) and are rendered into
    `lines` (the text) by the same call, so the two cannot disagree."""

    def __init__(self, command: str, **fields):
        self.data: dict[str, Any] = {"command": command, **fields}
        self.lines: list[str] = []

    def mode(self, seed_faithful: bool, what: str) -> Report:
        """The corrected/seed-faithful line (text) and "mode" (JSON)."""
        self.data["mode"] = "seed-faithful" if seed_faithful else "corrected"
        self.lines.append(mode_line(seed_faithful, what))
        return self

    def say(self, *lines: str) -> Report:
        """Prose: text only."""
        self.lines.extend(lines)
        return self

    def put(self, **fields) -> Report:
        """JSON only (values the text states in prose, or does not show)."""
        self.data.update(fields)
        return self

    def table(
        self,
        key: str | None,
        cols: Sequence[Col],
        records: Sequence[dict],
        *,
        title: str | None = None,
        label_column: bool = True,
    ) -> list[dict]:
        """Render `records` as a table and store them under `key` in the JSON (None: text only,
        for a table whose records the JSON already holds in another shape)."""
        records = list(records)
        if key is not None:
            self.data[key] = records
        if title:
            self.lines.append(title)
        self.lines.append(table(cols, records, label_column=label_column))
        return records

    def text(self) -> str:
        return "\n".join(self.lines)

    def json(self) -> str:
        return json.dumps(self.data, sort_keys=False)

    def emit(self, args_or_json) -> None:
        """Print one JSON object (`--json`) or the text."""
        as_json = getattr(args_or_json, "json", args_or_json)
        print(self.json() if as_json is True else self.text())


# --- plots ------------------------------------------------------------------------------------


@contextmanager
def figure(
    path: str | Path, nrows: int = 1, ncols: int = 1, *, figsize=(10, 5), dpi=100, rect=(0, 0, 1, 1)
):
    """`with figure(path, 1, 2) as (fig, axes):` draw; the PNG is written (parent directories
    created, tight layout within `rect`, e.g. (0, 0, 1, 0.95) to keep a figure legend clear)
    when the block ends. matplotlib is imported here only."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=figsize)
    try:
        yield fig, axes
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout(rect=rect)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def strict(value):
    """`value` with every non-finite float as null, so it dumps as strict JSON (a bare NaN is
    not JSON, and most readers other than Python's refuse it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    return value


def json_line(record: dict) -> str:
    """One metrics line: strict JSON, non-finite values as null."""
    return json.dumps(strict(record), allow_nan=False)
