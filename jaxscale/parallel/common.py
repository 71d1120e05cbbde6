"""Shared pieces of the manual strategies (jax.shard_map with explicit collectives).

Every manual strategy keeps the same training state as the auto path ({"step", "params",
"opt_state"}), laid out by the same logical-axis rules (jaxscale/sharding.py), and runs one
shard_map over the whole mesh in which every collective is written by hand. The data-like mesh
axes (`data`, `fsdp`) split the batch and form the ZeRO group; `tensor` splits heads, mlp and vocab.

Sharded shapes in docstrings follow the scaling-book notation: [B_data, T, D] is a batch split over
the data axes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.model import state as model_state
from jaxscale.model.transformer import forward
from jaxscale.sharding import RULES, Sharder
from jaxscale.train import step as train_step

DATA_AXES = ("data", "fsdp")
# ZeRO shards whatever it shards (optimizer state; +grads; +params) along each leaf's embed dim,
# over all data-like axes at once: the same table as the auto path with one rule changed.
ZERO_RULES = tuple({**RULES, "embed": DATA_AXES}.items())


@dataclass(frozen=True)
class ManualStep:
    """A built manual strategy: its layout and its compiled functions."""

    name: str
    mesh: jax.sharding.Mesh
    state_specs: dict  # PartitionSpec tree of the state
    batch_spec: P
    step: Callable  # jitted (state, batch [B, T+1]) -> (state, metrics)
    init: Callable  # () -> state in this layout
    grad_specs: dict | None = None  # layout of the gradients the optimizer update sees

    def shardings(self, specs):
        return named_shardings(self.mesh, specs)


def named_shardings(mesh, specs):
    """NamedShardings on `mesh` for a tree of PartitionSpecs."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)


def data_axes(mesh) -> tuple[str, ...]:
    return tuple(a for a in DATA_AXES if a in mesh.shape)


def data_size(mesh) -> int:
    size = 1
    for a in data_axes(mesh):
        size *= mesh.shape[a]
    return size


def param_specs(cfg: ModelConfig, sharder: Sharder):
    """PartitionSpec tree of the parameters under `sharder`'s rules (checks divisibility)."""
    return jax.tree.map(lambda s: s.spec, model_state.param_shardings(cfg, sharder))


def opt_specs(tx, cfg: ModelConfig, leaf_specs):
    """Optimizer-state specs: every moment takes its parameter's spec; counters replicated."""
    abstract = jax.eval_shape(tx.init, model_state.abstract_params(cfg))
    return optax.tree_map_params(
        tx, lambda _, s: s, abstract, leaf_specs, transform_non_params=lambda _: P(),
        is_leaf=_is_spec,
    )  # fmt: skip


def manual_optimizer(tcfg: TrainConfig, cfg: ModelConfig):
    """AdamW exactly as the auto path, minus clipping: the global norm needs collectives over
    the shards, so clipping is done by `clip_by_global_norm` below."""
    return train_step.make_optimizer(tcfg.replace(grad_clip=0.0), cfg)


# --- one leaf's sharded dimension ------------------------------------------------------------


def sharded_dim(spec: P, axes: tuple[str, ...]) -> int | None:
    """The dimension of `spec` split over `axes` (the ZeRO group), or None if none is."""
    for dim, entry in enumerate(spec):
        names = entry if isinstance(entry, tuple) else (entry,)
        if entry is not None and set(names) & set(axes):
            return dim
    return None


def gather_leaf(x, spec: P, axes, to: str = "varying"):
    """All-gather the shards of one leaf over `axes` (tiled: the full dim comes back).

    `to="invarying"` types the result as replicated over `axes` (true after an optimizer
    update, so out_specs may say P()); the default keeps it varying, whose transpose under
    autodiff is the reduce-scatter ZeRO-3 relies on."""
    dim = sharded_dim(spec, axes)
    return x if dim is None else jax.lax.all_gather(x, axes, axis=dim, tiled=True, to=to)


def scatter_leaf(x, spec: P, axes):
    """Reduce-scatter a full, unreduced leaf: sum over `axes`, keep this device's slice."""
    dim = sharded_dim(spec, axes)
    if dim is None:
        return jax.lax.psum(x, axes)  # an unsharded leaf (norm scales): plain all-reduce
    return jax.lax.psum_scatter(x, axes, scatter_dimension=dim, tiled=True)


def slice_leaf(x, spec: P, axes):
    """This device's slice of a full (replicated) leaf, along the dim split over `axes`."""
    dim = sharded_dim(spec, axes)
    if dim is None:
        return x
    n = 1
    for a in axes:
        n *= jax.lax.axis_size(a)
    size = x.shape[dim] // n
    return jax.lax.dynamic_slice_in_dim(x, linear_index(axes) * size, size, axis=dim)


def linear_index(axes):
    """Row-major index of this device in the group `axes` (matches all_gather's tile order)."""
    idx = 0
    for a in axes:
        idx = idx * jax.lax.axis_size(a) + jax.lax.axis_index(a)
    return idx


# --- loss, norm, update ---------------------------------------------------------------------


def local_loss(params, batch_BT1, cfg: ModelConfig, layer_hook=None, top_hook=None,
               block_fn=None):  # fmt: skip
    """Mean next-token loss over this device's rows [B_data, T+1]; no collective of its own."""
    top = {k: v for k, v in params.items() if k != "blocks"}
    if top_hook is not None:
        top = top_hook(top)
    unembed_DV = top["embed_VD"].T if cfg.tied_embeddings else top["unembed_DV"]
    logits_BTV = forward(top["embed_VD"], params["blocks"], top["final_norm_D"], unembed_DV,
                         batch_BT1[:, :-1], cfg, None, block_fn, layer_hook)  # fmt: skip
    return train_step.cross_entropy(logits_BTV, batch_BT1[:, 1:])


def global_sq_norm(grads, specs):
    """Sum of squares of the whole (unsharded) gradient: local sums, then one psum per leaf over
    the axes that leaf is split over (replicated leaves are counted once)."""
    total = jnp.zeros((), jnp.float32)
    for g, spec in zip(jax.tree.leaves(grads), jax.tree.leaves(specs, is_leaf=_is_spec),
                       strict=True):  # fmt: skip
        sq = jnp.sum(jnp.square(g.astype(jnp.float32)))
        axes = spec_axes(spec)
        total = total + (jax.lax.psum(sq, axes) if axes else sq)
    return total


def clip_by_global_norm(grads, g_norm, max_norm: float):
    """optax.clip_by_global_norm's formula, with the norm supplied (computed across shards)."""
    if max_norm <= 0:
        return grads
    trigger = g_norm < max_norm
    return jax.tree.map(
        lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm), grads
    )


def spec_axes(spec: P) -> tuple[str, ...]:
    out = []
    for entry in spec:
        if entry is not None:
            out.extend(entry if isinstance(entry, tuple) else (entry,))
    return tuple(out)


def _is_spec(x) -> bool:
    return isinstance(x, P)
