"""Transformer FLOPs and the 6N rule (seed 001 §5)."""

import pytest

from jaxscale.calc import flops as fl

REL = 1e-12


def test_six_n_d():
    # seed 001 §2 and §4: C = 6 * N * D
    assert fl.training_flops(70e9, 2e12) == pytest.approx(8.4e23, rel=REL)
    assert fl.TRAINING_FLOPS_PER_PARAM == 6


def test_gpt3_style_breakdown():
    # seed 001 §5 config; per-layer FWD = 8 d^2 + 16 d^2 = 24 d^2 (its "FLOPs Calculation")
    d, layers, vocab = 12288, 96, 50257
    f = fl.transformer_flops_per_token(d, layers, 2048, vocab)
    assert f.fwd_per_layer == 24 * d * d == 3_623_878_656
    assert f.unembedding == 2 * vocab * d
    assert f.fwd_total == layers * 24 * d * d + 2 * vocab * d
    assert f.bwd_total == 2 * f.fwd_total
    assert f.step_total == 3 * f.fwd_total
    assert f.attention_scores == 0


def test_forward_is_two_flops_per_block_weight():
    # independent count: a block has 4 d^2 (Q, K, V, O) + 2 * d * d_ff (MLP) weights
    d, d_ff = 256, 1000
    f = fl.transformer_flops_per_token(d, 1, 1, 1, d_ff=d_ff)
    weights = 4 * d * d + 2 * d * d_ff
    assert f.fwd_per_layer == 2 * weights


def test_attention_scores_corrected_causal_and_seed():
    d, t = 512, 1024
    full = fl.transformer_flops_per_token(d, 2, t, include_attention=True)
    causal = fl.transformer_flops_per_token(d, 2, t, include_attention=True, causal=True)
    seed = fl.transformer_flops_per_token(d, 2, t, include_attention=True, seed_faithful=True)
    # per token: q.K^T over t keys (2*t*d) plus the weighted sum of t values (2*t*d)
    assert full.attention_scores == 4 * t * d
    assert causal.attention_scores == 2 * t * d
    # seed 001 §5 adds the per-sequence 2 * d * t^2
    assert seed.attention_scores == 2 * d * t * t


@pytest.mark.parametrize(
    "index, ratio_2dp",
    [(0, 0.95), (1, 0.93), (2, 1.00)],  # ratios printed by seed 001 §5 [C]
)
def test_verify_six_n(index, ratio_2dp):
    name, n, d, layers = fl.SIX_N_MODELS[index]
    check = fl.check_six_n(name, n, d, layers)
    # independent: seq_len 1, vocab 50000 -> 3 * (24 d^2 L + 2 * 50000 * d)
    detailed = 3 * (24 * d * d * layers + 2 * 50000 * d)
    assert check.detailed_flops == detailed
    assert check.six_n_flops == 6 * n
    assert round(check.ratio, 2) == ratio_2dp


def test_seed_six_n_models_are_the_seeds():
    # seed 001 §5 verify_6n_rule
    assert [(m[1], m[2], m[3]) for m in fl.SIX_N_MODELS] == [
        (7e9, 4096, 32),
        (70e9, 8192, 80),
        (175e9, 12288, 96),
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 2, 8), "d_model must be > 0"),
        ((64, 0, 8), "n_layers must be > 0"),
        ((64, 2, -1), "seq_len must be > 0"),
    ],
)
def test_bad_shapes(args, message):
    with pytest.raises(ValueError, match=message):
        fl.transformer_flops_per_token(*args)


def test_bad_counts():
    with pytest.raises(ValueError, match="n_tokens must be > 0"):
        fl.training_flops(1e9, 0)
    with pytest.raises(ValueError, match="d_ff must be > 0"):
        fl.transformer_flops_per_token(64, 2, 8, d_ff=0)
