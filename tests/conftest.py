"""Test-session edge: 8 simulated CPU devices, set before any jax backend initialises.

The suite compares values, not speed, so XLA's slower optimisation passes are switched off
(as flax's own example tests do): compiles are ~1.5x faster and results stay within the stated
tolerances; on the jax 0.10 line XLA:CPU's older kernel emitters halve compile time again
(`compat.fast_compile_xla_flags`). The environment variables carry the settings into the
subprocesses the tests start (experiments, launched processes). A test that measures compiled
memory or timings can switch them back on locally.
"""

import os
import sys

from jaxscale import compat as _compat  # imports no jax
from jaxscale import devices as _devices  # imports no jax

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "true")
_compat.use_fast_compile_xla_flags()
_devices.patient_rendezvous()
_devices.collective_threads()
# One persistent compilation cache for the session's workers and the subprocesses they start:
# a program compiled by one (the single-device reference, an experiment's step) is read by the
# others instead of compiled again; it pays on reruns on one machine. Under .cache/ (ignored by
# git). CI sets JAXSCALE_NO_COMPILE_CACHE (.ci/run): jax 0.10.2 once crashed a worker (SIGSEGV)
# serializing a pipelined step into the cache, so there the workers compile without it and only
# the subprocesses the tests start share it (a resumed run, the seeds of one RLHF run, a command
# run once stopped and once to the end: the same programs in fresh processes).
_CACHE_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache")
_WORKERS_CACHE = not os.environ.get("JAXSCALE_NO_COMPILE_CACHE")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_CACHE_ROOT, "jax"))

# plain helper modules the suites import: the fuzz harness (tests/cli_fuzz.py), the serving
# tests' engine driver (tests/engine_drive.py)
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))
jax.config.update("jax_disable_most_optimizations", True)
if not _WORKERS_CACHE:  # the environment keeps it for the subprocesses
    jax.config.update("jax_compilation_cache_dir", None)


# --- how much of the suite is compiling, and what the cache saved ----------------------------
# Each process (an xdist worker, or pytest alone) counts its compiles and the persistent cache's
# hits; the process that prints the summary adds them up. Subprocesses are not counted.
import json  # noqa: E402
from collections import Counter  # noqa: E402

import pytest  # noqa: E402
from planted import plant_extra_pmean  # noqa: E402

_STATS: Counter = Counter()
_STATS_DIR = os.path.join(_CACHE_ROOT, "suite-stats")


def _event(event: str, **_) -> None:
    if event.startswith("/jax/compilation_cache/"):
        _STATS[event.rsplit("/", 1)[1]] += 1


def _duration(event: str, seconds: float, **_) -> None:
    if event in (
        "/jax/core/compile/backend_compile_duration",
        "/jax/compilation_cache/compile_time_saved_sec",
    ):
        _STATS[event.rsplit("/", 1)[1] + "_s"] += seconds
        _STATS[event.rsplit("/", 1)[1] + "_n"] += 1


jax.monitoring.register_event_listener(_event)
jax.monitoring.register_event_duration_secs_listener(_duration)


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller: a fresh tally
        for name in os.listdir(_STATS_DIR) if os.path.isdir(_STATS_DIR) else ():
            os.remove(os.path.join(_STATS_DIR, name))


def pytest_sessionfinish(session):
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    os.makedirs(_STATS_DIR, exist_ok=True)
    with open(os.path.join(_STATS_DIR, f"{worker}.json"), "w") as f:
        json.dump(dict(_STATS), f)


def pytest_terminal_summary(terminalreporter):
    total: Counter = Counter()
    for name in os.listdir(_STATS_DIR) if os.path.isdir(_STATS_DIR) else ():
        with open(os.path.join(_STATS_DIR, name)) as f:
            total.update(json.load(f))
    requests, compiles = total["compile_requests_use_cache"], total["backend_compile_duration_n"]
    if compiles:
        seconds = total["backend_compile_duration_s"]
        line = f"XLA: {compiles:.0f} compiles took {seconds:.0f} s in the test processes"
        if requests and _WORKERS_CACHE:
            hits = total["cache_hits"]
            line += (
                f"; persistent cache: {hits} hits of {requests} requests ({hits / requests:.0%}), "
                f"{total['compile_time_saved_sec_s']:.0f} s of compiling saved"
            )
        terminalreporter.write_line(line)


@pytest.fixture
def extra_pmean(monkeypatch):
    """Manual DP with the classic extra-pmean bug planted (its gradients N x the mean)."""
    plant_extra_pmean(monkeypatch)
