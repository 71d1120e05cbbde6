"""The transformer as pure pieces of arrays: embed -> run_layers(block) -> head -> loss.

Every strategy runs this one skeleton and substitutes pieces instead of re-implementing it:
the auto path supplies sharding constraints, tensor parallelism its column/row collectives and
vocab-parallel ends, ZeRO-3 the per-layer all-gather, a pipeline stage calls `run_layers` on its
slice of the stack, MoE swaps the MLP, and serving calls `attend` with the query and key positions
of a KV cache. `Pieces` holds the substitutes; its defaults are the single-device model, which is
the reference every strategy is checked against.

Parameters: `top` = {embed_VD, final_norm_D, unembed_DV (absent when tied)}; one layer's dict
has the keys of `transformer.layer_param_layout` (one slice of the stacked `blocks`).
Axis letters: see jaxscale/config.py (S = key positions, as T is query positions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxscale.config import ModelConfig, remat_group
from jaxscale.model import moe as moe_lib

ACT = ("batch", "seq", "act_embed")  # the residual stream's logical axes


def _identity(x, *_):
    return x


def whole_window(batch_BT1):
    """(inputs [B, T], targets [B, T], positions [T]) of a [B, T+1] token window: the next-token
    pairs of every position (context parallelism substitutes its own chunks)."""
    T = batch_BT1.shape[1] - 1
    return batch_BT1[:, :-1], batch_BT1[:, 1:], jnp.arange(T)


# --- the leaf pieces --------------------------------------------------------------------------


def rms_norm(x, scale, eps):
    # Statistics in f32 even under bf16 compute; cast back so the matmuls stay in compute dtype.
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope(x_BTNK, positions, base):
    """Rotary embedding (rotate-half form) on the last axis of [B, T, N, K] at `positions`:
    [T] shared by the rows, or [B, T] per row (a batch of requests at different lengths)."""
    K = x_BTNK.shape[-1]
    inv_freq = base ** (-jnp.arange(0, K, 2, dtype=jnp.float32) / K)
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [T, K/2] or [B, T, K/2]
    cos, sin = jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]  # over the N axis
    x1, x2 = jnp.split(x_BTNK.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTNK.dtype)


def attend(q_BTHK, k_BSGK, v_BSGK, q_positions_T, k_positions_S):
    """Causal GQA attention: query t sees key s iff k_positions[s] <= q_positions[t]. Query
    positions may be per row, [B, T] (a batch of requests decoding at different lengths).

    The one attention core of training, sequence parallelism, prefill and decode: queries and
    keys carry their own positions, so a KV cache (S slots, unused ones at a position larger than
    any query) and a sequence-parallel gather use it unchanged. R = H/G query heads share each
    kv head (read from the shapes, so a contiguous split of H and G keeps it)."""
    B, T, H, K = q_BTHK.shape
    G = k_BSGK.shape[2]
    q_BTGRK = q_BTHK.reshape(B, T, G, H // G, K)
    scores_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BSGK).astype(jnp.float32)
    scores_BGRTS = scores_BGRTS * K**-0.5
    causal = q_positions_T[..., :, None] >= k_positions_S[None, :]  # [T, S] or [B, T, S]
    # The mask as an additive bias (0 or f32 min: s + min rounds to min, as the select gave):
    # an add keeps no residual for the backward, where a select keeps its [B, G, R, T, S]
    # predicate -- loop-invariant in a layer scan, so hoisted and read by every step.
    bias = jnp.where(causal, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)
    if bias.ndim == 3:
        bias = bias[:, None, None]  # [B, 1, 1, T, S] against [B, G, R, T, S]
    scores_BGRTS = scores_BGRTS + bias
    probs_BGRTS = jax.nn.softmax(scores_BGRTS, axis=-1).astype(q_BTHK.dtype)
    out_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", probs_BGRTS, v_BSGK)
    return out_BTGRK.reshape(B, T, H, K)


def mlp_inputs(x_BTD, p, cfg: ModelConfig) -> tuple:
    """The MLP's weight matmuls before its activation: (x W_gate, x W_up) for SwiGLU, (x W_up,)
    for GELU, each [B, T, F]. On local F shards (tensor parallelism) no collective: the
    column-parallel half."""
    cdt = x_BTD.dtype
    up_BTF = jnp.einsum("btd,df->btf", x_BTD, p["w_up_DF"].astype(cdt))
    if cfg.mlp == "swiglu":
        return jnp.einsum("btd,df->btf", x_BTD, p["w_gate_DF"].astype(cdt)), up_BTF
    return (up_BTF,)


def mlp_activation(inputs, cfg: ModelConfig):
    """The activation [B, T, F] of `mlp_inputs`: silu(gate) * up, or GELU(up)."""
    if cfg.mlp == "swiglu":
        gate_BTF, up_BTF = inputs
        return jax.nn.silu(gate_BTF) * up_BTF
    return jax.nn.gelu(inputs[0])


def cross_entropy(logits_BTV, targets_BT):
    """Mean next-token cross-entropy in nats (f32)."""
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    nll_BT = -jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
    return jnp.mean(nll_BT)


# --- the substitutable pieces -----------------------------------------------------------------


def qkv(h_BTD, p, positions, cfg: ModelConfig, pc: Pieces):
    """Q [B, T, H, K], K and V [B, T, G, K] of the normed input, RoPE applied at `positions`
    ([T], or [B, T] per row). Under tensor parallelism the heads are local shards."""
    cdt = h_BTD.dtype
    q_BTHK = jnp.einsum("btd,dhk->bthk", h_BTD, p["wq_DHK"].astype(cdt))
    k_BTGK = jnp.einsum("btd,dgk->btgk", h_BTD, p["wk_DGK"].astype(cdt))
    v_BTGK = jnp.einsum("btd,dgk->btgk", h_BTD, p["wv_DGK"].astype(cdt))
    q_BTHK = pc.constrain(q_BTHK, ("batch", "seq", "act_heads", None))
    q_BTHK = rope(q_BTHK, positions, cfg.rope_base)
    return q_BTHK, rope(k_BTGK, positions, cfg.rope_base), v_BTGK


def out_proj(out_BTHK, p):
    """The output projection [B, T, H, K] -> [B, T, D]: row-parallel under tensor parallelism."""
    return jnp.einsum("bthk,hkd->btd", out_BTHK, p["wo_HKD"].astype(out_BTHK.dtype))


def attention(h_BTD, p, positions, cfg: ModelConfig, pc: Pieces, kv=None):
    """Q/K/V projections, RoPE, `pc.attend`, output projection: (out [B, T, D], kv). Under
    tensor parallelism the heads are local shards: no collective until the caller's `pc.leave`
    (Megatron g). With a cache `kv` = (every layer's keys and values, this layer's index),
    `pc.cache` (its layout: contiguous or paged, model/kv_cache.py) writes the new keys and
    values at their positions, and the queries attend over the live slots; the updated `kv` is
    returned."""
    q_BTHK, k_BTGK, v_BTGK = qkv(h_BTD, p, positions, cfg, pc)
    if kv is not None:
        cache, layer = kv
        cache = pc.cache.write(cache, layer, k_BTGK, v_BTGK, positions)
        out_BTHK = pc.cache.attend(q_BTHK, cache, layer, positions)
        kv = (cache, layer)
    elif cfg.attention_impl != "jaxscale" and pc.attend is attend:
        # The fused kernels know the causal pattern only: queries and keys at the same positions,
        # true here (both are `positions`). A strategy that substitutes the core (sequence
        # parallelism's gathered keys) keeps its own.
        out_BTHK = jax.nn.dot_product_attention(
            q_BTHK, k_BTGK, v_BTGK, is_causal=True, implementation=cfg.attention_impl
        )
    else:
        out_BTHK = pc.attend(q_BTHK, k_BTGK, v_BTGK, positions, positions)
    return out_proj(out_BTHK, p), kv


def mlp(h_BTD, p, cfg: ModelConfig, pc: Pieces):
    """Column-parallel up (and gate), row-parallel down: one all-reduce under tensor parallelism
    (the caller's `pc.leave`).

    The activation and the down-projection run under `jax.checkpoint`: the backward keeps the two
    matmul outputs and recomputes the elementwise activation from them, where autodiff would keep
    the activation and its intermediate terms too (four more [B, T, F] per layer). No matmul is
    recomputed (the down-projection's output feeds nothing the backward needs), and in the layer
    scan each kept value is a stacked residual, so this cuts the scan's stack traffic
    (docs/performance.md). Not where `pc.mlp_act` holds a collective (tensor parallelism's
    gather_output): the backward would repeat it."""
    cdt = h_BTD.dtype

    def act_down(inputs, w_down_FD):
        act_BTF = pc.constrain(mlp_activation(inputs, cfg), ("batch", "seq", "act_mlp"))
        return jnp.einsum("btf,fd->btd", pc.mlp_act(act_BTF), w_down_FD)

    if pc.mlp_act is _identity:
        act_down = jax.checkpoint(act_down)
    return act_down(mlp_inputs(h_BTD, p, cfg), p["w_down_FD"].astype(cdt))


def embed(top, tokens_BT, cfg: ModelConfig, pc: Pieces):
    """x [B, T, D] = embed_VD[tokens] in compute dtype."""
    # FSDP stores the table's embed dim sharded; gather it before the lookup (one all-gather),
    # leaving the vocab split (tensor) for the masked gather GSPMD knows how to partition.
    embed_VD = pc.constrain(top["embed_VD"], ("vocab", None))
    x_BTD = jnp.take(embed_VD, tokens_BT, axis=0).astype(jnp.dtype(cfg.compute_dtype))
    return pc.constrain(x_BTD, ACT)


def unembed_matrix(top, cfg: ModelConfig):
    return top["embed_VD"].T if cfg.tied_embeddings else top["unembed_DV"]


def head(top, x_BTD, cfg: ModelConfig, pc: Pieces):
    """Final norm and unembedding: logits [B, T, V] in compute dtype."""
    x_BTD = pc.enter(rms_norm(x_BTD, top["final_norm_D"], cfg.norm_eps))
    unembed_DV = unembed_matrix(top, cfg).astype(x_BTD.dtype)
    logits_BTV = jnp.einsum("btd,dv->btv", x_BTD, unembed_DV)
    return pc.constrain(logits_BTV, ("batch", "seq", "act_vocab"))


def block(x_BTD, p, positions, cfg: ModelConfig, pc: Pieces, kv=None):
    """One pre-norm transformer block on one layer's arrays `p`: (x, statistics, kv), where the
    statistics are an MoE layer's (jaxscale/model/moe.py) and empty for a dense layer, and `kv`
    is (the cache after the block wrote its keys and values, the layer's index), or None."""
    h_BTD = pc.enter(rms_norm(x_BTD, p["attn_norm_D"], cfg.norm_eps))
    a_BTD, kv = attention(h_BTD, p, positions, cfg, pc, kv)
    x_BTD = pc.constrain(x_BTD + pc.leave(a_BTD), ACT)
    h_BTD = pc.enter(rms_norm(x_BTD, p["mlp_norm_D"], cfg.norm_eps))
    if moe_lib.is_moe_layer(p):
        y_BTD, aux = pc.moe(h_BTD, p, cfg, pc)
    else:
        y_BTD, aux = pc.mlp(h_BTD, p, cfg, pc), {}
    return pc.constrain(x_BTD + pc.leave(y_BTD), ACT), aux, kv


@dataclass(frozen=True)
class Pieces:
    """What a strategy substitutes. The defaults are the single-device model.

    constrain(x, logical)   sharding constraint at a boundary (the auto path; else identity)
    enter(h) / leave(y)     around every column-parallel / row-parallel pair: tensor
                            parallelism's f and g (identity, all-reduce) or sequence
                            parallelism's all-gather and reduce-scatter along T
    attend, mlp, mlp_act    the attention core, the MLP, the MLP activation
    moe, experts, stat      an MoE layer's MLP (moe.moe_mlp), the experts on its dispatch
                            buffer (expert parallelism's all-to-alls), and the reduction that
                            makes a routing statistic one value across a tensor group
    seq_mean                a per-sequence mean over this device's tokens made the whole
                            sequence's (context parallelism: the mean over its axis)
    embed, head, loss       the two ends (vocab parallelism substitutes all three)
    layer_hook(layer)       runs inside the layer loop before a layer is used (ZeRO-3 gathers
                            that layer's shards there, so only one layer is ever whole)
    top_hook(top)           the same for the embedding, final norm and unembedding
    run_hook(layers)        with run_groups = k > 0 the layers are scanned in runs of k groups
                            (as remat every:K does); the hook takes each run's stacked layers
                            as the run starts (gradient buckets cast them to varying there, so
                            autodiff all-reduces each run's gradients in the backward loop)
    window(batch)           the (inputs, targets, positions) this device trains on, from a
                            [B, T+1] token window: all of it, or context parallelism's chunks
    cache                   a KV cache's layout (model/kv_cache.Layout: contiguous or paged):
                            write a layer's new keys and values at their positions, attend over
                            the live slots; None: no cache
    """

    constrain: Callable = _identity
    enter: Callable = _identity
    leave: Callable = _identity
    attend: Callable = attend
    mlp: Callable = mlp
    mlp_act: Callable = _identity
    moe: Callable = moe_lib.moe_mlp
    experts: Callable = moe_lib.local_experts
    stat: Callable = _identity
    seq_mean: Callable = _identity
    block: Callable = block
    embed: Callable = embed
    head: Callable = head
    loss: Callable = cross_entropy
    layer_hook: Callable = _identity
    top_hook: Callable = _identity
    run_hook: Callable = _identity
    run_groups: int = 0  # the layer groups of one run; 0: no runs (unless the remat policy's)
    window: Callable = whole_window
    cache: object = None  # model/kv_cache.Layout

    def replace(self, **changes) -> Pieces:
        return replace(self, **changes)


DENSE = Pieces()


def run_layers(x_BTD, layers, positions, cfg: ModelConfig, pc: Pieces = DENSE, cache=None):
    """Scan `pc.block` over the stacked `layers` (leading axis: this slice of the stack).

    With experts the scan runs over groups of n = moe_every layers, the last of each MoE: a key
    stacked over all layers gives each layer of the group its slice, the dense MLP's keys (L - L/n
    layers) the first n - 1, the router's and experts' (L/n) the last. `cache` ({"k", "v"}, each
    [L, ...] in `pc.cache`'s layout) rides in the scan's carry, each layer writing its slots in
    place and reading only the live ones (as scanned inputs and outputs, every step would copy
    the whole cache). Returns (x, statistics of the MoE layers stacked [L/n, ...] (empty for a
    dense model), the updated cache or None)."""
    n = cfg.moe_every if cfg.n_experts else 1
    groups = layers["attn_norm_D"].shape[0] // n  # attention and norms stack every layer

    def by_group(tree):
        # A dense model scans the stacks themselves, so a layer's arrays are the scan's slices:
        # the backward loop then re-slices the stacks instead of a residual copy of every weight
        # (scan forwards an input as a residual, not a value computed from one, like v[i]).
        if n == 1:
            return tree
        return {k: v.reshape(groups, v.shape[0] // groups, *v.shape[1:]) for k, v in tree.items()}

    def layer_fn(x_BTD, layer, kv):
        x_BTD = checkpoint_name(x_BTD, BLOCK_INPUT)  # what offload moves to host memory
        return pc.block(x_BTD, pc.layer_hook(layer), positions, cfg, pc, kv)

    if cfg.remat in _SAVED:  # keep the block inputs (and, dots, the weight matmuls' outputs;
        # offload: the inputs in host memory); recompute the rest in the backward, with the
        # collectives it holds
        layer_fn = jax.checkpoint(layer_fn, policy=_SAVED[cfg.remat])

    def body(carry, xs):
        x_BTD, cache = carry
        group, g = xs
        stats = {}
        for i in range(n):
            kv = None if cache is None else (cache, g * n + i)
            layer = group if n == 1 else _group_layer(group, i, n, cfg)
            x_BTD, aux, kv = layer_fn(x_BTD, layer, kv)
            cache = None if kv is None else kv[0]
            stats = aux or stats
        return (x_BTD, cache), stats

    def scan(carry, xs):
        return jax.lax.scan(body, carry, xs, unroll=len(xs[1]) if cfg.unroll_layers else 1)

    xs = (by_group(layers), jnp.arange(groups))
    checkpointed = remat_group(cfg.remat, groups)  # every:K, sqrt: runs of K under checkpoint
    k = pc.run_groups or checkpointed
    if k is None:
        (x_BTD, cache), stats = scan((x_BTD, cache), xs)
        return x_BTD, stats, cache

    def run(carry, run_xs):
        group, g = run_xs
        return scan(carry, (pc.run_hook(group), g))

    if checkpointed:
        run = jax.checkpoint(run, policy=jax.checkpoint_policies.nothing_saveable)
    return _runs(run, (x_BTD, cache), xs, min(k, groups), cfg.unroll_layers)


BLOCK_INPUT = "block_input"
_SAVED = {
    "block": jax.checkpoint_policies.nothing_saveable,
    # the matmuls against weights (no batch dimension); attention's q.k and p.v are recomputed
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # block's residual, each block's input, kept in pinned host memory: the forward copies it
    # out, the backward copies it back before recomputing the block (XLA:CPU drops the copies)
    "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=[BLOCK_INPUT],
        offload_src="device",
        offload_dst="pinned_host",
    ),
}


def _runs(run, carry, xs, k: int, unroll: bool):
    """`run` (a scan of k layer groups) scanned over the groups in runs of k; a last shorter run
    takes the remainder. Under checkpoint (every:K, sqrt) the backward keeps each run's input
    (G/k of them) and recomputes one run's k layers at a time, whose insides are then all live
    together; with gradient buckets (parallel/buckets.py) each run's `pc.run_hook` places one
    all-reduce in the backward. Returns (x, stats, cache) as `run_layers`."""
    runs, rest = divmod(len(xs[1]), k)
    head = jax.tree.map(lambda v: v[: runs * k].reshape(runs, k, *v.shape[1:]), xs)
    carry, stats = jax.lax.scan(run, carry, head, unroll=runs if unroll else 1)
    stats = jax.tree.map(lambda v: v.reshape(runs * k, *v.shape[2:]), stats)
    if rest:
        carry, tail = run(carry, jax.tree.map(lambda v: v[runs * k :], xs))
        stats = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), stats, tail)
    (x_BTD, cache) = carry
    return x_BTD, stats, cache


def _group_layer(group, i, n, cfg: ModelConfig):
    """Layer i of a group of n (the last an MoE layer when the model has experts)."""
    moe_layer = bool(cfg.n_experts) and i == n - 1
    layer = {}
    for k, v in group.items():
        if k in moe_lib.MOE_KEYS:
            if moe_layer:
                layer[k] = v[0]
        elif k not in MLP_KEYS or not moe_layer:
            layer[k] = v[i]
    return layer


MLP_KEYS = ("w_up_DF", "w_gate_DF", "w_down_FD")  # a dense layer's MLP (absent in MoE layers)


def split_params(params):
    """(top, stacked layers) of a parameter dict."""
    return {k: v for k, v in params.items() if k != "blocks"}, params["blocks"]


def trunk(params, tokens_BT, positions, cfg: ModelConfig, pc: Pieces = DENSE, cache=None):
    """The model's one skeleton, embed -> layers: (top after `pc.top_hook`, the residual stream
    [B, T, D] after the last layer (before the final norm), MoE statistics, cache). Training,
    evaluation, RLHF's scalar heads, prefill and decode all run it; they differ in what reads
    the stream (`pc.head` and `pc.loss`, a scalar head) and in the pieces and cache they pass."""
    top, layers = split_params(params)
    top = pc.top_hook(top)
    x_BTD = pc.embed(top, tokens_BT, cfg, pc)
    x_BTD, stats, cache = run_layers(x_BTD, layers, positions, cfg, pc, cache)
    return top, x_BTD, stats, cache


def logits(params, tokens_BT, cfg: ModelConfig, pc: Pieces = DENSE):
    """The whole model: tokens [B, T] -> logits [B, T, V] float32."""
    top, x_BTD, _, _ = trunk(params, tokens_BT, jnp.arange(tokens_BT.shape[1]), cfg, pc)
    return pc.head(top, x_BTD, cfg, pc).astype(jnp.float32)


def head_loss(top, x_BTD, targets_BT, cfg: ModelConfig, pc: Pieces = DENSE):
    """What training reads from the trunk's stream: the final norm and unembedding (`pc.head`)
    and the mean next-token cross-entropy against `targets_BT` (`pc.loss`)."""
    return pc.loss(pc.head(top, x_BTD, cfg, pc), targets_BT)


def loss_terms(params, batch_BT1, cfg: ModelConfig, pc: Pieces = DENSE):
    """(training loss, its terms) on a [B, T+1] token window (a strategy's local rows).

    The loss is the mean next-token cross-entropy plus, with experts, aux_loss_weight x the
    load-balancing loss and z_loss_weight x the router z-loss (each a mean over MoE layers).
    Terms: ce; with experts also aux_loss, z_loss, drop_fraction and expert_load [L/n, E]."""
    inputs_BT, targets_BT, positions_T = pc.window(batch_BT1)
    top, x_BTD, stats, _ = trunk(params, inputs_BT, positions_T, cfg, pc)
    ce = head_loss(top, x_BTD, targets_BT, cfg, pc)
    if not stats:
        return ce, {"ce": ce}
    terms = {
        "ce": ce,
        "aux_loss": jnp.mean(stats["aux"]),
        "z_loss": jnp.mean(stats["z"]),
        "drop_fraction": jnp.mean(stats["drop"]),
        "expert_load": stats["load"],
    }
    return ce + router_loss(stats, cfg), terms


def router_loss(stats, cfg: ModelConfig):
    """The router losses added to the training loss: aux_loss_weight x the balance loss and
    z_loss_weight x the z-loss, each a mean over all L/n MoE layers -- here summed over the
    layers `stats` holds (all of them, or one pipeline stage's share)."""
    if not stats:
        return jnp.zeros((), jnp.float32)
    per_layer = cfg.aux_loss_weight * stats["aux"] + cfg.z_loss_weight * stats["z"]
    return jnp.sum(per_layer) / cfg.n_moe_layers


def loss(params, batch_BT1, cfg: ModelConfig, pc: Pieces = DENSE):
    """Mean next-token loss of a [B, T+1] token window (on a strategy's local rows), plus the
    router's losses when the model has experts (`loss_terms`)."""
    return loss_terms(params, batch_BT1, cfg, pc)[0]
