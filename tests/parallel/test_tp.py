"""Manual tensor parallelism (jaxscale/parallel/tp.py) equals the single-device reference.

For each mesh and each mode (megatron, sequence, gather_output) the loss and every gradient leaf of
the composed manual strategy (the model's pieces with tp.py's substitutes, under shard_map) match
`jaxscale.parallel.auto.loss_and_grads` on one device (within jaxscale/tolerances.py's RTOL and
ATOL). The vocab-parallel pieces are checked against jnp.take and a float64 cross-entropy, ZeRO-3's
gathers with an fsdp axis, a block with a wrong or dropped all-reduce is shown to be caught, and bad
layouts fail with errors that name the dimension.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.mesh import build_mesh
from jaxscale.model import pieces, state
from jaxscale.parallel import auto, tp
from jaxscale.parallel.compose import Strategy, build
from jaxscale.parallel.tp_vocab import vocab_parallel_cross_entropy, vocab_parallel_embed
from jaxscale.tolerances import ATOL, BF16_SAME_ATOL, BF16_SAME_RTOL, RTOL

B, T = 8, 16  # batch rows and sequence length; T divides every tensor size (sequence mode)
TCFG = TrainConfig(global_batch=B, seq_len=T)
NAMES = {"megatron": "tp", "sequence": "tp_sp", "gather_output": "tp_gather"}

# (mesh, config, mode): tensor=8 needs 8 kv heads; tied embeddings, GELU and remat each meet
# one mode here (verify's matrix runs every mode on the default model).
CASES = {
    "tp=8": (ModelConfig(n_kv_heads=8, tied_embeddings=True), "gather_output"),
    "dp=2,tp=4": (ModelConfig(mlp="gelu"), "sequence"),
    "dp=4,tp=2": (ModelConfig(remat="block"), "megatron"),
}


def assert_equivalent(got, want):
    chex.assert_trees_all_close(jax.device_get(got), jax.device_get(want), rtol=RTOL, atol=ATOL)


def _batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, cfg.vocab, (B, T + 1)), jnp.int32)


_REFERENCE: dict = {}


def _reference(cfg):
    """(params, batch, (loss, grads)) of the single-device reference, once per config."""
    if cfg not in _REFERENCE:
        params, batch = state.init_params(cfg, 0), _batch(cfg)
        ref = jax.jit(lambda p, b: auto.loss_and_grads(p, b, cfg))(params, batch)
        _REFERENCE[cfg] = params, batch, ref
    return _REFERENCE[cfg]


def _tp_grads(cfg, mesh: str, mode="megatron", data="dp"):
    data_part = f"{data}+" if mesh.startswith(("dp", "fsdp")) else ""
    strategy = Strategy.parse(f"manual:{data_part}{NAMES[mode]}", mesh)
    return build(strategy, cfg, TCFG).loss_and_grads


@pytest.mark.parametrize("spec", list(CASES))
def test_loss_and_every_gradient_match_reference(spec):
    cfg, mode = CASES[spec]
    params, batch, ref = _reference(cfg)
    loss, grads = _tp_grads(cfg, spec, mode)(params, batch)
    assert_equivalent((loss, grads), ref)
    # the tied model really has no separate unembedding: one table serves both ends
    assert ("unembed_DV" in grads) != cfg.tied_embeddings


def test_bf16_compute_stays_within_its_band_of_the_bf16_reference():
    f32_cfg = CASES["dp=2,tp=4"][0]  # its f32 reference is already computed
    cfg = f32_cfg.replace(compute_dtype="bfloat16")
    params, batch, ref = _reference(cfg)
    got = _tp_grads(cfg, "dp=2,tp=4")(params, batch)
    chex.assert_trees_all_close(
        jax.device_get(got), jax.device_get(ref), rtol=BF16_SAME_RTOL, atol=BF16_SAME_ATOL
    )
    # and bf16 really is in use: the f32 model is further away than the f32 tolerance
    f32 = _reference(f32_cfg)[2]
    assert abs(float(got[0]) - float(f32[0])) > ATOL + RTOL * abs(float(f32[0]))


def test_zero3_gathers_fsdp_splits_inside_the_layer_scan():
    cfg = CASES["dp=2,tp=4"][0]
    params, batch, ref = _reference(cfg)
    built = build(Strategy.parse("manual:zero3+tp", "fsdp=2,tp=4"), cfg, TCFG)
    loss, grads = built.loss_and_grads(params, batch)
    assert_equivalent((loss, grads), ref)
    # the gradients come back in the ZeRO-3 layout: embed dims split over fsdp
    zero3_wq = jax.NamedSharding(built.mesh, jax.P(None, "fsdp", "tensor", None))
    assert grads["blocks"]["wq_DHK"].sharding.is_equivalent_to(zero3_wq, 4)


def _pieces_with_mlp_reduction(reduce):
    """Megatron pieces whose MLP partial sums go through `reduce` instead of psum."""
    real = tp.tensor_pieces

    def patched(pc, cfg, mode="megatron", axis="tensor"):
        pc = real(pc, cfg, mode, axis)

        def mlp(h_BTD, p, cfg, pc_):
            # the attention keeps its psum (pc.leave); the MLP's output goes through `reduce`
            return reduce(pieces.mlp(h_BTD, p, cfg, pc_), axis)

        def block(x_BTD, p, positions_T, cfg, pc_, kv=None):
            h_BTD = pc_.enter(pieces.rms_norm(x_BTD, p["attn_norm_D"], cfg.norm_eps))
            a_BTD, kv = pieces.attention(h_BTD, p, positions_T, cfg, pc_, kv)
            x_BTD = x_BTD + pc_.leave(a_BTD)
            h_BTD = pc_.enter(pieces.rms_norm(x_BTD, p["mlp_norm_D"], cfg.norm_eps))
            return x_BTD + mlp(h_BTD, p, cfg, pc_), {}, kv

        return pc.replace(block=block)

    return patched


def test_a_wrong_or_missing_mlp_all_reduce_is_caught(monkeypatch):
    """The checks can fail. Averaging the partial sums (pmean for psum: what seed 002's
    `w2 /= tp_size` init hack hides, ch6 tp_mlp.py) type-checks but fails equivalence;
    dropping the all-reduce leaves a device-varying residual, which check_vma rejects at trace."""
    cfg = CASES["dp=2,tp=4"][0]
    params, batch, ref = _reference(cfg)
    monkeypatch.setattr(tp, "tensor_pieces", _pieces_with_mlp_reduction(jax.lax.pmean))
    loss, grads = _tp_grads(cfg, "dp=2,tp=4")(params, batch)
    assert np.isfinite(float(loss))
    with pytest.raises(AssertionError):
        assert_equivalent((loss, grads), ref)
    monkeypatch.setattr(tp, "tensor_pieces", _pieces_with_mlp_reduction(lambda y, axis: y))
    with pytest.raises(TypeError, match="scan"):
        _tp_grads(cfg, "dp=2,tp=4")(params, batch)


def test_vocab_parallel_embedding_and_cross_entropy_match_the_full_vocab():
    mesh = build_mesh("tp=8")
    rng = np.random.default_rng(1)
    V, D = 64, 16
    table_VD = jnp.asarray(rng.normal(size=(V, D)), jnp.float32)
    tokens_BT = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    logits_BTV = jnp.asarray(3 * rng.normal(size=(B, T, V)), jnp.float32)

    def embed(table, tokens, scatter_seq):
        return jax.jit(
            jax.shard_map(
                lambda t, k: vocab_parallel_embed(t, k, "tensor", scatter_seq=scatter_seq),
                mesh=mesh,
                in_specs=(jax.P("tensor", None), jax.P()),
                out_specs=jax.P(None, "tensor", None) if scatter_seq else jax.P(),
            )
        )(table, tokens)

    want_BTD = jnp.take(table_VD, tokens_BT, axis=0)
    np.testing.assert_array_equal(embed(table_VD, tokens_BT, False), want_BTD)  # exact sum
    np.testing.assert_array_equal(embed(table_VD, tokens_BT, True), want_BTD)

    xent = jax.shard_map(
        lambda z, y: vocab_parallel_cross_entropy(z, y, "tensor"),
        mesh=mesh,
        in_specs=(jax.P(None, None, "tensor"), jax.P()),
        out_specs=jax.P(),
    )
    got = jax.jit(jax.value_and_grad(xent))(logits_BTV, tokens_BT)
    want = jax.value_and_grad(pieces.cross_entropy)(logits_BTV, tokens_BT)
    assert_equivalent(got, want)
    # and an independent float64 closed form: mean over rows of log sum exp(z) - z[target]
    z = np.asarray(logits_BTV, np.float64)
    z_max = z.max(axis=-1)
    lse = np.log(np.exp(z - z_max[..., None]).sum(axis=-1)) + z_max
    target = np.take_along_axis(z, np.asarray(tokens_BT)[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(float(got[0]), (lse - target).mean(), rtol=RTOL)


@pytest.mark.parametrize(
    "cfg, tp_size, mode, seq_len, names",
    [
        (ModelConfig(n_heads=4, n_kv_heads=4), 8, "megatron", None, "heads (n_heads)=4"),
        (ModelConfig(), 8, "megatron", None, "kv_heads (n_kv_heads)=4"),
        (ModelConfig(n_kv_heads=8, d_ff=100), 8, "megatron", None, "mlp (d_ff)=100"),
        (ModelConfig(vocab=100, n_kv_heads=8), 8, "megatron", None, "vocab=100"),
        (ModelConfig(), 4, "sequence", 6, "sequence length 6"),
        (ModelConfig(), 4, "ring", None, "unknown tensor-parallel mode 'ring'"),
    ],
)
def test_bad_layouts_name_what_does_not_divide(cfg, tp_size, mode, seq_len, names):
    with pytest.raises(ValueError, match=names.replace("(", r"\(").replace(")", r"\)")):
        tp.check_tp_layout(cfg, tp_size, mode=mode, seq_len=seq_len)


def test_heads_not_dividing_the_mesh_fail_before_anything_runs():
    cfg = ModelConfig()  # 4 kv heads cannot split 8 ways
    with pytest.raises(ValueError, match="kv_heads"):
        build(Strategy.parse("manual:tp", "tp=8"), cfg, TCFG)
    with pytest.raises(ValueError, match="needs a tensor axis"):
        build(Strategy.parse("manual:tp", "dp=8"), cfg, TCFG)
