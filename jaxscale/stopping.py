"""Stopping a long run from the keyboard: the first Ctrl-C (or SIGTERM) asks the run to stop at
its next safe point, a second Ctrl-C ends the process at once with 130.

A thread watches the signals through `signal.set_wakeup_fd`, whose C-level handler writes each
one to a pipe at once: so the first is acknowledged, and the second obeyed, even while the main
thread is inside a compile or a compiled program (where a Python handler would wait, and an
exception raised into jax's C++ code could crash the process).

Once a stop was asked, the watcher outlives the block: the run then saves, reports and exits,
and a Ctrl-C during that (or during the interpreter's teardown, where jax clears its backends)
still ends the process at once with 130 (without the abort note: what the stop kept is kept),
instead of a KeyboardInterrupt traceback. The interpreter's own teardown is where that promise
would break: it freezes the watcher's thread and puts SIGINT back to its default, so a Ctrl-C
there killed the process by the signal (exit -2) while jax's objects were being destroyed. So a
process that was stopped leaves through `end_process`: the exit handlers run with the watcher
still listening, then the process ends without the teardown (everything a run keeps is written
and closed by then).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import NoReturn

_STOPPED = threading.Event()  # a stop was asked in this process: it ends through `end_process`


@contextmanager
def stop_on_signal(stop_note: str, abort_note: str):
    """Yield a `threading.Event` that SIGINT/SIGTERM set (printing `stop_note`); a second Ctrl-C
    prints `abort_note` and exits 130. Handlers can only be installed from the main thread;
    elsewhere the event is never set."""
    stop, ended = threading.Event(), threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    watcher = threading.Thread(
        target=_watch, args=(read_fd, stop, ended, stop_note, abort_note), daemon=True
    )
    old = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watcher.start()
    try:
        yield stop
    finally:
        ended.set()
        if not stop.is_set():  # no stop asked: the handlers as they were, the watcher ended
            signal.set_wakeup_fd(old_fd)
            for sig, h in old.items():
                signal.signal(sig, h)
            os.write(write_fd, b"\0")  # no signal is 0: the watcher's cue to end
            watcher.join(timeout=5)
            os.close(write_fd)
            os.close(read_fd)


def _watch(read_fd: int, stop, ended, stop_note: str, abort_note: str) -> None:
    """The signal watcher: acknowledge the first signal, exit 130 on a second Ctrl-C (quietly
    once the block has `ended`: the stop's work is done)."""
    while True:
        for signum in os.read(read_fd, 64):
            if signum == 0:
                return
            if not stop.is_set():
                _STOPPED.set()
                stop.set()
                print(f"\n{stop_note}", file=sys.stderr, flush=True)
            elif signum == signal.SIGINT and ended.is_set():
                os._exit(130)
            elif signum == signal.SIGINT:
                print(abort_note, file=sys.stderr, flush=True)
                os._exit(130)  # at once: no interpreter teardown under running XLA threads


def end_process(rc: int) -> NoReturn:
    """The process edge: exit with `rc`. After a stop, skip the interpreter's teardown (module
    docstring): finish the other non-daemon threads and the exit handlers while a second Ctrl-C
    still reaches the watcher, flush, and `os._exit`."""
    if not _STOPPED.is_set():
        sys.exit(rc)
    for thread in threading.enumerate():
        if not thread.daemon and thread is not threading.current_thread():
            thread.join()
    atexit._run_exitfuncs()  # jax's among them: its backends cleared, a distributed run shut down
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
