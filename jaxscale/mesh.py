"""Mesh specs: parse "dp=2,fsdp=2,tp=2", validate against the device count, build a jax Mesh.

Canonical axis names and their order in the mesh (outermost first; tensor innermost, so that the
tensor-parallel group is the set of neighbouring devices with the fastest links):

    data  (dp, data)     batch split; replicated params
    pipe  (pp, pipe)     pipeline stages
    fsdp  (fsdp)         batch split; params, grads and optimizer state sharded (ZeRO-3)
    expert (ep, expert)  MoE experts
    context (cp, context) the sequence split (context parallelism: ring, all-gather, Ulysses)
    tensor (tp, tensor)  Megatron column/row split of heads, mlp and vocab

Only the axes a spec names appear in the mesh: "dp=8" is a 1-D mesh with axis "data".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MESH_AXES = ("data", "pipe", "fsdp", "expert", "context", "tensor")
ALIASES = {
    "dp": "data",
    "data": "data",
    "pp": "pipe",
    "pipe": "pipe",
    "fsdp": "fsdp",
    "ep": "expert",
    "expert": "expert",
    "cp": "context",
    "context": "context",
    "tp": "tensor",
    "tensor": "tensor",
}
_SHORT = {
    "data": "dp",
    "pipe": "pp",
    "fsdp": "fsdp",
    "expert": "ep",
    "context": "cp",
    "tensor": "tp",
}


class MeshSpecError(ValueError):
    """A mesh spec that cannot be built; the message names the problem."""


@dataclass(frozen=True)
class MeshSpec:
    """Axis sizes in canonical order. A size of -1 means "fill the remaining devices"."""

    axes: tuple[tuple[str, int], ...]
    written: str = field(default="", compare=False, repr=False)  # as given, for display

    def __str__(self) -> str:
        """As the user wrote it ("pp=2,dp=4"), else in canonical order with short names."""
        return self.written or ",".join(f"{_SHORT[name]}={size}" for name, size in self.axes)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def n_devices(self) -> int:
        if any(size == -1 for size in self.shape):
            raise MeshSpecError(f"{self} still has a -1 axis; call resolve(n_devices) first")
        return math.prod(self.shape)

    def size(self, axis: str) -> int:
        """Size of a canonical axis, 1 if the spec does not name it."""
        return dict(self.axes).get(axis, 1)

    def resolve(self, n_devices: int) -> MeshSpec:
        """Fill a -1 axis and check that the product equals the device count."""
        known = math.prod(size for size in self.shape if size != -1)
        if -1 in self.shape:
            if n_devices % known:
                fixed = ",".join(f"{_SHORT[n]}={s}" for n, s in self.axes if s != -1)
                raise MeshSpecError(
                    f"{fixed} does not divide {n_devices} devices "
                    f"(the fixed axes use {known}; {n_devices} % {known} = {n_devices % known})"
                )
            axes = tuple((n, n_devices // known if s == -1 else s) for n, s in self.axes)
            return MeshSpec(axes)
        if known != n_devices:
            raise MeshSpecError(
                f"{self} uses {known} devices but {n_devices} are available; "
                f"{_suggest(self, n_devices)}"
            )
        return self


def _suggest(spec: MeshSpec, n_devices: int) -> str:
    """A valid alternative: the same axes with the first one set to -1, if that works."""
    if not spec.axes:
        return f"try dp={n_devices}"
    first, *rest = spec.axes
    rest_prod = math.prod(s for _, s in rest)
    if rest_prod and n_devices % rest_prod == 0:
        alt = MeshSpec(((first[0], n_devices // rest_prod), *rest))
        return f"try {alt} (or {_SHORT[first[0]]}=-1 to fill)"
    return f"the product of the axis sizes must be {n_devices}"


def parse_mesh(text: str) -> MeshSpec:
    """Parse "dp=2,fsdp=2,tp=2" (aliases: dp/data, fsdp, tp/tensor, pp/pipe, ep/expert, cp/context).

    Raises MeshSpecError naming the problem for: an empty spec, a missing '=', an unknown axis, an
    axis given twice, a non-integer or non-positive size other than -1, and more than one -1.
    """
    if not text or not text.strip():
        raise MeshSpecError("empty mesh spec; expected e.g. 'dp=2,fsdp=2,tp=2'")
    sizes: dict[str, int] = {}
    for part in text.split(","):
        part = part.strip()
        if "=" not in part:
            raise MeshSpecError(f"mesh axis {part!r} has no size; write it as name=size, e.g. dp=8")
        key, _, value = (s.strip() for s in part.partition("="))
        name = ALIASES.get(key.lower())
        if name is None:
            raise MeshSpecError(
                f"unknown mesh axis {key!r}; "
                "known axes: dp/data, fsdp, tp/tensor, pp/pipe, ep/expert, cp/context"
            )
        if name in sizes:
            raise MeshSpecError(f"mesh axis {name!r} is given twice (as {key!r} and before)")
        try:
            size = int(value)
        except ValueError:
            raise MeshSpecError(f"size of {key!r} must be an integer, got {value!r}") from None
        if size == 0 or size < -1:
            raise MeshSpecError(f"size of {key!r} must be positive (or -1 to fill), got {size}")
        sizes[name] = size
    if list(sizes.values()).count(-1) > 1:
        raise MeshSpecError(f"at most one axis may be -1 (fill), got {text!r}")
    axes = tuple((name, sizes[name]) for name in MESH_AXES if name in sizes)
    return MeshSpec(axes, ",".join(p.strip() for p in text.split(",")))


def build_mesh(spec: MeshSpec | str, devices=None):
    """A jax Mesh with Auto axis types (the "jit + shardings" path), shape resolved from devices.

    Auto axes let GSPMD choose where collectives go; the manual strategies enter shard_map on the
    same mesh. `devices` defaults to all devices (jax.devices()).
    """
    import jax
    from jax.sharding import AxisType

    if isinstance(spec, str):
        spec = parse_mesh(spec)
    devices = list(jax.devices() if devices is None else devices)
    spec = spec.resolve(len(devices))
    # Shape and names positionally: the first keyword was renamed between jax 0.10 and 0.12.
    return jax.make_mesh(
        spec.shape, spec.names, axis_types=(AxisType.Auto,) * len(spec.axes), devices=devices
    )
