"""Where the phases run and how the actor's weights reach the generator (seed 002 ch14).

    co-located      one mesh. Before generation the actor is resharded from the training layout
                    (FSDP / TP) to the generation layout: replicated (data-parallel decode; every
                    device gathers what it lacks), or the training layout itself, which moves
                    nothing -- `device_put` returns the same buffers (verl's "only metadata
                    changes", ch14 "Architecture 3: Hybrid Engine")
    disaggregated   training on the first devices, generation on the rest; each iteration the
                    weights cross meshes with `device_put` (ch14's NCCL send, "Method 2")

`moved_bytes` counts what a transfer really moved from the two arrays' shard maps: for every
shard of the destination, the bytes its device did not already hold in the source. The
calculators (`calc.weight_transfer.reshard_bytes`, `cross_mesh_bytes`) predict the same from the
layouts alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jax
import numpy as np

from jaxscale.calc import weight_transfer as wt
from jaxscale.mesh import build_mesh, parse_mesh
from jaxscale.sharding import DATA_AXES


@dataclass(frozen=True)
class Meshes:
    train: jax.sharding.Mesh
    gen: jax.sharding.Mesh
    placement: str

    @property
    def shared(self) -> bool:
        return self.placement == "colocated"


def meshes(spec: str, placement: str, gen_devices: int = 0, devices=None) -> Meshes:
    """Co-located: the training mesh `spec` over every device, generation on it too.
    Disaggregated: `spec` over the first n - g devices, `dp=g` over the last g (default half)."""
    devices = list(jax.devices() if devices is None else devices)
    _check_axes(parse_mesh(spec))
    if placement == "colocated":
        m = build_mesh(spec, devices)
        return Meshes(m, m, placement)
    g = gen_devices or len(devices) // 2
    if not 0 < g < len(devices):
        raise ValueError(
            f"--gen-devices {g}: disaggregated placement needs 1 to "
            f"{len(devices) - 1} of the {len(devices)} devices"
        )
    parse_mesh(spec).resolve(len(devices) - g)  # a clear error if the spec does not fit
    return Meshes(build_mesh(spec, devices[:-g]), build_mesh("dp=-1", devices[-g:]), placement)


def _check_axes(spec) -> None:
    """RLHF trains on the auto path's axes; a pipe or expert axis would only replicate work (and
    its transfers then disagree with the prediction), so it is refused as everywhere else."""
    for axis, short, what in (("pipe", "pp", "pipeline schedule"), ("expert", "ep", "experts")):
        if spec.size(axis) > 1:
            raise ValueError(
                f"{short}={spec.size(axis)} is unused: the RLHF models run no {what}; "
                "use dp, fsdp and tp"
            )


def _overlap(a: tuple[slice, ...], b: tuple[slice, ...], shape) -> int:
    n = 1
    for sa, sb, size in zip(a, b, shape, strict=True):
        lo_a, hi_a, _ = sa.indices(size)
        lo_b, hi_b, _ = sb.indices(size)
        n *= max(0, min(hi_a, hi_b) - max(lo_a, lo_b))
    return n


def moved_bytes(src: jax.Array, dst: jax.Array) -> int:
    """Bytes of `dst`'s shards that their devices did not hold in `src` (0 for the same
    layout on the same devices; the whole destination when the device sets are disjoint)."""
    shape, item = dst.shape, dst.dtype.itemsize
    held = {}
    for d, idx in src.sharding.devices_indices_map(shape).items():
        held.setdefault(d, []).append(idx)
    total = 0
    for d, idx in dst.sharding.devices_indices_map(shape).items():
        need = int(np.prod([len(range(*s.indices(n))) for s, n in zip(idx, shape, strict=True)]))
        have = max((_overlap(idx, h, shape) for h in held.get(d, [])), default=0)
        total += (need - have) * item
    return total


@dataclass(frozen=True)
class Transfer:
    bytes_moved: int  # from the arrays' shard maps
    bytes_predicted: int  # from the layouts (the calculator)
    seconds: float  # wall time of the device_put, blocked until ready
    zero_copy: bool  # every destination buffer is the source's own


def _buffers(x: jax.Array) -> list[int]:
    return sorted(s.data.unsafe_buffer_pointer() for s in x.addressable_shards)


def transfer(params, shardings, meshes: Meshes) -> tuple[object, Transfer]:
    """`params` placed in `shardings` (the generation layout), with what the move cost."""
    t0 = time.perf_counter()
    out = jax.device_put(params, shardings)
    jax.block_until_ready(out)
    seconds = time.perf_counter() - t0
    src, dst = jax.tree.leaves(params), jax.tree.leaves(out)
    moved = sum(moved_bytes(s, d) for s, d in zip(src, dst, strict=True))
    zero = all(_buffers(s) == _buffers(d) for s, d in zip(src, dst, strict=True))
    return out, Transfer(moved, predict(src, dst, meshes), seconds, zero)


def _ways(x: jax.Array) -> int:
    """How many ways a leaf is split (its distinct shards)."""
    return len(
        {
            tuple((s.start, s.stop) for s in idx)
            for idx in x.sharding.devices_indices_map(x.shape).values()
        }
    )


def predict(src: list[jax.Array], dst: list[jax.Array], meshes: Meshes) -> int:
    n_gen = meshes.gen.devices.size
    if not meshes.shared:
        total = sum(x.nbytes for x in dst)
        return wt.cross_mesh_bytes(total, n_gen, max(_ways(x) for x in dst))
    if all(s.sharding == d.sharding for s, d in zip(src, dst, strict=True)):
        return 0
    return wt.reshard_bytes([(x.nbytes, _ways(x)) for x in src], n_gen)


def data_ways(mesh) -> int:
    return int(np.prod([mesh.shape[a] for a in DATA_AXES if a in mesh.shape]))
