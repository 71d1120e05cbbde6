"""Model presets for the calculators: the one table of the transformers the seeds use as examples.

`n_params` is the seeds' nominal count (e.g. 7e9 for LLaMA 7B in seed 000 Exercise 1 and
seed 001 §2), not a count derived from the shapes: the seeds' golden numbers are
computed from the nominal figure. The shapes are the published configurations of each model; they
feed the FLOPs and activation formulas, which need d_model and n_layers.

Seed 002's KV cache calculator (ch9 `kv_cache_calculator.py`) lists six models by name, layers, K/V
heads, head dimension (its MODELS) and FP16 weight size (print_capacity_analysis); three of them
have only those fields here. Two views of the table: `SHAPE_PRESETS` (a full shape: `--model` of
memory, flops, inference, serving and rl throughput) and `KV_PRESETS` (seed 002's six: `--model` of
kv and prefix).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    name: str  # display name, as seeds 000/001 print it
    n_layers: int  # transformer blocks L
    n_kv_heads: int  # key/value heads (== n_heads without GQA)
    head_dim: int  # width of one head
    # The shape of the training and serving formulas; None for a model only seed 002 lists.
    n_params: float | None = None  # nominal parameter count
    d_model: int | None = None  # hidden size D
    n_heads: int | None = None  # query heads H
    d_ff: int | None = None  # MLP hidden size F
    vocab_size: int | None = None  # V
    max_seq_len: int | None = None  # training context length T
    # Seed 002's KV calculator; None for a model it does not list.
    kv_name: str | None = None  # the name it prints
    fp16_weights_gb: float | None = None  # its FP16 weight size in GB


# Keys are the names accepted on the command line (--model).
MODELS: dict[str, ModelPreset] = {
    "gpt2-124m": ModelPreset(
        "GPT-2 (124M)",
        n_layers=12,
        n_kv_heads=12,
        head_dim=64,
        n_params=124e6,
        d_model=768,
        n_heads=12,
        d_ff=3072,
        vocab_size=50257,
        max_seq_len=1024,
    ),
    "llama-7b": ModelPreset(
        "LLaMA 7B",
        n_layers=32,
        n_kv_heads=32,
        head_dim=128,
        n_params=7e9,
        d_model=4096,
        n_heads=32,
        d_ff=11008,
        vocab_size=32000,
        max_seq_len=4096,
        kv_name="LLaMA-7B",
        fp16_weights_gb=14,
    ),
    "llama-13b": ModelPreset(
        "LLaMA 13B",
        n_layers=40,
        n_kv_heads=40,
        head_dim=128,
        n_params=13e9,
        d_model=5120,
        n_heads=40,
        d_ff=13824,
        vocab_size=32000,
        max_seq_len=4096,
        kv_name="LLaMA-13B",
        fp16_weights_gb=26,
    ),
    "llama-70b": ModelPreset(
        "LLaMA 70B",
        n_layers=80,
        n_kv_heads=8,
        head_dim=128,
        n_params=70e9,
        d_model=8192,
        n_heads=64,
        d_ff=28672,
        vocab_size=32000,
        max_seq_len=4096,
        kv_name="LLaMA-70B",
        fp16_weights_gb=140,
    ),
    "gpt3-175b": ModelPreset(
        "GPT-3 175B",
        n_layers=96,
        n_kv_heads=96,
        head_dim=128,
        n_params=175e9,
        d_model=12288,
        n_heads=96,
        d_ff=49152,
        vocab_size=50257,
        max_seq_len=2048,
    ),
    "mistral-7b": ModelPreset(
        "Mistral 7B",
        n_layers=32,
        n_kv_heads=8,
        head_dim=128,
        kv_name="Mistral-7B",
        fp16_weights_gb=14,
    ),
    "qwen-72b": ModelPreset(
        "Qwen 72B", n_layers=80, n_kv_heads=8, head_dim=128, kv_name="Qwen-72B", fp16_weights_gb=144
    ),
    "deepseek-67b": ModelPreset(
        "DeepSeek 67B",
        n_layers=95,
        n_kv_heads=8,
        head_dim=128,
        kv_name="DeepSeek-67B",
        fp16_weights_gb=134,
    ),
}

SHAPE_PRESETS = tuple(key for key, m in MODELS.items() if m.n_params is not None)
KV_PRESETS = tuple(key for key, m in MODELS.items() if m.fp16_weights_gb is not None)


def get_model(name: str, choices: tuple[str, ...] = SHAPE_PRESETS) -> ModelPreset:
    """The preset called `name` (case-insensitive) among `choices`; ValueError naming them."""
    key = name.strip().lower()
    if key not in choices:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(choices)}")
    return MODELS[key]
