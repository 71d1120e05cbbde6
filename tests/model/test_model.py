"""The NNX transformer: config validation, exact parameter counts, FLOPs vs the compiler,
logical axes, causality, GQA grouping, remat and bf16 compute."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.config import MODEL_PRESETS, ModelConfig
from jaxscale.model import counts, pieces
from jaxscale.model import state as ms
from jaxscale.parallel import auto
from jaxscale.sharding import RULES
from jaxscale.tolerances import ATOL, BF16_LOSS_RTOL, FLOPS_RTOL, RTOL


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(d_model=64, n_heads=6), "does not divide d_model"),
        (dict(n_heads=8, n_kv_heads=3), "does not divide n_heads"),
        (dict(d_model=24, n_heads=8, n_kv_heads=4), "must be even for RoPE"),
        (dict(mlp="relu"), "mlp must be"),
        (dict(n_layers=0), r"n_layers must be an integer in \[1,"),
        (dict(compute_dtype="int8"), "compute_dtype"),
    ],
)
def test_impossible_configs_rejected(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        ModelConfig(**kwargs)


CONFIGS = [
    ModelConfig(),
    ModelConfig(tied_embeddings=True, mlp="gelu"),
    ModelConfig(n_kv_heads=1, n_layers=3),
    MODEL_PRESETS["small"],
    MODEL_PRESETS["medium"],
    ModelConfig(n_experts=8, top_k=2),
    ModelConfig(n_experts=4, top_k=1, n_layers=4, moe_every=2, mlp="gelu"),
]


@pytest.mark.parametrize(
    "cfg", CONFIGS, ids=lambda c: f"D{c.d_model}L{c.n_layers}G{c.n_kv_heads}E{c.n_experts}"
)
def test_param_count_analytic_equals_eval_shape(cfg):
    shapes = jax.eval_shape(lambda: ms.init_params(cfg, 0))
    measured = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    assert counts.param_count(cfg) == measured


def test_every_param_has_known_logical_axes_of_matching_rank():
    cfg = ModelConfig()
    shapes = jax.tree.leaves(ms.abstract_params(cfg))
    names = jax.tree.leaves(ms.logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    assert len(shapes) == len(names)
    for shape, axes in zip(shapes, names, strict=True):
        assert len(axes) == len(shape.shape)
        assert all(a in RULES for a in axes)
    # stacked layers: every block parameter leads with the layers axis
    blocks = ms.logical_axes(cfg)["blocks"]
    assert all(axes[0] == "layers" for axes in blocks.values())


# D=256, F=1024, T=128: elementwise work (norms, softmax, RoPE) is < 2% of the matmuls. MoE:
# E=4 experts top-2 at cf 1 (E*C = 2T slots per sequence), every layer or every second.
_SMALL = MODEL_PRESETS["small"]
_MOE = _SMALL.replace(n_layers=2, n_experts=4, top_k=2, capacity_factor=1.0)


@pytest.mark.smoke
@pytest.mark.parametrize(
    "cfg", [_SMALL, _MOE, _MOE.replace(moe_every=2)], ids=["dense", "moe", "moe-every-2"]
)
def test_forward_flops_match_compiled_cost_analysis(cfg):
    # Unrolled, because cost_analysis counts the body of the layer loop once.
    cfg = cfg.replace(unroll_layers=True)
    B, T = 2, 128
    params = jax.eval_shape(lambda: ms.init_params(cfg, 0))
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    compiled = jax.jit(lambda p, t: pieces.logits(p, t, cfg)).lower(params, tokens).compile()
    measured = compiled.cost_analysis()["flops"]
    predicted = counts.forward_flops(cfg, B, T)
    assert abs(measured - predicted) / predicted < FLOPS_RTOL, (measured, predicted)


def test_causal_prefix_is_unaffected_by_later_tokens():
    cfg = ModelConfig()
    params = _params(cfg)
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab)
    changed = tokens.at[:, 10:].set((tokens[:, 10:] + 7) % cfg.vocab)
    fwd = jax.jit(lambda p, t: pieces.logits(p, t, cfg))
    a, b = fwd(params, tokens), fwd(params, changed)
    np.testing.assert_array_equal(np.asarray(a[:, :10]), np.asarray(b[:, :10]))
    assert not np.allclose(np.asarray(a[:, 10:]), np.asarray(b[:, 10:]))


@pytest.mark.smoke
def test_gqa_equals_mha_with_repeated_kv_heads():
    """Independent check of the grouping: query head h must use kv head h // (H/G)."""
    gqa = ModelConfig(n_heads=8, n_kv_heads=2)
    mha = gqa.replace(n_kv_heads=8)
    p = _params(gqa)
    R = gqa.n_heads // gqa.n_kv_heads
    p_mha = jax.tree.map(lambda x: x, p)
    for name in ("wk_DGK", "wv_DGK"):
        p_mha["blocks"][name] = jnp.repeat(p["blocks"][name], R, axis=2)
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, gqa.vocab)
    gqa_out = jax.jit(lambda p, t: pieces.logits(p, t, gqa))(p, tokens)
    mha_out = jax.jit(lambda p, t: pieces.logits(p, t, mha))(p_mha, tokens)
    chex.assert_trees_all_close(gqa_out, mha_out, rtol=RTOL, atol=ATOL)


def test_module_call_equals_functional_apply():
    from flax import nnx

    from jaxscale.model.transformer import Transformer

    cfg = ModelConfig()
    model = Transformer(cfg, rngs=nnx.Rngs(params=0))
    tokens = jnp.arange(24).reshape(2, 12) % cfg.vocab
    chex.assert_trees_all_close(
        model(tokens),
        pieces.logits(nnx.to_pure_dict(nnx.state(model)), tokens, cfg),
        rtol=0,
        atol=0,
    )


def _params(cfg):
    return jax.jit(ms.init_params, static_argnums=(0, 1))(cfg, 0)


def _loss_grads(cfg, batch):
    params = _params(cfg)
    return jax.jit(lambda p, b: auto.loss_and_grads(p, b, cfg))(params, batch)


REMAT_MODELS = {
    # 3 layers: every:2 runs 2 and a remainder of 1
    "dense": ModelConfig(n_layers=3),
    # 3 groups of (dense, MoE): every:2 one run and a remainder, the router statistics of both
    # joined for the balance loss
    "moe": ModelConfig(n_layers=6, n_experts=4, moe_every=2),
}


@pytest.mark.parametrize(
    "model, policies",
    [
        ("dense", ("block", "dots", "offload", "every:2")),
        pytest.param("moe", ("every:2",), marks=pytest.mark.slow),  # an MoE compile: 10 s
    ],
)
def test_every_remat_policy_changes_memory_not_values(model, policies):
    """Loss and every gradient leaf (the MoE's balance and z losses included) equal the
    un-checkpointed model's under each policy (`model/pieces.run_layers`)."""
    cfg = REMAT_MODELS[model]
    batch = jax.random.randint(jax.random.key(3), (4, 17), 0, cfg.vocab)
    want = _loss_grads(cfg, batch)
    for policy in policies:
        got = _loss_grads(cfg.replace(remat=policy), batch)
        chex.assert_trees_all_close(got, want, rtol=RTOL, atol=ATOL, custom_message=policy)


def test_remat_policies_are_checked_and_old_configs_still_load():
    """A policy outside the list (or every:0) is a ValueError naming the choices; a config
    written when remat was a switch (true / false) loads as block / none."""
    for bad in ("every:0", "every:x", "sqrt:2", "all", 3):
        with pytest.raises(ValueError, match="remat must be one of none, block, dots"):
            ModelConfig(remat=bad)
    assert ModelConfig(remat=True).remat == "block" and ModelConfig(remat=False).remat == "none"


def test_bf16_compute_within_band_of_f32():
    cfg = ModelConfig()
    batch = jax.random.randint(jax.random.key(4), (4, 17), 0, cfg.vocab)
    loss32, _ = _loss_grads(cfg, batch)
    loss16, grads16 = _loss_grads(cfg.replace(compute_dtype="bfloat16"), batch)
    assert abs(float(loss16) - float(loss32)) / float(loss32) < BF16_LOSS_RTOL
    # parameters (and so their gradients) stay in the f32 param dtype
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads16))
