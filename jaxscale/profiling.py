"""`--profile DIR`: a jax.profiler trace of a window of steps after warm-up (the first step
compiles, so it is never in the window), then the window's time split, read back from the
trace (analysis/trace.py) and written beside it as profile.json.

A loop calls `window.before(s, state)` before dispatching step s and `window.after(s, state)`
after it; both block on `state` at the window's edges only, so the steps inside run as they
would unprofiled (dispatched ahead, read late).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jax

from jaxscale.analysis import trace

HOW_TO_OPEN = (
    "open it with `tensorboard --logdir {dir}` (pip install 'jaxscale[profile]': the profile "
    "plugin) or load {perfetto} at ui.perfetto.dev"
)


@dataclass
class ProfileWindow:
    directory: str | None  # None: no profile
    first: int  # the first profiled step
    steps: int
    active: bool = False

    @property
    def last(self) -> int:
        return self.first + self.steps - 1

    def before(self, s: int, state) -> None:
        if self.directory and s == self.first:
            jax.block_until_ready(state)  # the steps before stay out of the window
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
            self.active = True

    def after(self, s: int, state, program=None) -> dict | None:
        """The window's summary (trace.summary, plus where the trace is) after its last step;
        `program`: a callable giving the step's compiled HLO text, or None."""
        if not (self.active and s == self.last):
            return None
        jax.block_until_ready(state)
        return self.stop(program)

    def stop(self, program=None) -> dict | None:
        """End the trace (after its last step, or when the loop stops early) and read it."""
        if not self.active:
            return None
        jax.profiler.stop_trace()
        self.active = False
        return report(self.directory, self.steps, program() if program else None)


def compiled_text(fn, *args) -> str | None:
    """The HLO text of jitted `fn` at `args` (already compiled: a cache hit), or None for a
    step that is not one jitted program."""
    lower = getattr(fn, "lower", None)
    return lower(*args).compile().as_text() if lower else None


class StepWindow:
    """A trace of `steps` steps of a loop that runs several programs (a serving engine's
    prefills and decodes), begun at the first step it is told of: `step()` after each one;
    the report, printed by `say`, covers every program's ops (trace.ALL)."""

    def __init__(self, directory: str, steps: int, say, unit: str = "engine step"):
        self.directory, self.steps, self.say, self.unit = directory, steps, say, unit
        self.done = 0
        self.summary: dict | None = None

    def step(self, state) -> None:
        if self.summary is not None:
            return
        if self.done == 0:
            jax.block_until_ready(state)
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
        self.done += 1
        if self.done > self.steps:  # the window holds the steps after the first one seen
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.summary = report(self.directory, self.steps, module=trace.ALL)
            self.say(describe(self.summary, self.directory, self.unit))

    def finish(self, state) -> None:
        """The loop ended inside the window: the trace holds the steps after the first, if any."""
        if self.summary is not None or self.done == 0:
            return
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
        self.summary = {}
        if self.done > 1:
            self.summary = report(self.directory, self.done - 1, module=trace.ALL)
            self.say(describe(self.summary, self.directory, self.unit))


def report(
    directory: str, steps: int, hlo_text: str | None = None, module: str | None = None
) -> dict:
    """The newest trace under `directory` read back: trace.summary with the paths added,
    written to DIRECTORY/profile.json. With the step's `hlo_text`, its module and opcodes
    pick and classify the ops; else the module with the most op time and the op names."""
    path = trace.trace_file(directory)
    ops = trace.read_ops(path)
    opcodes = None
    if hlo_text:
        module, opcodes = trace.program_opcodes(hlo_text)
        if not any(op.module == module for op in ops):
            module = None  # a name the runtime spells otherwise: the busiest module
    module = module or trace.step_module(ops)
    out = trace.summary(trace.device_times(ops, steps, module, opcodes))
    perfetto = sorted(path.parent.glob("*.trace.json.gz"))
    out["trace"] = str(path)
    out["perfetto"] = str(perfetto[-1]) if perfetto else None
    out["module"] = module
    Path(directory, "profile.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def describe(summary: dict, directory: str, unit: str = "step") -> str:
    """Lines for the console: the split, where the trace is, how to open it."""
    how = HOW_TO_OPEN.format(dir=directory, perfetto=summary["perfetto"] or "the trace")
    split = trace.format_summary(summary, unit)
    return f"profile: {split}\nprofile: {summary['trace']}; {how}"
