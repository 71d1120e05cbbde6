"""XLA:CPU's collectives and its shared thread pool (`devices.collective_threads`; docs/pipeline.md,
"Collective order on XLA:CPU"). The program below is the smallest form of the pattern that
aborted a user's pipelined run: a branch on the pipe stage holding independent work and an
all-reduce over its tensor group, then a collective-permute across stages of data the branch
does not produce. With one pool thread a device (XLA's own size on a host of up to 8 cores) a
device enters the permute while its branch's all-reduce waits for a thread, every thread ends up
waiting in one of the two, and XLA aborts the process (every try on the reference host); with
the process edge's pool it runs through."""

import os
import subprocess
import sys

import pytest

from jaxscale import devices

PROGRAM = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((2, 4), ("pipe", "tensor"))

def branch(k):
    def f(x):  # a dozen independent products: the branch runs its thunks in parallel
        parts = [jnp.tanh(x @ (x.T * (i + k + 1)) @ x) for i in range(12)]
        return jax.lax.psum(sum(parts), "tensor")
    return f

def body(x, other):
    y = jax.lax.switch(jax.lax.axis_index("pipe"), [branch(0), branch(1)], x)
    z = jax.lax.ppermute(other, "pipe", [(0, 1), (1, 0)])  # needs nothing from the branch
    return y + z.sum(), z

spec = P("pipe", "tensor")
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec)))
sh = NamedSharding(mesh, spec)
for it in range(2000):
    if it % 100 == 0:  # values kept finite
        x = jax.device_put(jnp.full((128, 256), 0.01), sh)
        o = jax.device_put(jnp.ones((128, 256)), sh)
    x, o = f(x, o)
jax.block_until_ready(x)
print("ran 2000 steps")
"""


@pytest.mark.slow
def test_a_permute_beside_a_branchs_all_reduce_runs_with_the_edges_thread_pool(monkeypatch):
    for name in ("PJRT_NPROC", "NPROC", devices.THREADS_SET):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "8")
    devices.collective_threads()
    assert int(os.environ["PJRT_NPROC"]) == devices.THREADS_PER_DEVICE * 8
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    # an abort within seconds instead of the edge's 5 minutes, should the pool starve
    env["XLA_FLAGS"] = "--xla_cpu_collective_call_terminate_timeout_seconds=10"
    r = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert "ran 2000 steps" in r.stdout


def test_a_users_pool_size_is_kept_and_a_parent_edges_is_resized(monkeypatch):
    for name in ("PJRT_NPROC", devices.THREADS_SET):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NPROC", "3")  # the older spelling XLA also reads
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "16")
    devices.collective_threads()
    assert "PJRT_NPROC" not in os.environ  # it would win over the user's NPROC
    monkeypatch.delenv("NPROC")
    monkeypatch.setenv("PJRT_NPROC", "3")
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "16")
    devices.collective_threads()
    assert os.environ["PJRT_NPROC"] == "3"  # the user's
    monkeypatch.setenv(devices.THREADS_SET, "3")  # ... unless an edge above chose it
    devices.collective_threads()
    assert os.environ["PJRT_NPROC"] == str(devices.THREADS_PER_DEVICE * 16)


def test_an_experiments_edge_sets_what_the_command_lines_edge_sets(monkeypatch):
    """`simulated_process` (the experiments' and the notebook kernel's edge): 8 devices when the
    user set none, a user's count kept, and the pools and rendezvous sized as `cli.main` sizes
    them."""
    for name in ("PJRT_NPROC", "NPROC", devices.THREADS_SET, "XLA_FLAGS", devices.DEFAULTED):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    devices.simulated_process()
    assert os.environ["JAX_NUM_CPU_DEVICES"] == "8"
    assert os.environ["PJRT_NPROC"] == str(devices.THREADS_PER_DEVICE * 8)
    assert "xla_cpu_collective_call_terminate_timeout_seconds" in os.environ["XLA_FLAGS"]
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "4")
    monkeypatch.delenv(devices.DEFAULTED)
    devices.simulated_process()
    assert os.environ["JAX_NUM_CPU_DEVICES"] == "4"
    assert os.environ["PJRT_NPROC"] == str(devices.THREADS_PER_DEVICE * 4)
