"""A dependency-free progress bar for long work (training, benchmarks).

On a terminal it redraws one line on stderr; in a log (not a tty) it prints a line every
`every` updates, so CI output stays readable.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, desc: str = "", enabled: bool = True, every: int = 0):
        self.total, self.desc, self.enabled = max(total, 1), desc, enabled
        self.n, self.start, self.note = 0, time.perf_counter(), ""
        self.tty = sys.stderr.isatty()
        self.every = every or max(self.total // 10, 1)

    def update(self, n: int = 1, note: str = "") -> None:
        self.n += n
        self.note = note or self.note
        if self.enabled and (self.tty or self.n % self.every == 0 or self.n == self.total):
            self._draw()

    def write(self, line: str) -> None:
        """Print a result line on stdout as it comes, with the bar (on a terminal) out of its
        way: cleared first, redrawn after."""
        drawn = self.enabled and self.tty and self.n
        if drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        print(line, flush=True)
        if drawn and self.n < self.total:
            self._draw()

    def _draw(self) -> None:
        frac = min(self.n / self.total, 1.0)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
        line = (
            f"{self.desc} [{bar}] {self.n}/{self.total} {elapsed:5.1f}s eta {eta:5.1f}s {self.note}"
        )
        end = "" if self.tty and self.n < self.total else "\n"
        sys.stderr.write(("\r" if self.tty else "") + line[:160] + end)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self.n < self.total:
            sys.stderr.write("\n")
