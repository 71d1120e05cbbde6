"""Closed-form parameter and FLOP counts for jaxscale's transformer (pure Python).

Checked in the tests against jax.eval_shape (parameters, exact) and against
compiled.cost_analysis()["flops"] (forward FLOPs, within 5%).

What the FLOP count includes: every matmul as 2*m*n*k -- Q, K, V and output projections, the
attention scores QK^T and the weighted sum PV over the FULL T x T matrix (the compiled program
computes the whole masked matrix; `causal=True` halves these two terms, the model-FLOPs
convention used for MFU), the MLP (3 matrices for SwiGLU, 2 for GELU) and the unembedding.
Not included: the embedding lookup (a gather, no FLOPs), norms, RoPE, softmax, activations and
residual adds -- elementwise work that is O(B*T*D) per layer against the matmuls' O(B*T*D^2);
the compiler counts these too, so the two agree within a few percent only when D and F are
large enough that elementwise work is small (see tests/model/test_model.py for the config used).
Backward is 2x forward (two matmuls per forward matmul), so one training step is 3x forward.
An MoE layer's experts run on their capacity buffer (E * C slots per sequence, empty slots
included, jaxscale/model/moe.py): that is what the compiler counts; model FLOPs (MFU) count
the k experts a token uses.
"""

from __future__ import annotations

from jaxscale.config import ModelConfig


def _layer_sizes(cfg: ModelConfig) -> tuple[int, int, int]:
    """(attention + norms of one layer, one MLP or one expert, the router) in parameters."""
    D, H, G, K, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    mlp_mats = 3 if cfg.mlp == "swiglu" else 2
    return 2 * D + D * H * K + 2 * D * G * K + H * K * D, mlp_mats * D * F, D * cfg.n_experts


def param_count(cfg: ModelConfig, experts_per_token: int | None = None) -> int:
    """Every parameter; with `experts_per_token` = k, only those a token uses (MoE active)."""
    L, L_moe, D, V = cfg.n_layers, cfg.n_moe_layers, cfg.d_model, cfg.vocab
    attn, mlp, router = _layer_sizes(cfg)
    E = cfg.n_experts if experts_per_token is None else experts_per_token
    layers = L * attn + (L - L_moe) * mlp + L_moe * (router + E * mlp)
    embed = V * D + (0 if cfg.tied_embeddings else D * V)
    return layers + embed + D


def moe_split(cfg: ModelConfig) -> tuple[int, int]:
    """(shared parameters: everything but the experts, one expert summed over the MoE layers):
    the groups `calc moe` (jaxscale.calc.scaling_laws.MoEConfig) takes."""
    _, mlp, _ = _layer_sizes(cfg)
    return param_count(cfg, experts_per_token=0), cfg.n_moe_layers * mlp


def forward_flops(
    cfg: ModelConfig, batch: int, seq: int, causal: bool = False, executed: bool = True
) -> float:
    """Matmul FLOPs of one forward pass over [batch, seq] tokens. An MoE layer adds the router
    and runs the experts on E * C slots per sequence (`executed`: what the compiled program
    does, empty slots included) or on the k slots a token uses (not `executed`: model FLOPs)."""
    D, H, G, K, V, L = (
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.vocab,
        cfg.n_layers,
    )
    _, mlp_params, router = _layer_sizes(cfg)
    proj = 2 * D * H * K + 2 * 2 * D * G * K + 2 * H * K * D  # q, k and v, o
    attn = 2 * 2 * seq * H * K * (0.5 if causal else 1.0)  # QK^T and PV, per query token
    mlp = 2 * mlp_params
    L_moe = cfg.n_moe_layers
    slots = (cfg.n_experts * cfg.capacity(seq) / seq if executed else cfg.top_k) if L_moe else 0
    per_token = L * (proj + attn) + (L - L_moe) * mlp + L_moe * (2 * router + slots * mlp)
    return float(batch * seq * (per_token + 2 * D * V))


def train_step_flops(
    cfg: ModelConfig, batch: int, seq: int, causal: bool = False, executed: bool = True
) -> float:
    """Forward + backward (2x forward); remat would add one more forward per block."""
    return 3.0 * forward_flops(cfg, batch, seq, causal, executed)
