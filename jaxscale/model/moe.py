"""Mixture of experts: router, top-k, capacity, dispatch to experts and gate-weighted combine.

One MoE layer replaces a block's MLP (`Pieces.moe`). Per token: router logits h W_router [E],
softmax, `lax.top_k` picks X = k experts, and their gates are the chosen probabilities,
renormalised to sum to 1 when k > 1 (with k = 1 the raw probability is kept, as Switch does:
renormalised it would be 1 and the router would learn from the balance loss alone).

Routing groups are sequences. In each sequence of T tokens an expert has C = cfg.capacity(T)
slots (ceil(cf * T * k / E), or T when dropless: the worst case, so nothing can overflow). A
token's slot is its rank among the sequence's tokens sent to that expert, first choices before
second choices and then in token order (a one-hot cumsum); an assignment past C is dropped: its
gate-weighted expert output is missing and the token keeps only its residual. Because a group
is one row, capacity, drops and the balance loss do not depend on how the batch is split over
devices or microbatches, so a sharded run drops exactly the tokens the single-device run drops.

Dispatch is a scatter into an expert-major buffer [E, B, C, D] and combine a gather from it
(no one-hot matmuls, so the compiler's FLOP count is the experts' matmuls). `Pieces.experts`
maps that buffer to the experts' outputs: all experts local by default; expert parallelism
(parallel/ep.py) wraps the local experts in the two all-to-alls; tensor parallelism splits
every expert's F (its row-parallel output is summed by the block's `leave`).

The oracle, `reference_mlp`, gathers each token's k experts' weights and applies them: no
buffer, no capacity; with a mask of dropped assignments it is what the capacity mode must equal.

Statistics per layer (means over the sequences, so they reduce over data shards by a mean):
  aux     Switch load balance E * sum_e f_e P_e (f_e: share of the sequence's T*k assignments
          routed to e, before drops; P_e: mean router probability); 1 when perfectly balanced
  z       router z-loss: mean over tokens of logsumexp(logits)^2
  drop    dropped assignments / (T * k)
  load    f_e per expert [E] (its max over its mean, 1/E, is the load imbalance)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxscale.config import ModelConfig

ROUTER = "w_router_DE"
EXPERT_KEYS = ("we_up_EDF", "we_gate_EDF", "we_down_EFD")
MOE_KEYS = (ROUTER, *EXPERT_KEYS)


def is_moe_layer(p) -> bool:
    return ROUTER in p


def route(h_BTD, w_router_DE, cfg: ModelConfig):
    """(logits [B, T, E] f32, probs [B, T, E], gates [B, T, X], experts [B, T, X] int32)."""
    # in f32 even under bf16 compute (Switch's selective precision): a bf16 logit rounds near
    # ties, and a flipped choice sends the token to another expert
    f32 = jnp.float32
    logits_BTE = jnp.einsum("btd,de->bte", h_BTD.astype(f32), w_router_DE.astype(f32))
    probs_BTE = jax.nn.softmax(logits_BTE, axis=-1)
    top_BTX, expert_BTX = jax.lax.top_k(probs_BTE, cfg.top_k)
    gates_BTX = top_BTX / jnp.sum(top_BTX, -1, keepdims=True) if cfg.top_k > 1 else top_BTX
    return logits_BTE, probs_BTE, gates_BTX, expert_BTX


def slots(expert_BTX, n_experts: int):
    """Each assignment's rank among its sequence's assignments to the same expert [B, T, X]:
    first choices before second choices, then token order (one-hot cumsum)."""
    B, T, X = expert_BTX.shape
    onehot_BXTE = jax.nn.one_hot(expert_BTX.swapaxes(1, 2), n_experts, dtype=jnp.int32)
    rank_BNE = jnp.cumsum(onehot_BXTE.reshape(B, X * T, n_experts), axis=1) - 1
    rank_BXT = jnp.sum(rank_BNE * onehot_BXTE.reshape(B, X * T, n_experts), -1)
    return rank_BXT.reshape(B, X, T).swapaxes(1, 2)


def stats(logits_BTE, probs_BTE, expert_BTX, kept_BTX, n_experts: int, seq_mean=None) -> dict:
    """The layer's balance, z-loss, drop fraction and per-expert load (module docstring).
    `seq_mean` makes a mean over this device's tokens of a sequence the mean over the whole
    sequence (context parallelism: a mean over the axis) before any product is taken."""
    seq_mean = seq_mean or (lambda x: x)
    X = expert_BTX.shape[-1]
    counts_BTE = jnp.sum(jax.nn.one_hot(expert_BTX, n_experts, dtype=jnp.float32), axis=2)
    f_BE = seq_mean(jnp.mean(counts_BTE, axis=1) / X)  # share of the sequence's assignments
    p_BE = seq_mean(jnp.mean(probs_BTE, axis=1))
    z_BT = jnp.square(jax.nn.logsumexp(logits_BTE, axis=-1))
    return {
        "aux": jnp.mean(n_experts * jnp.sum(f_BE * p_BE, -1)),
        "z": seq_mean(jnp.mean(z_BT)),
        "drop": seq_mean(1.0 - jnp.mean(kept_BTX.astype(jnp.float32))),
        "load": jnp.mean(f_BE, axis=0),
    }


def local_experts(buf_EGCD, p, cfg: ModelConfig):
    """Every expert on its own slots: [E_local, G, C, D] -> [E_local, G, C, D]. Under tensor
    parallelism F is this device's slice and the output a partial sum (the caller's g)."""
    cdt = buf_EGCD.dtype
    up_EGCF = jnp.einsum("egcd,edf->egcf", buf_EGCD, p["we_up_EDF"].astype(cdt))
    if cfg.mlp == "swiglu":
        gate_EGCF = jnp.einsum("egcd,edf->egcf", buf_EGCD, p["we_gate_EDF"].astype(cdt))
        act_EGCF = jax.nn.silu(gate_EGCF) * up_EGCF
    else:
        act_EGCF = jax.nn.gelu(up_EGCF)
    return jnp.einsum("egcf,efd->egcd", act_EGCF, p["we_down_EFD"].astype(cdt))


def moe_mlp(h_BTD, p, cfg: ModelConfig, pc):
    """The MoE MLP of one layer: (y [B, T, D], statistics). `pc.experts` runs the experts on
    the dispatch buffer (the all-to-alls of expert parallelism live there); `pc.stat` makes
    a statistic computed identically across a tensor group one value (a mean over it)."""
    B, T, D = h_BTD.shape
    E, C = cfg.n_experts, cfg.capacity(T)
    logits_BTE, probs_BTE, gates_BTX, expert_BTX = route(h_BTD, p[ROUTER], cfg)
    slot_BTX = slots(expert_BTX, E)
    kept_BTX = slot_BTX < C
    b_BTX = jnp.broadcast_to(jnp.arange(B)[:, None, None], expert_BTX.shape)
    # a dropped assignment's slot is out of range: the scatter drops it, the gather masks it
    slot_BTX = jnp.where(kept_BTX, slot_BTX, C)
    tokens_BTXD = jnp.broadcast_to(h_BTD[:, :, None, :], (*expert_BTX.shape, D))
    buf_EBCD = jnp.zeros((E, B, C, D), h_BTD.dtype)
    buf_EBCD = buf_EBCD.at[expert_BTX, b_BTX, slot_BTX].add(tokens_BTXD, mode="drop")
    out_EBCD = pc.experts(buf_EBCD, p, cfg)
    out_BTXD = out_EBCD.at[expert_BTX, b_BTX, slot_BTX].get(mode="fill", fill_value=0)
    # the combine in f32 too: its transpose is the router's gradient (a sum over D per gate)
    weight_BTX = gates_BTX * kept_BTX
    y_BTD = jnp.einsum("btxd,btx->btd", out_BTXD.astype(jnp.float32), weight_BTX)
    y_BTD = y_BTD.astype(h_BTD.dtype)
    aux = stats(logits_BTE, probs_BTE, expert_BTX, kept_BTX, E, pc.seq_mean)
    return y_BTD, jax.tree.map(pc.stat, aux)


def reference_mlp(h_BTD, p, cfg: ModelConfig, dropped_BTX=None):
    """The oracle: each token through its k chosen experts, weights gathered per token, no
    capacity. `dropped_BTX` (bool) removes those assignments' contributions."""
    _, _, gates_BTX, expert_BTX = route(h_BTD, p[ROUTER], cfg)
    cdt = h_BTD.dtype
    up_BTXDF = p["we_up_EDF"][expert_BTX].astype(cdt)
    up_BTXF = jnp.einsum("btd,btxdf->btxf", h_BTD, up_BTXDF)
    if cfg.mlp == "swiglu":
        gate_BTXF = jnp.einsum("btd,btxdf->btxf", h_BTD, p["we_gate_EDF"][expert_BTX].astype(cdt))
        act_BTXF = jax.nn.silu(gate_BTXF) * up_BTXF
    else:
        act_BTXF = jax.nn.gelu(up_BTXF)
    out_BTXD = jnp.einsum("btxf,btxfd->btxd", act_BTXF, p["we_down_EFD"][expert_BTX].astype(cdt))
    if dropped_BTX is not None:
        gates_BTX = jnp.where(dropped_BTX, 0.0, gates_BTX)
    return jnp.einsum("btxd,btx->btd", out_BTXD, gates_BTX.astype(cdt))
