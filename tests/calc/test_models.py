"""The one model preset table (calc/models.py) and the views the commands read from it."""

from dataclasses import astuple

import pytest

from jaxscale.calc import kv, models


def test_head_dim_agrees_with_the_shape():
    for key, m in models.MODELS.items():
        if m.d_model is not None:
            assert m.head_dim == m.d_model // m.n_heads, key
            assert m.n_heads % m.n_kv_heads == 0, key


def test_views_and_their_order():
    # --model of memory, flops, inference, serving, rl throughput
    assert models.SHAPE_PRESETS == ("gpt2-124m", "llama-7b", "llama-13b", "llama-70b", "gpt3-175b")
    # --model of kv and prefix: seed 002's six (ch9 kv_cache_calculator.py), in its order
    assert models.KV_PRESETS == (
        "llama-7b",
        "llama-13b",
        "llama-70b",
        "mistral-7b",
        "qwen-72b",
        "deepseek-67b",
    )
    assert list(kv.MODELS) == list(models.KV_PRESETS)


def test_kv_reads_the_seed_002_fields():
    # (name, layers, K/V heads, head dim, FP16 GB): seed 002 ch9 kv_cache_calculator.py
    assert [astuple(m) for m in kv.MODELS.values()] == [
        ("LLaMA-7B", 32, 32, 128, 14),
        ("LLaMA-13B", 40, 40, 128, 26),
        ("LLaMA-70B", 80, 8, 128, 140),
        ("Mistral-7B", 32, 8, 128, 14),
        ("Qwen-72B", 80, 8, 128, 144),
        ("DeepSeek-67B", 95, 8, 128, 134),
    ]
    assert kv.get_model(" LLaMA-70B ") == kv.MODELS["llama-70b"]


@pytest.mark.parametrize(
    "lookup, choices",
    [
        (models.get_model, models.SHAPE_PRESETS),
        (kv.get_model, models.KV_PRESETS),
    ],
)
def test_unknown_names_list_only_that_views_choices(lookup, choices):
    outside = "gpt2-124m" if lookup is kv.get_model else "mistral-7b"
    with pytest.raises(ValueError, match="choose one of: " + ", ".join(choices) + "$"):
        lookup(outside)
