"""The model as data: graphdef + a pure dict of parameter arrays, and their logical axes.

Training code holds parameters as a plain nested dict (easy for optax, orbax and shard_map) and
calls the NNX module through `nnx.merge` (the functional split/merge path; plain jax.jit over a
mutating NNX object would silently drop updates).
"""

from __future__ import annotations

from functools import cache

import jax
from flax import nnx

from jaxscale.config import ModelConfig
from jaxscale.model.transformer import Transformer
from jaxscale.sharding import Sharder, check_divisible, tree_shardings


def _build(cfg: ModelConfig, seed: int) -> Transformer:
    return Transformer(cfg, rngs=nnx.Rngs(params=seed))


@cache
def graphdef_and_logical(cfg: ModelConfig):
    """(graphdef, logical-axes tree) from an abstract model; nothing is allocated."""
    model = nnx.eval_shape(lambda: _build(cfg, 0))
    graphdef, state = nnx.split(model)
    variables = jax.tree.leaves(state, is_leaf=lambda v: isinstance(v, nnx.Variable))
    treedef = jax.tree.structure(nnx.to_pure_dict(state))
    logical = jax.tree.unflatten(
        treedef, [tuple(v.get_metadata()["logical_axes"]) for v in variables]
    )
    return graphdef, logical


def logical_axes(cfg: ModelConfig):
    return graphdef_and_logical(cfg)[1]


def abstract_params(cfg: ModelConfig):
    """ShapeDtypeStruct tree of the parameters (exact shapes, no allocation)."""
    return jax.eval_shape(lambda: init_params(cfg, 0))


def init_params(cfg: ModelConfig, seed: int):
    """Parameters as a pure dict of arrays (unsharded: call under jit with out_shardings)."""
    return nnx.to_pure_dict(nnx.state(_build(cfg, seed)))


def param_shardings(cfg: ModelConfig, sharder: Sharder):
    """NamedSharding tree for the parameters; raises if a sharded dim does not divide."""
    logical = logical_axes(cfg)
    shapes = jax.tree.map(lambda x: tuple(x.shape), abstract_params(cfg))
    check_divisible(sharder, shapes, logical)
    return tree_shardings(sharder, logical)


def init_sharded_params(cfg: ModelConfig, seed: int, sharder: Sharder):
    """Initialise directly into the sharded layout: each device computes only its shards."""
    shardings = param_shardings(cfg, sharder)
    return jax.jit(lambda: init_params(cfg, seed), out_shardings=shardings)()


def apply(cfg: ModelConfig, params, tokens_BT, sharder: Sharder | None = None):
    """logits [B, T, V] float32 = model(tokens) for a pure-dict `params`."""
    graphdef, _ = graphdef_and_logical(cfg)
    return nnx.merge(graphdef, params)(tokens_BT, sharder)
