"""Test-session edge: 8 simulated CPU devices, set before any jax backend initialises.

The suite compares values, not speed, so XLA's slower optimisation passes are switched off
(as flax's own example tests do): compiles are ~1.5x faster and results stay within the stated
tolerances. The environment variable carries the setting into the subprocesses the tests start
(experiments, launched processes). A test that measures compiled memory or timings can switch
them back on locally.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "true")
# One persistent compilation cache for the session's workers and the subprocesses they start:
# a program compiled by one (the single-device reference, an experiment's step) is read by the
# others instead of compiled again. Under .cache/ (ignored by git); CI starts with it empty.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax"),
)

# the fuzz harness (tests/cli_fuzz.py) is a plain module the fuzz suites import
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))
jax.config.update("jax_disable_most_optimizations", True)
