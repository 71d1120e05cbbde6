"""Flax NNX decoder-only transformer: RMSNorm, RoPE, GQA attention, SwiGLU/GELU MLP.

Layers are stacked (every per-layer parameter has a leading `layers` axis L) and the forward pass
scans over them, so a pipeline stage is a slice of the stack. Every parameter carries its logical
axis names in its `logical_axes` metadata; `jaxscale.sharding` maps them to mesh axes. (Not
Flax's `out_sharding` key: Flax would resolve those names against whatever mesh is active, and
jaxscale keeps that mapping in one table of its own.)

The block is a pure function of arrays (`block`) so the manual shard_map strategies can call it
on local shards. Axis letters: see jaxscale/config.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxscale.config import ModelConfig
from jaxscale.sharding import Sharder, constrain


# Per-layer parameter shapes (as functions of the config) and their logical axes.
# A leading L (layers) axis is added to every entry.
def layer_param_layout(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
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


# Fan-in for initialisation (std = 1/sqrt(fan_in)); residual outputs are further scaled by
# 1/sqrt(2L) so the residual stream's variance does not grow with depth.
_FAN_IN = {"wq_DHK": "D", "wk_DGK": "D", "wv_DGK": "D", "wo_HKD": "HK", "w_up_DF": "D",
           "w_gate_DF": "D", "w_down_FD": "F"}  # fmt: skip
_RESIDUAL_OUT = ("wo_HKD", "w_down_FD")


class Blocks(nnx.Module):
    """All layers' parameters, stacked along a leading `layers` axis."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dims = {"D": cfg.d_model, "HK": cfg.n_heads * cfg.head_dim, "F": cfg.d_ff}
        dtype = jnp.dtype(cfg.param_dtype)
        for name, (shape, logical) in layer_param_layout(cfg).items():
            full = (cfg.n_layers, *shape)
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

    def __call__(self, tokens_BT, sharder: Sharder | None = None):
        cfg = self.cfg
        layers = {name: getattr(self.blocks, name)[...] for name in layer_param_layout(cfg)}
        unembed_DV = self.embed_VD[...].T if cfg.tied_embeddings else self.unembed_DV[...]
        return forward(
            self.embed_VD[...], layers, self.final_norm_D[...], unembed_DV, tokens_BT, cfg, sharder
        )


def forward(embed_VD, layers, final_norm_D, unembed_DV, tokens_BT, cfg, sharder=None,
            block_fn=None, layer_hook=None):  # fmt: skip
    """The whole model as a pure function of arrays. `layers` leaves have a leading L axis.

    Hooks for the manual (shard_map) strategies: `layer_hook(layer_params)` runs inside the layer
    loop just before a layer is used (ZeRO-3 all-gathers that layer's shards there, so only one
    layer is ever whole); `block_fn(x, layer_params, positions, cfg)` replaces the block (tensor
    parallelism substitutes Megatron blocks that work on local head and mlp shards).
    """
    cdt = jnp.dtype(cfg.compute_dtype)
    # FSDP stores the table's embed dim sharded; gather it before the lookup (one all-gather),
    # leaving the vocab split (tensor) for the masked gather GSPMD knows how to partition.
    embed_VD = constrain(sharder, embed_VD, ("vocab", None))
    x_BTD = jnp.take(embed_VD, tokens_BT, axis=0).astype(cdt)
    x_BTD = constrain(sharder, x_BTD, ("batch", "seq", "act_embed"))
    positions_T = jnp.arange(tokens_BT.shape[1])

    def body(x_BTD, layer):
        if layer_hook is not None:
            layer = layer_hook(layer)
        if block_fn is not None:
            return block_fn(x_BTD, layer, positions_T, cfg), None
        return block(x_BTD, layer, positions_T, cfg, sharder), None

    if cfg.remat:  # keep only the block inputs; recompute the insides in the backward pass
        body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
    x_BTD, _ = jax.lax.scan(body, x_BTD, layers, unroll=cfg.n_layers if cfg.unroll_layers else 1)
    x_BTD = rms_norm(x_BTD, final_norm_D, cfg.norm_eps)
    logits_BTV = jnp.einsum("btd,dv->btv", x_BTD, unembed_DV.astype(cdt))
    logits_BTV = constrain(sharder, logits_BTV, ("batch", "seq", "act_vocab"))
    return logits_BTV.astype(jnp.float32)


def block(x_BTD, p, positions_T, cfg: ModelConfig, sharder: Sharder | None = None):
    """One pre-norm transformer block on arrays `p` (one layer's slice of the stack)."""
    x_BTD = x_BTD + attention(rms_norm(x_BTD, p["attn_norm_D"], cfg.norm_eps), p, positions_T,
                              cfg, sharder)  # fmt: skip
    x_BTD = constrain(sharder, x_BTD, ("batch", "seq", "act_embed"))
    x_BTD = x_BTD + mlp(rms_norm(x_BTD, p["mlp_norm_D"], cfg.norm_eps), p, cfg, sharder)
    return constrain(sharder, x_BTD, ("batch", "seq", "act_embed"))


def rms_norm(x, scale, eps):
    # Statistics in f32 even under bf16 compute; cast back so the matmuls stay in compute dtype.
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope(x_BTNK, positions_T, base):
    """Rotary embedding (rotate-half form) on the last axis of [B, T, N, K]."""
    K = x_BTNK.shape[-1]
    inv_freq = base ** (-jnp.arange(0, K, 2, dtype=jnp.float32) / K)
    angles_TK2 = positions_T[:, None].astype(jnp.float32) * inv_freq[None, :]
    cos, sin = jnp.cos(angles_TK2)[None, :, None, :], jnp.sin(angles_TK2)[None, :, None, :]
    x1, x2 = jnp.split(x_BTNK.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTNK.dtype)


def attention(x_BTD, p, positions_T, cfg: ModelConfig, sharder=None):
    """Causal GQA attention. Under tensor parallelism heads are split: no collective until `wo`,
    whose contraction over the sharded heads costs one all-reduce (Megatron g)."""
    cdt = x_BTD.dtype
    B, T, _ = x_BTD.shape
    G, R, K = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    q_BTHK = jnp.einsum("btd,dhk->bthk", x_BTD, p["wq_DHK"].astype(cdt))
    k_BTGK = jnp.einsum("btd,dgk->btgk", x_BTD, p["wk_DGK"].astype(cdt))
    v_BTGK = jnp.einsum("btd,dgk->btgk", x_BTD, p["wv_DGK"].astype(cdt))
    q_BTHK = constrain(sharder, q_BTHK, ("batch", "seq", "act_heads", None))
    q_BTHK = rope(q_BTHK, positions_T, cfg.rope_base)
    k_BTGK = rope(k_BTGK, positions_T, cfg.rope_base)
    # Query head h = g*R + r shares kv head g: group the query heads instead of repeating kv.
    q_BTGRK = q_BTHK.reshape(B, T, G, R, K)
    scores_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BTGK).astype(jnp.float32)
    scores_BGRTS = scores_BGRTS * K**-0.5
    causal_TS = jnp.tril(jnp.ones((T, T), dtype=bool))
    scores_BGRTS = jnp.where(causal_TS, scores_BGRTS, jnp.finfo(jnp.float32).min)
    probs_BGRTS = jax.nn.softmax(scores_BGRTS, axis=-1).astype(cdt)
    out_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", probs_BGRTS, v_BTGK)
    out_BTHK = out_BTGRK.reshape(B, T, G * R, K)
    return jnp.einsum("bthk,hkd->btd", out_BTHK, p["wo_HKD"].astype(cdt))


def mlp(x_BTD, p, cfg: ModelConfig, sharder=None):
    """Column-parallel up (and gate), row-parallel down: one all-reduce under tensor parallelism."""
    h_BTF = constrain(sharder, mlp_hidden(x_BTD, p, cfg), ("batch", "seq", "act_mlp"))
    return jnp.einsum("btf,fd->btd", h_BTF, p["w_down_FD"].astype(x_BTD.dtype))


def mlp_hidden(x_BTD, p, cfg: ModelConfig):
    """The MLP's activation [B, T, F]: SwiGLU silu(x W_gate) * x W_up, or GELU(x W_up). On local
    F shards (tensor parallelism) it needs no collective: the column-parallel half."""
    cdt = x_BTD.dtype
    up_BTF = jnp.einsum("btd,df->btf", x_BTD, p["w_up_DF"].astype(cdt))
    if cfg.mlp == "swiglu":
        gate_BTF = jnp.einsum("btd,df->btf", x_BTD, p["w_gate_DF"].astype(cdt))
        return jax.nn.silu(gate_BTF) * up_BTF
    return jax.nn.gelu(up_BTF)
