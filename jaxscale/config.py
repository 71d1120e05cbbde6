"""Frozen configuration dataclasses: the model and the training run.

Every field carries its one-line help (and, where the command line spells it differently, its
flag) in its metadata: `jaxscale train` generates its flags from these fields, and a validation
error names the field first, so the command line can name the flag instead.

Axis alphabet used in names throughout jaxscale (documented once, here):
  B batch, T sequence, D d_model (embed), H query heads, G kv heads, R = H/G heads per kv group,
  K head_dim, F d_ff (mlp), V vocab, L layers, M microbatches, E experts, C capacity slots per
  expert, X = k routing choices per token (top-k).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

_DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("jaxscale", "xla", "cudnn")
INT_MAX = 2**31 - 1  # steps, sizes and seeds are int32 inside jax


def opt(default, help: str, flag: str | None = None, choices: tuple | None = None, const=None):
    """A config field with its help text (and its command-line flag and choices, if any; `const`:
    the value of the flag given without one)."""
    meta = {"help": help, "flag": flag, "choices": choices, "const": const}
    return field(default=default, metadata=meta)


REMAT_POLICIES = ("none", "block", "dots", "offload", "every:K", "sqrt")


def remat_group(policy: str, n_layers: int) -> int | None:
    """The blocks recomputed together under `policy` (every:K's K, sqrt's round(sqrt(L)), at
    least 1), or None for the policies that act on one block (none, block, dots)."""
    if policy == "sqrt":
        return max(1, round(math.sqrt(n_layers)))
    if policy.startswith("every:"):
        return int(policy.removeprefix("every:"))
    return None


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _counts(cfg, names: tuple[str, ...], minimum: int = 1) -> None:
    for name in names:
        value = getattr(cfg, name)
        _require(
            minimum <= value <= INT_MAX,
            f"{name} must be an integer in [{minimum}, {INT_MAX}], got {value}",
        )


def _check_remat(policy) -> None:
    k = policy.removeprefix("every:") if isinstance(policy, str) else ""
    ok = isinstance(policy, str) and (
        policy in REMAT_POLICIES
        or (policy.startswith("every:") and k.isascii() and k.isdigit() and 1 <= int(k) <= INT_MAX)
    )
    _require(ok, f"remat must be one of {', '.join(REMAT_POLICIES)} (K >= 1), got {policy!r}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A decoder-only transformer. Defaults are the tiny test model."""

    vocab: int = opt(256, "vocabulary size (byte tokens need 256)")
    d_model: int = opt(64, "D, the residual stream's width")
    n_layers: int = opt(2, "L, stacked and scanned so pipeline stages can slice them", "--layers")
    n_heads: int = opt(8, "H, query heads", "--heads")
    n_kv_heads: int = opt(4, "G, key/value heads (GQA): == heads is MHA, 1 is MQA", "--kv-heads")
    d_ff: int = opt(128, "F, the MLP's hidden width")
    max_seq: int = opt(128, "longest sequence RoPE and sampling accept")
    mlp: str = opt(
        "swiglu", "MLP kind: swiglu (3 matrices) or gelu (2)", choices=("swiglu", "gelu")
    )
    tied_embeddings: bool = opt(False, "logits use the input embedding transposed")
    rope_base: float = opt(10_000.0, "RoPE frequency base")
    norm_eps: float = opt(1e-6, "RMSNorm epsilon")
    compute_dtype: str = opt("float32", "dtype of matmuls and activations", choices=_DTYPES)
    param_dtype: str = opt("float32", "dtype of parameters and Adam state", choices=_DTYPES)
    remat: str = opt(
        "none",
        "activation checkpointing (jax.checkpoint): none; block (keep each block's input, "
        "recompute its inside); dots (keep the weight matmuls' outputs, recompute the rest); "
        "offload (block, with the kept inputs in host memory: TPU and GPU); "
        "every:K (keep every K-th block's input, recompute K blocks at a time); sqrt "
        "(every:round(sqrt(L)))",
        const="block",
    )
    # The compiler's cost_analysis counts a loop body once, so FLOPs read from a compiled program
    # are per-layer-exact only when the layers are unrolled.
    unroll_layers: bool = opt(False, "unroll the layer scan (exact FLOPs in cost_analysis)")
    attention_impl: str = opt(
        "jaxscale",
        "attention core: jaxscale (einsum, any query/key positions), or "
        "jax.nn.dot_product_attention's xla or cudnn (fused flash attention on NVIDIA GPUs, "
        "bf16/f16 only)",
        "--attention",
        choices=ATTENTION_IMPLS,
    )
    # Mixture of experts (jaxscale/model/moe.py). Routing groups are sequences: capacity, drops
    # and the balance loss are per sequence, so any split of the batch routes identically.
    n_experts: int = opt(0, "E, experts per MoE layer; 0: a dense model", "--experts")
    top_k: int = opt(2, "experts each token is routed to (gates renormalised over them)")
    capacity_factor: float = opt(
        1.25,
        "capacity C = ceil(cf * T * k / E) tokens per expert "
        "and sequence; tokens beyond it are dropped (residual only)",
    )
    moe_mode: str = opt(
        "capacity",
        "capacity (drops beyond C) or dropless (no token dropped)",
        choices=("capacity", "dropless"),
    )
    moe_every: int = opt(1, "every n-th layer is MoE (the last of each group of n); 1: all")
    aux_loss_weight: float = opt(0.01, "Switch load-balancing loss weight (mean over layers)")
    z_loss_weight: float = opt(1e-3, "router z-loss weight (mean over layers)")

    def __post_init__(self):
        if isinstance(self.remat, bool):  # configs written before the policies: true was block
            object.__setattr__(self, "remat", "block" if self.remat else "none")
        _counts(self, ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq"))
        _check_remat(self.remat)
        _require(
            self.d_model % self.n_heads == 0,
            f"n_heads={self.n_heads} does not divide d_model={self.d_model} "
            f"(head_dim would be {self.d_model / self.n_heads:g})",
        )
        _require(
            self.n_heads % self.n_kv_heads == 0,
            f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads} (GQA groups)",
        )
        _require(
            self.head_dim % 2 == 0,
            f"d_model / n_heads must be even for RoPE, got head_dim {self.head_dim}",
        )
        _require(
            self.mlp in ("swiglu", "gelu"), f"mlp must be 'swiglu' or 'gelu', got {self.mlp!r}"
        )
        for name in ("compute_dtype", "param_dtype"):
            value = getattr(self, name)
            _require(value in _DTYPES, f"{name} must be one of {_DTYPES}, got {value!r}")
        _require(
            self.attention_impl in ATTENTION_IMPLS,
            f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}",
        )
        _require(
            self.attention_impl != "cudnn" or self.compute_dtype != "float32",
            "attention_impl='cudnn' needs compute_dtype bfloat16 or float16 (cuDNN's "
            "flash attention has no float32 kernel)",
        )
        for name in ("rope_base", "norm_eps"):
            value = getattr(self, name)
            _require(math.isfinite(value) and value > 0, f"{name} must be > 0, got {value}")
        self._check_moe()

    def _check_moe(self):
        _counts(self, ("n_experts",), minimum=0)
        _counts(self, ("top_k", "moe_every"))
        _require(
            self.moe_mode in ("capacity", "dropless"),
            f"moe_mode must be 'capacity' or 'dropless', got {self.moe_mode!r}",
        )
        for name in ("aux_loss_weight", "z_loss_weight"):
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, f"{name} must be >= 0, got {value}")
        _require(
            math.isfinite(self.capacity_factor) and self.capacity_factor > 0,
            f"capacity_factor must be > 0, got {self.capacity_factor}",
        )
        if not self.n_experts:
            return
        _require(
            self.top_k <= self.n_experts,
            f"top_k={self.top_k} exceeds n_experts={self.n_experts} (a token picks k "
            "distinct experts)",
        )
        _require(
            self.n_layers % self.moe_every == 0,
            f"moe_every={self.moe_every} does not divide n_layers={self.n_layers} (the "
            "stack scans over groups of moe_every layers, the last of each MoE)",
        )

    @property
    def head_dim(self) -> int:  # K
        return self.d_model // self.n_heads

    @property
    def n_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return self.n_layers // self.moe_every if self.n_experts else 0

    def capacity(self, tokens: int) -> int:
        """Slots per expert for a routing group of `tokens`: ceil(cf * tokens * k / E) in
        capacity mode (at most `tokens`: an expert takes each token once); `tokens` when
        dropless, the worst case, which no routing can overflow."""
        if self.moe_mode == "dropless":
            return tokens
        return min(tokens, math.ceil(self.capacity_factor * tokens * self.top_k / self.n_experts))

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

    steps: int = opt(300, "optimizer steps")
    global_batch: int = opt(16, "sequences per step, summed over all data-parallel shards")
    seq_len: int = opt(64, "tokens per sequence")
    grad_accum: int = opt(1, "microbatches per step; gradients are reduced once per step")
    lr: float = opt(3e-3, "peak learning rate")
    warmup_steps: int = opt(20, "linear warmup steps (then cosine decay)")
    min_lr_ratio: float = opt(0.1, "cosine decays to lr x this")
    weight_decay: float = opt(0.1, "AdamW decoupled weight decay (never on norm scales)")
    optimizer: str = opt("adamw", "adamw, or sgd (plain, no momentum)", choices=("adamw", "sgd"))
    b1: float = opt(0.9, "Adam beta1")
    b2: float = opt(0.95, "Adam beta2")
    grad_clip: float = opt(1.0, "global-norm clipping threshold; 0 disables")
    seed: int = opt(0, "initialisation and data seed")
    eval_every: int = opt(50, "steps between eval-loss measurements; 0: only at the end")
    eval_batches: int = opt(4, "batches of held-out data per eval")
    ckpt_every: int = opt(0, "steps between checkpoints; 0: only at the end (with a ckpt dir)")
    log_every: int = opt(10, "steps between metrics records (the last step is always recorded)")
    offload: str = opt(
        "none",
        "opt_state: keep the optimizer state in host memory (pinned_host) between steps, moved "
        "to the device for the update (the auto path)",
        choices=("none", "opt_state"),
    )

    def __post_init__(self):
        _counts(
            self, ("steps", "global_batch", "seq_len", "grad_accum", "eval_batches", "log_every")
        )
        _counts(self, ("warmup_steps", "eval_every", "ckpt_every", "seed"), minimum=0)
        _require(
            self.global_batch % self.grad_accum == 0,
            f"grad_accum={self.grad_accum} does not divide global_batch={self.global_batch}",
        )
        _require(math.isfinite(self.lr) and self.lr > 0, f"lr must be > 0, got {self.lr}")
        _require(
            0 <= self.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"
        )
        for name in ("b1", "b2"):
            value = getattr(self, name)
            _require(0 <= value < 1, f"{name} must be in [0, 1), got {value}")
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, f"{name} must be >= 0, got {value}")
        _require(
            self.optimizer in ("adamw", "sgd"),
            f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}",
        )

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)
