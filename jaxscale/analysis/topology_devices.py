"""Device topology as jax reports it: on TPU each device has torus coordinates, on GPU and CPU
none (the GPU link matrix comes from `nvidia-smi topo -m`, see `jaxscale.calc.topology`).

Seed 002 ch4 inspects NVLink with nvidia-smi; on TPU the analogue is `jax.devices()[i].coords`,
and `jax.experimental.mesh_utils.create_device_mesh` uses them to keep mesh axes on ICI rings.
"""

from dataclasses import dataclass

import jax


@dataclass(frozen=True)
class DeviceRow:
    id: int
    process_index: int
    platform: str
    device_kind: str
    coords: tuple[int, ...] | None  # TPU torus position; None elsewhere
    core_on_chip: int | None


def device_rows(devices=None) -> list[DeviceRow]:
    """One row per device (all processes' devices by default)."""
    rows = []
    for d in devices if devices is not None else jax.devices():
        coords = getattr(d, "coords", None)
        rows.append(
            DeviceRow(
                d.id,
                d.process_index,
                d.platform,
                d.device_kind,
                tuple(int(c) for c in coords) if coords is not None else None,
                getattr(d, "core_on_chip", None),
            )
        )
    return rows


def torus_shape(rows: list[DeviceRow]) -> tuple[int, ...] | None:
    """Extent of the occupied coordinates per dimension (e.g. (2, 4, 1)); None without coords."""
    coords = [r.coords for r in rows if r.coords is not None]
    if not coords or len(coords) != len(rows):
        return None
    return tuple(
        max(c[k] for c in coords) - min(c[k] for c in coords) + 1 for k in range(len(coords[0]))
    )


def format_devices(rows: list[DeviceRow]) -> str:
    lines = [f"{'id':>4} {'proc':>4} {'platform':<8} {'kind':<20} {'coords':<12} core"]
    for r in rows:
        coords = "x".join(map(str, r.coords)) if r.coords is not None else "-"
        core = "-" if r.core_on_chip is None else str(r.core_on_chip)
        kind = r.device_kind[:20]
        lines.append(
            f"{r.id:>4} {r.process_index:>4} {r.platform:<8} {kind:<20} {coords:<12} {core}"
        )
    shape = torus_shape(rows)
    lines.append(
        f"torus extent: {'x'.join(map(str, shape))}"
        if shape
        else "no device coordinates (CPU/GPU): link topology comes from nvidia-smi topo -m"
    )
    return "\n".join(lines)
