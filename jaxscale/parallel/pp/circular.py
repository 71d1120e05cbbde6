"""The interleaved schedule's layout: each device's v chunks, viewed from the stored layout.

Every strategy stores the same `[L, ...]` arrays (so a checkpoint restores under any mesh), which
gives device d the contiguous layers [d L/P, (d+1) L/P). The interleaved schedule needs device d
to hold virtual stages d, d+P, ...: `circular_shard_map` views each leaf split over pipe along
`layers` as [v, P, L/(vP), ...] with P over pipe, and GSPMD moves the layers between the two
layouts around the step.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale.parallel.pp.plan import AXIS


def circular_shard_map(fn, mesh, in_specs, out_specs, virtual_stages: int):
    """`jax.shard_map` for the interleaved schedule: device d must hold the layers of virtual
    stages d, d+P, ..., but the stored layout (the one every strategy shares, so a checkpoint
    restores anywhere) gives it a contiguous [L/P] slice. Each leaf split over pipe along
    `layers` is viewed as [v, P, L/(vP), ...] with P over pipe -- the circular assignment -- and
    GSPMD moves the layers between the two layouts around the step (an all-to-all of the
    stage parameters, and of their gradients and optimizer state, each step: the price of
    keeping one stored layout). Inside, each device sees its v chunks as [v L/(vP), ...]."""
    v, p = virtual_stages, mesh.shape[AXIS]

    # `inner` and `outer` only bind their arguments: the traced functions keep their names
    # (the jitted step's module is named after `outer`)
    def inner(*args):
        return _inside(fn, in_specs, out_specs, v, args)

    mapped = jax.shard_map(
        inner,
        mesh=mesh,
        in_specs=jax.tree.map(_outer_spec, in_specs, is_leaf=_is_spec),
        out_specs=jax.tree.map(_outer_spec, out_specs, is_leaf=_is_spec),
    )

    def outer(*args):
        return _outside(mapped, mesh, in_specs, out_specs, v, p, args)

    return outer


def _is_spec(s) -> bool:
    return isinstance(s, P)


def _layered(spec) -> bool:
    """Whether a leaf is split over pipe along its first (`layers`) dimension."""
    return isinstance(spec, P) and len(spec) > 0 and spec[0] == AXIS


def _outer_spec(spec):
    """A layered leaf's spec in the circular view [v, P, L/(vP), ...]: P over pipe."""
    return P(None, AXIS, None, *spec[1:]) if _layered(spec) else spec


def _over(fn_leaf, specs, tree):
    """`fn_leaf` applied to the layered leaves of `tree` (by their specs), the rest as they are."""
    return jax.tree.map(
        lambda s, x: fn_leaf(x) if _layered(s) else x,
        specs,
        tree,
        is_leaf=_is_spec,
    )


def _inside(fn, in_specs, out_specs, v: int, args):
    """Per device: its [v, 1, L/(vP), ...] blocks as [v L/(vP), ...] for `fn`, and back."""
    args = _over(lambda x: x.reshape(-1, *x.shape[3:]), in_specs, args)
    out = fn(*args)
    return _over(lambda x: x.reshape(v, 1, x.shape[0] // v, *x.shape[1:]), out_specs, out)


def _outside(mapped, mesh, in_specs, out_specs, v: int, p: int, args):
    """Around the mapped step: the stored [L, ...] leaves viewed as [v, P, L/(vP), ...], and the
    outputs back to the stored layout. GSPMD moves the layers between the two (all-to-alls)."""
    args = _over(lambda x: x.reshape(v, p, x.shape[0] // (v * p), *x.shape[1:]), in_specs, args)
    out = mapped(*args)
    # back to the stored layout (contiguous [L/P] per device), pinned: left free, GSPMD may
    # return the state replicated
    return jax.tree.map(
        lambda s, x: (
            jax.lax.with_sharding_constraint(x.reshape(-1, *x.shape[3:]), NamedSharding(mesh, s))
            if _layered(s)
            else x
        ),
        out_specs,
        out,
        is_leaf=_is_spec,
    )
