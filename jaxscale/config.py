"""Frozen configuration dataclasses: the model and the training run.

Axis alphabet used in names throughout jaxscale (documented once, here):
  B batch, T sequence, D d_model (embed), H query heads, G kv heads, R = H/G heads per kv group,
  K head_dim, F d_ff (mlp), V vocab, L layers, M microbatches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A decoder-only transformer. Defaults are the tiny test model."""

    vocab: int = 256  # byte-level tokenizer: one token per byte
    d_model: int = 64  # D
    n_layers: int = 2  # L, stacked and scanned so pipeline stages can slice them
    n_heads: int = 8  # H
    n_kv_heads: int = 4  # G (GQA); == n_heads is MHA, 1 is MQA
    d_ff: int = 128  # F
    max_seq: int = 128  # longest sequence RoPE and sampling accept
    mlp: str = "swiglu"  # "swiglu" (3 matrices) or "gelu" (2 matrices)
    tied_embeddings: bool = False  # True: logits use the input embedding transposed
    rope_base: float = 10_000.0
    norm_eps: float = 1e-6
    compute_dtype: str = "float32"  # dtype of matmuls and activations
    param_dtype: str = "float32"  # dtype parameters (and Adam state) are stored in
    remat: bool = False  # recompute each block in the backward pass (jax.checkpoint)
    # Unroll the layer scan. The compiler's cost_analysis counts a loop body once, so FLOPs
    # read from a compiled program are per-layer-exact only when the layers are unrolled.
    unroll_layers: bool = False

    def __post_init__(self):
        positive = ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model} "
                f"(head_dim would be {self.d_model / self.n_heads:g})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads} (GQA groups)"
            )
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.mlp not in ("swiglu", "gelu"):
            raise ValueError(f"mlp must be 'swiglu' or 'gelu', got {self.mlp!r}")
        for name in ("compute_dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:  # K
        return self.d_model // self.n_heads

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


# Named model sizes for the CLI (`--model`). "tiny" is the test model; "small" the bench default.
MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "small": ModelConfig(d_model=256, n_layers=4, n_heads=8, n_kv_heads=8, d_ff=1024, max_seq=256),
    "medium": ModelConfig(d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, d_ff=2048, max_seq=512),
}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run. `global_batch` sequences of `seq_len` tokens per optimizer step."""

    steps: int = 300
    global_batch: int = 16  # sequences per optimizer step, summed over all data-parallel shards
    seq_len: int = 64
    grad_accum: int = 1  # microbatches per step; gradients are reduced once per step
    lr: float = 3e-3  # peak learning rate
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.1  # AdamW, not applied to norm scales
    optimizer: str = "adamw"  # "adamw" (no decay on norm scales) or "sgd" (plain, no momentum)
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float = 1.0  # global-norm clipping; 0 disables
    seed: int = 0
    eval_every: int = 50  # steps between eval-loss measurements; 0 disables
    eval_batches: int = 4
    ckpt_every: int = 0  # steps between checkpoints; 0 means only at the end (if ckpt_dir)
    log_every: int = 10

    def __post_init__(self):
        for name in ("steps", "global_batch", "seq_len", "grad_accum"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainConfig.{name} must be positive, got {getattr(self, name)}")
        if self.global_batch % self.grad_accum:
            raise ValueError(
                f"grad_accum={self.grad_accum} does not divide global_batch={self.global_batch}"
            )
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        for name in ("warmup_steps", "eval_every", "ckpt_every", "grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)
