"""The process edge after a stop (`jaxscale.stopping`): a Ctrl-C that arrives while a stopped
process is ending still ends it with 130, not by the signal. The interpreter's teardown puts
SIGINT back to its default; the child below sends itself that Ctrl-C from an object destroyed
in the teardown, which is where a run's jax objects are destroyed."""

import signal
import subprocess
import sys

import pytest

CHILD = """
import os, signal, sys, threading
from jaxscale.stopping import end_process, stop_on_signal

class SecondCtrlC:  # destroyed in the interpreter's teardown, if there is one
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(2)

keep = SecondCtrlC()
with stop_on_signal("stopping", "aborting") as stop:
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.wait(10)
print("stopped, saved", flush=True)
{ending}
"""


@pytest.mark.parametrize(
    "ending, rc",
    [("end_process(130)", 130), ("sys.exit(130)", -signal.SIGINT)],
    ids=["end_process", "plain exit (what it mends)"],
)
def test_a_ctrl_c_while_a_stopped_process_ends(ending, rc):
    # SIGINT at its default in the child, as at a terminal (a background job inherits it ignored)
    child = CHILD.format(ending=ending)
    prelude = "import signal; signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + child], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == rc, done.stderr
    assert "stopped, saved" in done.stdout
    assert "Traceback" not in done.stderr
