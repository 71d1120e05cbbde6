"""Flax NNX decoder-only transformer: RMSNorm, RoPE, GQA attention, SwiGLU/GELU MLP.

This module defines the parameters: their shapes, initialisation and logical axes. The forward
pass is `jaxscale.model.pieces` (pure functions of arrays that every strategy composes).

Layers are stacked (every per-layer parameter has a leading `layers` axis L) and the forward pass
scans over them, so a pipeline stage is a slice of the stack. Every parameter carries its logical
axis names in its `logical_axes` metadata; `jaxscale.sharding` maps them to mesh axes. (Not
Flax's `out_sharding` key: Flax would resolve those names against whatever mesh is active, and
jaxscale keeps that mapping in one table of its own.) Axis letters: see jaxscale/config.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxscale.config import ModelConfig
from jaxscale.model.pieces import DENSE, MLP_KEYS, Pieces, logits


# Per-layer parameter shapes (as functions of the config) and their logical axes.
# A leading L (layers) axis is added to every entry.
def layer_param_layout(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """One dense layer: attention, norms and the MLP."""
    D, H, G, K, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    layout = {
        "attn_norm_D": ((D,), ("norm",)),
        "wq_DHK": ((D, H, K), ("embed", "heads", "head_dim")),
        "wk_DGK": ((D, G, K), ("embed", "kv_heads", "head_dim")),
        "wv_DGK": ((D, G, K), ("embed", "kv_heads", "head_dim")),
        "wo_HKD": ((H, K, D), ("heads", "head_dim", "embed")),
        "mlp_norm_D": ((D,), ("norm",)),
        "w_up_DF": ((D, F), ("embed", "mlp")),
        "w_down_FD": ((F, D), ("mlp", "embed")),
    }
    if cfg.mlp == "swiglu":
        layout["w_gate_DF"] = ((D, F), ("embed", "mlp"))
    return layout


def moe_param_layout(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """One MoE layer's MLP: the router and E experts (each an MLP of cfg.mlp's kind)."""
    D, F, E = cfg.d_model, cfg.d_ff, cfg.n_experts
    layout = {
        "w_router_DE": ((D, E), ("embed", "router")),
        "we_up_EDF": ((E, D, F), ("expert", "embed", "mlp")),
        "we_down_EFD": ((E, F, D), ("expert", "mlp", "embed")),
    }
    if cfg.mlp == "swiglu":
        layout["we_gate_EDF"] = ((E, D, F), ("expert", "embed", "mlp"))
    return layout


def stacked_param_layout(cfg: ModelConfig) -> dict[str, tuple[int, tuple[int, ...], tuple]]:
    """name -> (stack size, one layer's shape, its logical axes). Attention and norms stack all
    L layers; with experts, the dense MLP stacks the L - L/n dense layers and the router and
    experts the L/n MoE layers (the last of every group of n = moe_every)."""
    L, L_moe = cfg.n_layers, cfg.n_moe_layers
    out = {}
    for name, (shape, logical) in layer_param_layout(cfg).items():
        count = L - L_moe if name in MLP_KEYS else L
        if count:
            out[name] = (count, shape, logical)
    if L_moe:
        out.update(
            {k: (L_moe, shape, logical) for k, (shape, logical) in moe_param_layout(cfg).items()}
        )
    return out


# Fan-in for initialisation (std = 1/sqrt(fan_in)); residual outputs are further scaled by
# 1/sqrt(2L) so the residual stream's variance does not grow with depth.
_FAN_IN = {
    "wq_DHK": "D",
    "wk_DGK": "D",
    "wv_DGK": "D",
    "wo_HKD": "HK",
    "w_up_DF": "D",
    "w_gate_DF": "D",
    "w_down_FD": "F",
    "w_router_DE": "D",
    "we_up_EDF": "D",
    "we_gate_EDF": "D",
    "we_down_EFD": "F",
}
_RESIDUAL_OUT = ("wo_HKD", "w_down_FD", "we_down_EFD")


class Blocks(nnx.Module):
    """All layers' parameters, stacked along a leading `layers` axis."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dims = {"D": cfg.d_model, "HK": cfg.n_heads * cfg.head_dim, "F": cfg.d_ff}
        dtype = jnp.dtype(cfg.param_dtype)
        for name, (count, shape, logical) in stacked_param_layout(cfg).items():
            full = (count, *shape)
            if name.endswith("norm_D"):
                value = jnp.ones(full, dtype)
            else:
                std = dims[_FAN_IN[name]] ** -0.5
                if name in _RESIDUAL_OUT:
                    std /= (2 * cfg.n_layers) ** 0.5
                value = (std * jax.random.normal(rngs.params(), full)).astype(dtype)
            setattr(self, name, nnx.Param(value, logical_axes=("layers", *logical)))


class Transformer(nnx.Module):
    """tokens [B, T] int32 -> logits [B, T, V] float32."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = jnp.dtype(cfg.param_dtype)
        D, V = cfg.d_model, cfg.vocab
        # Tied: the same matrix is the unembedding, so keep its scale at 1/sqrt(D).
        embed_std = D**-0.5 if cfg.tied_embeddings else 1.0
        embed = embed_std * jax.random.normal(rngs.params(), (V, D))
        self.embed_VD = nnx.Param(embed.astype(dtype), logical_axes=("vocab", "embed"))
        self.blocks = Blocks(cfg, rngs=rngs)
        self.final_norm_D = nnx.Param(jnp.ones((D,), dtype), logical_axes=("norm",))
        if not cfg.tied_embeddings:
            unembed = D**-0.5 * jax.random.normal(rngs.params(), (D, V))
            self.unembed_DV = nnx.Param(unembed.astype(dtype), logical_axes=("embed", "vocab"))

    def __call__(self, tokens_BT, pc: Pieces = DENSE):
        """logits [B, T, V] float32: `pieces.logits` on this module's arrays."""
        params = {name: v[...] for name, v in vars(self).items() if isinstance(v, nnx.Param)}
        params["blocks"] = {
            name: getattr(self.blocks, name)[...] for name in stacked_param_layout(self.cfg)
        }
        return logits(params, tokens_BT, self.cfg, pc)
