"""Training FLOPs: the 6ND rule and a transformer's per-token count (seed 001 §5).

A matmul [m, k] @ [k, n] costs 2*m*k*n FLOPs (a multiply and an add). Per token, a block of width
D with an MLP of width F = 4D does:
  Q, K, V, O projections   4 * 2*D*D = 8 D^2
  MLP up + down            2 * 2*D*F = 16 D^2  (F = 4D)
  attention scores         QK^T and AV, each 2*T*D for T keys -> 4*T*D  (optional)
i.e. 24 D^2 per layer forward = 2 FLOPs per weight (12 D^2 weights). The backward pass needs the
gradient with respect to the activations and to the weights, two matmuls for each forward one, so
backward = 2 x forward and a training step = 3 x forward = 6 FLOPs per parameter per token.
"""

from dataclasses import dataclass

from jaxscale.checks import positive

FORWARD_FLOPS_PER_PARAM = 2
BACKWARD_TO_FORWARD = 2  # dL/dx and dL/dW: two matmuls per forward matmul
TRAINING_FLOPS_PER_PARAM = FORWARD_FLOPS_PER_PARAM * (1 + BACKWARD_TO_FORWARD)  # 6

# Seed 001 §5: the default vocabulary of its calculate_transformer_flops.
SEED_DEFAULT_VOCAB = 50000


def training_flops(n_params: float, n_tokens: float) -> float:
    """Total training FLOPs C = 6 * N * D (seed 001 §2 and §4)."""
    positive(n_params=n_params, n_tokens=n_tokens)
    return TRAINING_FLOPS_PER_PARAM * n_params * n_tokens


@dataclass(frozen=True)
class TransformerFlops:
    """Forward FLOPs PER TOKEN by component; backward and step derived."""

    attention_projections: float  # per layer: Q, K, V, O
    attention_scores: float  # per layer: QK^T and AV (0 when not counted)
    mlp: float  # per layer
    unembedding: float  # once per token: the logits matmul (the embedding lookup is free)
    n_layers: int

    @property
    def fwd_per_layer(self) -> float:
        return self.attention_projections + self.attention_scores + self.mlp

    @property
    def fwd_total(self) -> float:
        return self.n_layers * self.fwd_per_layer + self.unembedding

    @property
    def bwd_total(self) -> float:
        return BACKWARD_TO_FORWARD * self.fwd_total

    @property
    def step_total(self) -> float:
        return self.fwd_total + self.bwd_total


def transformer_flops_per_token(
    d_model: int,
    n_layers: int,
    seq_len: int,
    vocab_size: int = SEED_DEFAULT_VOCAB,
    *,
    include_attention: bool = False,
    causal: bool = False,
    d_ff: int | None = None,
    seed_faithful: bool = False,
) -> TransformerFlops:
    """Per-token FLOPs of a decoder-only transformer (seed 001 §5, calculate_transformer_flops).

    include_attention counts the score and value matmuls: 4*T*D per token and layer, halved when
    `causal` (a token attends to (T+1)/2 keys on average, rounded to T/2). seed_faithful uses the
    seed's 2*D*T^2 (its "FLOPs Calculation"): the per-SEQUENCE cost of one of the two matmuls, added
    to per-token FLOPs; for GPT-3 at T=2048 it overstates attention ~1000x.
    """
    positive(d_model=d_model, n_layers=n_layers, seq_len=seq_len, vocab_size=vocab_size)
    d_ff = 4 * d_model if d_ff is None else d_ff
    positive(d_ff=d_ff)
    scores = 0.0
    if include_attention:
        if seed_faithful:
            scores = 2 * d_model * seq_len * seq_len
        else:
            scores = 4 * seq_len * d_model / (2 if causal else 1)
    return TransformerFlops(
        attention_projections=4 * 2 * d_model * d_model,
        attention_scores=scores,
        mlp=2 * 2 * d_model * d_ff,
        unembedding=2 * vocab_size * d_model,
        n_layers=n_layers,
    )


@dataclass(frozen=True)
class SixNCheck:
    name: str
    n_params: float
    detailed_flops: float  # per token, fwd + bwd, from the per-layer count
    six_n_flops: float  # 6 * N

    @property
    def ratio(self) -> float:
        return self.detailed_flops / self.six_n_flops


# Seed 001 §5's verify_6n_rule models: (name, nominal params, d_model, layers).
SIX_N_MODELS = (
    ("LLaMA-7B", 7e9, 4096, 32),
    ("LLaMA-70B", 70e9, 8192, 80),
    ("GPT-3", 175e9, 12288, 96),
)


def check_six_n(
    name: str, n_params: float, d_model: int, n_layers: int, vocab_size: int = SEED_DEFAULT_VOCAB
) -> SixNCheck:
    """Compare the per-layer count at seq_len 1 (no attention scores) with 6N, as the seed does."""
    detailed = transformer_flops_per_token(d_model, n_layers, 1, vocab_size)
    return SixNCheck(name, n_params, detailed.step_total, TRAINING_FLOPS_PER_PARAM * n_params)
