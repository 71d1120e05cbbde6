"""Platform facts and `jaxscale doctor`.

Never sets the device count: that is decided at process edges (Makefile, tests/conftest.py,
`python -m jaxscale`). Library code reads jax.devices() and never assumes 8.
"""

from __future__ import annotations

import json
import os
import platform

from jaxscale.hardware import peak_flops


def mfu(model_flops_per_device: float, step_s: float, device_kind: str) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's peak (jaxscale/hardware.py);
    None when the peak is unknown (CPU), so MFU is never reported for simulated devices."""
    peak = peak_flops(device_kind)
    if peak is None or not step_s > 0:
        return None
    return model_flops_per_device / step_s / peak


DEFAULT_CPU_DEVICES = 8
# `jaxscale verify`'s default: its largest case's mesh (four axes of size 2); the other cases
# run on the first devices of it
VERIFY_CPU_DEVICES = 16
# set by the process edge (`jaxscale.cli.main`) when it chose the CPU device count itself
DEFAULTED = "JAXSCALE_DEFAULTED_CPU_DEVICES"


def default_cpu_devices(n: int = DEFAULT_CPU_DEVICES) -> None:
    """The process edge's default: n (8) simulated CPU devices when the user set no count. Only
    the CPU backend reads it, so a GPU or TPU host still uses its accelerators."""
    if "JAX_NUM_CPU_DEVICES" not in os.environ and "device_count" not in os.environ.get(
        "XLA_FLAGS", ""
    ):
        os.environ["JAX_NUM_CPU_DEVICES"] = str(n)
        os.environ[DEFAULTED] = "1"


# XLA:CPU aborts the process when a collective's rendezvous waits longer than this (its default,
# 40 s). Simulated devices are threads sharing the host's cores: on a loaded 2-core host one of
# them can be held up that long while its peers wait, and the abort then kills a healthy run
# (docs/pipeline.md, "Collective order on XLA:CPU"). XLA still warns after 20 s, naming the
# rendezvous, so a true hang shows at once; it is ended after 5 minutes instead of 40 s.
RENDEZVOUS_TIMEOUT_S = 300


def patient_rendezvous() -> None:
    """Raise XLA:CPU's rendezvous abort timeout in XLA_FLAGS unless the user set one (process
    edges only, before jax starts its backend; child processes inherit it)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_collective_call_terminate_timeout_seconds" not in flags:
        timeout = f"--xla_cpu_collective_call_terminate_timeout_seconds={RENDEZVOUS_TIMEOUT_S}"
        os.environ["XLA_FLAGS"] = f"{flags} {timeout}".strip()


# XLA:CPU runs a program's thunks, collectives included, on one intra-op thread pool shared by all
# simulated devices, of max(host cores, devices) threads, and a collective holds its thread until
# every participant arrives. Collectives start in program order, but a conditional (or loop)
# counts as started while its body waits for a thread, so a device can enter the next collective
# before the one inside the branch: with one thread a device, the eight threads can all end up
# waiting, in a collective-permute and in an all-reduce whose last member waits for a thread,
# and the process aborts (docs/pipeline.md, "Collective order on XLA:CPU"). Two threads a device
# leave a thread for each device's second collective; XLA sizes its pools from PJRT_NPROC.
THREADS_PER_DEVICE = 2
THREADS_SET = "JAXSCALE_SET_PJRT_NPROC"  # the PJRT_NPROC a process edge chose (a child may resize)


def collective_threads() -> None:
    """Size XLA:CPU's thread pools at THREADS_PER_DEVICE x the simulated devices (process edges,
    before jax starts its backend), unless the user chose a size (PJRT_NPROC or NPROC) or the
    host's cores already give as many."""
    chosen = os.environ.get(THREADS_SET)
    ours = chosen is not None and chosen == os.environ.get("PJRT_NPROC")  # a parent edge's
    if not ours and ("PJRT_NPROC" in os.environ or "NPROC" in os.environ):
        return
    try:
        devices = int(os.environ.get("JAX_NUM_CPU_DEVICES", ""))
    except ValueError:
        return
    threads = THREADS_PER_DEVICE * devices
    if devices > 1 and threads > (os.cpu_count() or 1):
        os.environ["PJRT_NPROC"] = os.environ[THREADS_SET] = str(threads)


def simulated_process(n: int = DEFAULT_CPU_DEVICES) -> None:
    """A process edge outside the command line (an experiment, a notebook's kernel), before jax
    is imported: n simulated CPU devices unless the user set a count, XLA's patient rendezvous
    and its collective threads, as `jaxscale.cli.main` sets them."""
    default_cpu_devices(n)
    patient_rendezvous()
    collective_threads()


def cpu_devices_error() -> str | None:
    """What is wrong with a JAX_NUM_CPU_DEVICES the user set (jax would raise deep inside its
    start-up, or take -3 as 1), or None."""
    text = os.environ.get("JAX_NUM_CPU_DEVICES")
    if text is None or os.environ.get(DEFAULTED):
        return None
    try:
        ok = int(text) >= 1
    except ValueError:
        ok = False
    if ok:
        return None
    return f"JAX_NUM_CPU_DEVICES={text}: expected a positive integer (simulated CPU devices)"


def describe_devices() -> str:
    """'8 x cpu (simulated: ...)' -- how many devices this run has, and why."""
    import jax

    n, kind = jax.device_count(), jax.devices()[0].device_kind
    procs = f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""
    if jax.default_backend() != "cpu":
        return f"{n} x {kind}{procs}"
    if os.environ.get(DEFAULTED):
        why = "jaxscale's default on CPU; set JAX_NUM_CPU_DEVICES to choose"
    elif "JAX_NUM_CPU_DEVICES" in os.environ:
        why = f"JAX_NUM_CPU_DEVICES={os.environ['JAX_NUM_CPU_DEVICES']}"
    else:
        why = "XLA_FLAGS" if "device_count" in os.environ.get("XLA_FLAGS", "") else "one CPU"
    return f"{n} x cpu{procs} (simulated devices: {why})"


def fake_cpu_devices_active() -> bool:
    """True when the CPU backend was asked for several simulated devices."""
    import jax

    flag = "--xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    requested = int(os.environ.get("JAX_NUM_CPU_DEVICES", "1") or 1) > 1
    cpu = jax.default_backend() == "cpu"
    return cpu and (flag or requested or jax.local_device_count() > 1)


def psum_smoke_test() -> tuple[int, int]:
    """psum of (device index + 1) over every device; returns (measured, closed form N(N+1)/2).

    Built as a 1-D mesh over all devices (all processes), so in a multi-process run the sum
    crosses process boundaries: one all-reduce over the whole machine set.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType

    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("all",), axis_types=(AxisType.Explicit,))

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=(), out_specs=jax.P())
    def total():
        return jax.lax.psum(jax.lax.axis_index("all") + 1, "all")  # one all-reduce

    out = total()
    measured = int(jnp.asarray(out.addressable_shards[0].data))
    return measured, n * (n + 1) // 2


def doctor_report() -> dict:
    import flax
    import jax
    import jaxlib

    devices = jax.devices()
    kinds = sorted({d.device_kind for d in devices})
    measured, expected = psum_smoke_test()
    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "backend": jax.default_backend(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "device_kinds": kinds,
        "devices": [str(d) for d in jax.local_devices()],
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "fake_cpu_devices": fake_cpu_devices_active(),
        "peak_bf16_flops": {k: peak_flops(k) for k in kinds},
        "psum_smoke": {"measured": measured, "expected": expected, "ok": measured == expected},
    }


def doctor_main(args) -> int:
    report = doctor_report()
    if getattr(args, "json", False):
        print(json.dumps(report))
    else:
        width = max(len(k) for k in report)
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
        smoke = report["psum_smoke"]
        verdict = "ok" if smoke["ok"] else "FAILED"
        n = report["device_count"]
        print(
            f"psum over {n} devices of (index+1) = {smoke['measured']}; "
            f"closed form N(N+1)/2 = {smoke['expected']}: {verdict}"
        )
    return 0 if report["psum_smoke"]["ok"] else 1
