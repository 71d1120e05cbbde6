"""THE table: logical axis names -> mesh axes. A strategy is a mesh spec plus these rules.

The model names only logical axes. Parameters use `vocab, embed, heads, kv_heads, head_dim, mlp,
layers, norm, expert, router`; activations use `batch, seq, act_embed, act_heads, act_kv, act_mlp,
act_vocab` (a separate name for the activation's embed dimension, because FSDP shards the
*parameter's* embed dimension while the activation's stays whole).

Which rules apply is decided by which axes the mesh has:

    strategy        mesh (8 devices)        what is sharded
    reference       1 device                nothing
    dp              dp=8                    batch over data; params replicated
    fsdp (ZeRO-3)   fsdp=8                  batch and params' embed over fsdp (params, grads
                                            and optimizer state sharded; weights all-gathered)
    tp (Megatron)   tp=8                    heads, kv_heads, mlp, vocab over tensor
    dp x tp         dp=2,tp=4               both of the above
    fsdp x tp       fsdp=4,tp=2
    dp x fsdp x tp  dp=2,fsdp=2,tp=2
    ep (experts)    ep=4,dp=2               experts over expert, batch over data and expert

A mesh axis is used at most once per array (the first logical dim that claims it wins), and an
axis absent from the mesh is simply skipped, so one table serves every mesh.

The manual (shard_map) strategies store their parameters by the same table with one rule
changed: ZERO_RULES shards every leaf's `embed` dimension over all data-like axes at once (what
ZeRO shards: optimizer state; + gradients; + parameters), REPLICATED_RULES keeps parameters whole
on every data shard (DP). The pipeline's layer split is the `layers` rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
from jax.sharding import NamedSharding, PartitionSpec

# logical axis -> mesh axes that shard it (in order), when present in the mesh.
RULES: dict[str, tuple[str, ...]] = {
    # parameters
    "vocab": ("tensor",),
    "embed": ("fsdp",),  # ZeRO-3: params stored sharded over fsdp
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "mlp": ("tensor",),
    "layers": ("pipe",),  # a pipeline stage is a contiguous slice of the stack
    "norm": (),
    "expert": ("expert",),  # expert parallelism: each device holds E / ep whole experts
    "router": (),  # the router's expert dimension: every device routes to all E
    # activations
    # every data-like axis splits the batch, and so does the expert axis: outside the experts
    # its devices are data-parallel (the all-to-alls move tokens to the experts and back)
    "batch": ("data", "fsdp", "expert"),
    # context parallelism: the sequence over `context` (GSPMD gathers K/V for attention)
    "seq": ("context",),
    "act_embed": (),
    "act_heads": ("tensor",),
    "act_kv": ("tensor",),
    "act_mlp": ("tensor",),
    "act_vocab": ("tensor",),
}


DATA_AXES = ("data", "fsdp")  # every data-like axis splits the batch; ZeRO shards over them
ZERO_RULES = tuple({**RULES, "embed": DATA_AXES}.items())
REPLICATED_RULES = tuple({**RULES, "embed": ()}.items())


@dataclass(frozen=True)
class Sharder:
    """Rules bound to a mesh: turns logical names into PartitionSpecs and shardings."""

    mesh: jax.sharding.Mesh
    rules: tuple[tuple[str, tuple[str, ...]], ...] = tuple(RULES.items())

    def spec(self, logical: tuple[str | None, ...]) -> PartitionSpec:
        table = dict(self.rules)
        used: set[str] = set()
        out = []
        for name in logical:
            if name is not None and name not in table:
                raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
            axes = [
                a
                for a in (table[name] if name else ())
                if a in self.mesh.shape and a not in used and self.mesh.shape[a] > 1
            ]
            used.update(axes)
            out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
        return PartitionSpec(*out)

    def named(self, logical: tuple[str | None, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical))

    def constrain(self, x, logical: tuple[str | None, ...]):
        """Activation sharding constraint at a block boundary (GSPMD places the collectives)."""
        return jax.lax.with_sharding_constraint(x, self.named(logical))


def constrain(sharder: Sharder | None, x, logical: tuple[str | None, ...]):
    """`sharder.constrain` that is a no-op for the unsharded reference (sharder None)."""
    return x if sharder is None else sharder.constrain(x, logical)


def tree_shardings(sharder: Sharder, logical_tree):
    """Map a tree whose leaves are logical-name tuples to NamedShardings."""
    return jax.tree.map(sharder.named, logical_tree, is_leaf=_is_names)


def check_divisible(sharder: Sharder, shapes_tree, logical_tree) -> None:
    """Raise a clear error if a sharded dimension does not divide by its mesh axes."""
    flat_shapes, _ = jax.tree.flatten_with_path(shapes_tree, is_leaf=_is_shape)
    flat_names = jax.tree.leaves(logical_tree, is_leaf=_is_names)
    for (path, shape), names in zip(flat_shapes, flat_names, strict=True):
        spec = sharder.spec(names)
        for dim, entry in enumerate(spec):
            if entry is None:
                continue
            axes = entry if isinstance(entry, tuple) else (entry,)
            ways = math.prod(sharder.mesh.shape[a] for a in axes)
            if shape[dim] % ways:
                raise ValueError(
                    f"{jax.tree_util.keystr(path)} dim {dim} ({names[dim]}={shape[dim]}) does not "
                    f"divide over mesh axes {axes} of total size {ways}"
                )


def _is_names(x) -> bool:
    return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(n, int) for n in x)
