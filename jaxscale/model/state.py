"""The model as data: a pure dict of parameter arrays, and their logical axes.

Training code holds parameters as a plain nested dict (easy for optax, orbax and shard_map),
initialised by the NNX module (`Transformer`) and run by `jaxscale.model.pieces` on the dict, so
no NNX object is ever mutated under jit (plain jax.jit over a mutating NNX object would silently
drop updates).
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
def logical_axes(cfg: ModelConfig):
    """The parameters' logical-axes tree (tuples of names), from an abstract model."""
    state = nnx.state(nnx.eval_shape(lambda: _build(cfg, 0)))
    variables = jax.tree.leaves(state, is_leaf=lambda v: isinstance(v, nnx.Variable))
    treedef = jax.tree.structure(nnx.to_pure_dict(state))
    return jax.tree.unflatten(treedef, [tuple(v.get_metadata()["logical_axes"]) for v in variables])


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
