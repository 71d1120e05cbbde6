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
large enough that elementwise work is small (see tests/test_model.py for the config used).
Backward is 2x forward (two matmuls per forward matmul), so one training step is 3x forward.
"""

from __future__ import annotations

from jaxscale.config import ModelConfig


def param_count(cfg: ModelConfig) -> int:
    D, H, G, K, F, V, L = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                           cfg.vocab, cfg.n_layers)  # fmt: skip
    mlp_mats = 3 if cfg.mlp == "swiglu" else 2
    per_layer = 2 * D + D * H * K + 2 * D * G * K + H * K * D + mlp_mats * D * F
    embed = V * D + (0 if cfg.tied_embeddings else D * V)
    return L * per_layer + embed + D


def forward_flops(cfg: ModelConfig, batch: int, seq: int, causal: bool = False) -> float:
    """Matmul FLOPs of one forward pass over [batch, seq] tokens."""
    D, H, G, K, F, V, L = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                           cfg.vocab, cfg.n_layers)  # fmt: skip
    mlp_mats = 3 if cfg.mlp == "swiglu" else 2
    proj = 2 * D * H * K + 2 * 2 * D * G * K + 2 * H * K * D  # q, k and v, o
    attn = 2 * 2 * seq * H * K * (0.5 if causal else 1.0)  # QK^T and PV, per query token
    mlp = mlp_mats * 2 * D * F
    per_token = L * (proj + attn + mlp) + 2 * D * V
    return float(batch * seq * per_token)


def train_step_flops(cfg: ModelConfig, batch: int, seq: int, causal: bool = False) -> float:
    """Forward + backward (2x forward); remat would add one more forward per block."""
    return 3.0 * forward_flops(cfg, batch, seq, causal)
