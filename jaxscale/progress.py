"""A dependency-free progress bar for long work (training, benchmarks).

On a terminal it redraws one line on stderr; in a log (not a tty) it prints a line every
`every` updates, so CI output stays readable.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """`eta`: estimate the time left from the rate of the items finished after the first (the
    first carries the start-up: imports, compiles a later item reuses); `eta=False` for work whose
    items differ too much in cost for any rate to predict the rest (shows the elapsed time)."""

    def __init__(
        self, total: int, desc: str = "", enabled: bool = True, every: int = 0, eta: bool = True
    ):
        self.total, self.desc, self.enabled, self.eta = max(total, 1), desc, enabled, eta
        self.n, self.start, self.note = 0, time.perf_counter(), ""
        self.first: tuple[int, float] | None = None  # (items, time) at the first update
        self.tty = sys.stderr.isatty()
        self.every = every or max(self.total // 10, 1)

    def update(self, n: int = 1, note: str = "") -> None:
        self.n += n
        self.note = note or self.note
        if self.first is None:
            self.first = (self.n, time.perf_counter())
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
        now = time.perf_counter()
        elapsed = now - self.start
        bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
        line = (
            f"{self.desc} [{bar}] {self.n}/{self.total} {elapsed:5.1f}s{self._eta(now)} {self.note}"
        )
        end = "" if self.tty and self.n < self.total else "\n"
        sys.stderr.write(("\r" if self.tty else "") + line[:160] + end)
        sys.stderr.flush()

    def _eta(self, now: float) -> str:
        if not self.eta:
            return ""
        if self.n >= self.total:
            return " eta   0.0s"
        n0, t0 = self.first
        if self.n <= n0:  # one rate point: nothing to extrapolate from yet
            return " eta     ?"
        return f" eta {(now - t0) / (self.n - n0) * (self.total - self.n):5.1f}s"

    def close(self) -> None:
        if self.enabled and self.tty and self.n < self.total:
            sys.stderr.write("\n")
