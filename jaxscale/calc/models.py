"""Model presets for the calculators: the dense transformers the seeds use as examples.

`n_params` is the seeds' nominal count (e.g. 7e9 for LLaMA 7B, shared/seeds/000_*.txt L151-155;
shared/seeds/001_*.txt L88-94), not a count derived from the shapes: the seeds' golden numbers are
computed from the nominal figure. The shapes are the published configurations of each model; they
feed the FLOPs and activation formulas, which need d_model and n_layers.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    name: str  # display name, as the seeds print it
    n_params: float  # nominal parameter count
    d_model: int  # hidden size D
    n_layers: int  # transformer blocks L
    n_heads: int  # query heads H
    n_kv_heads: int  # key/value heads (== n_heads without GQA)
    d_ff: int  # MLP hidden size F
    vocab_size: int  # V
    max_seq_len: int  # training context length T

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


# Keys are the names accepted on the command line (--model).
MODELS: dict[str, ModelPreset] = {
    "gpt2-124m": ModelPreset("GPT-2 (124M)", 124e6, 768, 12, 12, 12, 3072, 50257, 1024),
    "llama-7b": ModelPreset("LLaMA 7B", 7e9, 4096, 32, 32, 32, 11008, 32000, 4096),
    "llama-13b": ModelPreset("LLaMA 13B", 13e9, 5120, 40, 40, 40, 13824, 32000, 4096),
    "llama-70b": ModelPreset("LLaMA 70B", 70e9, 8192, 80, 64, 8, 28672, 32000, 4096),
    "gpt3-175b": ModelPreset("GPT-3 175B", 175e9, 12288, 96, 96, 96, 49152, 50257, 2048),
}


def get_model(name: str) -> ModelPreset:
    """The preset called `name` (case-insensitive); ValueError naming the valid choices."""
    key = name.strip().lower()
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[key]
