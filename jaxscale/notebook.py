"""What the notebooks need (notebooks/tour.py): the runtime, read before jax is imported, and
jaxscale commands run on 8 simulated CPU devices in a subprocess.

A Colab TPU or GPU runtime has fewer accelerators than the 8-way mesh demos need (the free tier
is one TPU v5e chip). The kernel keeps the accelerator for what fits on it (the single-device
reference, training, AOT compiles for larger TPU topologies); each mesh demo runs as
`python -m jaxscale ...` in a child process whose jax sees 8 CPU devices only, so the kernel's
TPU backend is never initialised twice or shared. On a CPU runtime the kernel itself gets 8
simulated devices. No jax import here: `detect` must run before jax picks its backend.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from jaxscale.devices import simulated_process

SIMULATED = 8  # devices of the mesh demos


@dataclass(frozen=True)
class Runtime:
    kind: str  # "tpu", "gpu" or "cpu": what jax will pick by default
    colab: bool
    why: str  # what was seen

    def describe(self) -> str:
        where = "Colab" if self.colab else "local"
        if self.kind == "cpu":
            return (
                f"{where} CPU runtime ({self.why}): everything runs on {SIMULATED} simulated "
                "CPU devices"
            )
        return (
            f"{where} {self.kind.upper()} runtime ({self.why}): single-device work on the "
            f"{self.kind.upper()}, mesh demos on {SIMULATED} simulated CPU devices in a "
            "subprocess"
        )


def detect() -> Runtime:
    """The runtime from the machine, without importing jax. JAX_PLATFORMS=cpu wins (tests, CI)."""
    colab = "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms == "cpu":
        return Runtime("cpu", colab, "JAX_PLATFORMS=cpu")
    # TPU VMs (Colab's TPU runtimes are TPU VMs) expose the chips as /dev/accel* or vfio devices
    tpu = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    if tpu or "TPU_ACCELERATOR_TYPE" in os.environ:
        return Runtime("tpu", colab, tpu[0] if tpu else "TPU_ACCELERATOR_TYPE")
    if glob.glob("/dev/nvidia[0-9]*") or shutil.which("nvidia-smi"):
        return Runtime("gpu", colab, "NVIDIA device")
    return Runtime("cpu", colab, "no accelerator found")


def prepare_kernel(rt: Runtime) -> None:
    """On a CPU runtime, give this process 8 simulated devices, and XLA:CPU's pools and
    rendezvous sized for them (before jax is imported)."""
    if rt.kind == "cpu":
        if "jax" in sys.modules:
            raise RuntimeError("call prepare_kernel before importing jax")
        simulated_process(SIMULATED)


def simulated_env(n: int = SIMULATED) -> dict[str, str]:
    """The environment of a child process whose jax sees `n` CPU devices and nothing else."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(n), PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)  # a device-count flag there would override the count
    return env


def jaxscale(*args: str, simulated: bool = True, check: bool = True) -> str:
    """Run `python -m jaxscale ARGS` (on simulated CPU devices unless simulated=False), print
    and return its output; a failing command raises with its output, so a notebook stops."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxscale", *args],
        capture_output=True,
        text=True,
        env=simulated_env() if simulated else None,
    )
    # jaxscale's own stderr lines (headers, warnings) first, then the tables
    notes = "".join(line + "\n" for line in proc.stderr.splitlines() if _worth_showing(line))
    out = notes + proc.stdout
    print(out, end="")
    if check and proc.returncode != 0:
        raise RuntimeError(f"jaxscale {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return out


def _worth_showing(line: str) -> bool:
    """stderr lines kept: jaxscale's own headers and warnings; not its progress bars, nor the
    start-up noise libtpu prints on hosts without a TPU."""
    noise = ("TPU", "libtpu", "InitGoogle", "E0000", "W0000", "=== Source", "learning/")
    progress = "] " in line and " eta " in line
    return bool(line.strip()) and not progress and not line.lstrip().startswith(noise)


def show(path: str | Path):
    """An inline image in a notebook (IPython is the kernel's), its path elsewhere."""
    try:
        from IPython.display import Image, display
    except ImportError:  # a plain Python run of the paired script
        print(f"[image] {path}")
        return
    display(Image(filename=str(path)))
