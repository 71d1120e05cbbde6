"""Compile for a TPU you do not have: ahead-of-time compilation for abstract TPU topologies.

With `libtpu` installed (`pip install -e '.[tpu-aot]'`), `jax.experimental.topologies` describes a
TPU slice such as v5e:2x4 on a CPU-only host as compile-only devices. A mesh over them, abstract
arguments sharded on it and `jit(f).lower(...).compile()` give the TPU compiler's program: its HLO
(the collectives a TPU runs), memory_analysis (tile-padded buffers) and cost_analysis with
`optimal_seconds`. Nothing executes. Targets: "cpu" (the local devices) or "tpu:<gen>:<torus>".
v4 is described in megacore mode (one device per chip, as jax shows a real v4), so tpu:v4:2x2x1
and tpu:v5p:2x2x1 have 4 devices and tpu:v5e:2x4, tpu:v6e:2x4, tpu:v5p:2x2x2 have 8.

libtpu on a CPU host: run with JAX_PLATFORMS=cpu. The first
topology request loads libtpu, which asks the cloud metadata server for this host's TPU type and
workers and, finding none, prints a warning trace to stderr; it also holds /tmp/libtpu_lockfile
for the life of the process, so a second process fails ("Internal error when accessing libtpu
multi-process lockfile"). During that request we set, where unset and no TPU backend is live,
TPU_HOST_BOUNDS=1,1,1 and TPU_WORKER_HOSTNAMES=localhost (one host, no TPU: no lookup, no trace)
and ALLOW_MULTIPLE_LIBTPU_LOAD=1 (no lock); libtpu reads them once, so they are removed after.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
from dataclasses import dataclass
from math import ceil

import jax

from jaxscale import compat
from jaxscale.analysis.compiled import CompiledReport, compile_with_report
from jaxscale.analysis.hlo_text import matching, nbytes

# Generations whose topologies were checked to compile here, with the rank of their torus.
TPU_TORUS_RANK = {"v5e": 2, "v6e": 2, "v4": 3, "v5p": 3}
ACCEPTED_FORMS = (
    "'cpu', or 'tpu:<generation>:<torus>' with v5e or v6e and an AxB torus (e.g. tpu:v5e:2x4), "
    "or v4 or v5p and an AxBxC torus (e.g. tpu:v5p:2x2x2)"
)
_QUIET_LIBTPU_ENV = {
    "TPU_HOST_BOUNDS": "1,1,1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


@dataclass(frozen=True)
class Target:
    platform: str  # "cpu" or "tpu"
    generation: str | None = None  # TPU only: v4, v5e, v5p, v6e
    torus: tuple[int, ...] = ()  # TPU only: chips along each torus dimension

    @property
    def topology_name(self) -> str:
        """The name libtpu takes, e.g. "v5e:2x4"."""
        return f"{self.generation}:{'x'.join(map(str, self.torus))}"

    def __str__(self) -> str:
        return "cpu" if self.platform == "cpu" else f"tpu:{self.topology_name}"


def parse_target(text: str = "cpu") -> Target:
    """ "cpu" or "tpu:v5e:2x4"-style text -> Target; ValueError naming the accepted forms."""
    clean = text.strip().lower()
    if clean == "cpu":
        return Target("cpu")
    m = re.fullmatch(r"tpu:(v[0-9a-z]+):(\d+(?:x\d+)*)", clean)
    if not m or m.group(1) not in TPU_TORUS_RANK:
        raise ValueError(f"unknown compile target {text!r}; expected {ACCEPTED_FORMS}")
    generation, torus = m.group(1), tuple(int(d) for d in m.group(2).split("x"))
    if len(torus) != TPU_TORUS_RANK[generation]:
        raise ValueError(
            f"{generation} has a {TPU_TORUS_RANK[generation]}-D torus, got {m.group(2)!r} in "
            f"{text!r}; expected {ACCEPTED_FORMS}"
        )
    if min(torus) < 1:
        raise ValueError(f"torus sizes must be positive, got {m.group(2)!r} in {text!r}")
    return Target("tpu", generation, torus)


def _as_target(target: Target | str) -> Target:
    return parse_target(target) if isinstance(target, str) else target


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


@contextlib.contextmanager
def _quiet_libtpu():
    """The env settings of the module docstring, on a CPU host, removed again afterwards."""
    added = []
    if jax.default_backend() != "tpu":  # on a TPU host libtpu is already up with its own settings
        added = [k for k in _QUIET_LIBTPU_ENV if k not in os.environ]
        os.environ.update({k: _QUIET_LIBTPU_ENV[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@functools.cache  # one set of devices per target, so meshes (and jit caches) built on it agree
def _tpu_devices(target: Target) -> tuple:
    from jax.experimental import topologies

    # v4 chips have two cores; jax on a real v4 shows one device per chip (megacore).
    options = {"chip_config_name": "megacore"} if target.generation == "v4" else {}
    with _quiet_libtpu():
        try:
            desc = topologies.get_topology_desc(
                topology_name=target.topology_name, platform="tpu", **options
            )
        except jax.errors.JaxRuntimeError as e:
            name = target.topology_name
            raise ValueError(f"libtpu rejected topology {name!r}: {_first_line(e)}") from e
    return tuple(desc.devices)


@functools.cache
def aot_unavailable_reason() -> str | None:
    """None when TPU topologies can be compiled for here, else a one-line reason."""
    if importlib.util.find_spec("libtpu") is None:
        return (
            "libtpu is not installed: pip install -e '.[tpu-aot]' (to compile for TPU topologies)"
        )
    try:
        _tpu_devices(Target("tpu", "v5e", (2, 2)))
    except Exception as e:  # noqa: BLE001 -- a probe: any failure means "not usable here"
        return f"libtpu is installed but cannot describe a TPU topology ({_first_line(e)})"
    return None


def target_devices(target: Target | str) -> list:
    """The devices to build a mesh on: jax.devices() for cpu, compile-only devices for tpu."""
    target = _as_target(target)
    if target.platform == "cpu":
        return list(jax.devices())
    reason = aot_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    return list(_tpu_devices(target))


def compile_for_target(
    target: Target | str, jitted, *abstract_args
) -> tuple[jax.stages.Compiled, CompiledReport]:
    """(compiled, report) of `jitted` for `target` from abstract args (ShapeDtypeStructs) sharded
    on a mesh built on `target_devices(target)`; lowered inside `jax.set_mesh` of that mesh.

    Build the shardings (e.g. `parallel.auto.state_shardings`) *outside* a TPU mesh context: an
    eager op there (optax's `jnp.zeros([])` inside `jax.eval_shape`) tries to run on the
    compile-only devices: "'Executable' object has no attribute 'local_devices'"."""
    target = _as_target(target)
    allowed = set(target_devices(target))
    shardings = [getattr(x, "sharding", None) for x in jax.tree.leaves(abstract_args)]
    meshes = {s.mesh for s in shardings if isinstance(s, jax.sharding.NamedSharding)}
    ctx = jax.set_mesh(meshes.pop()) if len(meshes) == 1 else contextlib.nullcontext()
    with ctx:
        compiled, report = compile_with_report(jitted, *abstract_args)
    used = {d for s in jax.tree.leaves(compiled.input_shardings) for d in s.device_set}
    if not used <= allowed:
        kinds = sorted({d.device_kind for d in used})
        raise ValueError(
            f"compiled for {', '.join(kinds)} devices, not for target {target}: build the "
            "arguments' mesh on target_devices(target)"
        )
    return compiled, report


def tpu_estimate_seconds(compiled) -> float | None:
    """cost_analysis()['optimal_seconds'], the TPU compiler's own run-time estimate; None where
    absent (CPU) or not positive (libtpu 0.0.42 gave -8.9993 for some programs: a sentinel).

    It reads like a roofline over the compiler's FLOPs and HBM bytes; it does not appear to charge
    the interconnect for collectives (anchors F5), so it is a lower bound, not a step time."""
    cost = compat.cost_analysis(compiled)
    value = cost.get("optimal_seconds")
    return float(value) if value is not None and value > 0 else None


@dataclass(frozen=True)
class ArgumentBytes:
    logical: float  # per device: the argument shards' bytes, as the shardings define them
    padded: float  # per device: the same shards padded to the backend's memory tiles


_ENTRY_LAYOUT = "entry_computation_layout={("
# dtype[dims]{minor_to_major:tiling}; XLA:CPU prints scalars without the braces
_ARRAY_LAYOUT = re.compile(r"\b([a-z]\w*)\[([\d,]*)\](?:\{([\d,]*)(:[^{}]*)?\})?")


def _tile_padded(dims: list[int], minor_to_major: list[int], tiling: str) -> list[int]:
    """Physical dims (major to minor) after padding the minor ones to the first-level tile."""
    physical = [dims[i] for i in reversed(minor_to_major)] if minor_to_major else list(dims)
    tile = re.search(r"T\(([\d,]+)\)", tiling or "")
    if not tile:
        return physical
    sizes = [int(t) for t in tile.group(1).split(",")]
    physical = [1] * (len(sizes) - len(physical)) + physical  # a scalar still fills a tile
    head, tail = physical[: -len(sizes)], physical[-len(sizes) :]
    return head + [ceil(d / t) * t for d, t in zip(tail, sizes, strict=True)]


def entry_argument_bytes(compiled) -> ArgumentBytes:
    """Per-device argument bytes from the executable's entry layout, unpadded and tile-padded.

    TPU lays arrays out in tiles (e.g. T(8,128): the minor dim padded to 128 and the next to 8), so
    its memory_analysis argument bytes exceed a CPU compile's for the same shardings whenever a
    shard is not tile-aligned. `logical` equals the CPU figure; `padded` the TPU one."""
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    header = text.split("\n", 1)[0]
    if _ENTRY_LAYOUT not in header:
        raise ValueError("HLO module header has no entry_computation_layout")
    start = header.index(_ENTRY_LAYOUT) + len(_ENTRY_LAYOUT) - 1
    params = header[start : matching(header, start)]
    logical = padded = 0.0
    for dtype, dims_text, layout, tiling in _ARRAY_LAYOUT.findall(params):
        dims = [int(d) for d in dims_text.split(",") if d]
        minor_to_major = [int(d) for d in layout.split(",") if d]
        logical += nbytes([(dtype, tuple(dims))])
        padded += nbytes([(dtype, tuple(_tile_padded(dims, minor_to_major, tiling)))])
    return ArgumentBytes(logical, padded)
