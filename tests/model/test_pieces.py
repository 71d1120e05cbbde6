"""The model's pieces against references that share no code with them.

Every equivalence test compares a strategy with the single-device run of the same pieces, so a
bug in a shared piece (a wrong attention scale, a mis-rotated RoPE) would pass them all. Here each
piece meets an independent oracle: `attend` jax.nn.dot_product_attention, RoPE its defining
property and a complex-number rotation, RMSNorm and the loss their formulas in NumPy, and the
whole forward pass a float64 NumPy transformer written from the equations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxscale.config import ModelConfig, TrainConfig
from jaxscale.model import pieces
from jaxscale.model import state as ms
from jaxscale.parallel import optim
from jaxscale.tolerances import ATOL, RTOL

RNG = np.random.default_rng(0)


def _normal(*shape):
    return jnp.asarray(RNG.normal(size=shape), jnp.float32)


@pytest.mark.smoke
@pytest.mark.parametrize("H, G", [(8, 8), (8, 2), (4, 1)])
def test_attend_equals_jax_dot_product_attention_causal_gqa(H, G):
    B, T, K = 2, 12, 16
    q, k, v = _normal(B, T, H, K), _normal(B, T, G, K), _normal(B, T, G, K)
    pos = jnp.arange(T)
    got = pieces.attend(q, k, v, pos, pos)
    want = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=10 * ATOL)


def test_attend_with_separate_query_and_key_positions():
    """Decode-style: 3 queries at positions 7..9 over 10 cached keys, two of the cache slots
    unused (position 99, beyond every query): the mask comes from the positions alone."""
    B, H, G, K, S = 1, 4, 2, 8, 12
    q, k, v = _normal(B, 3, H, K), _normal(B, S, G, K), _normal(B, S, G, K)
    q_pos = jnp.array([7, 8, 9])
    k_pos = jnp.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 99])
    mask = (q_pos[:, None] >= k_pos[None, :])[None, None]  # [1, 1, T, S]
    want = jax.nn.dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(
        pieces.attend(q, k, v, q_pos, k_pos), want, rtol=RTOL, atol=10 * ATOL
    )


def test_rope_scores_depend_only_on_the_position_difference():
    B, K = 1, 16
    q, k = _normal(B, 1, 1, K), _normal(B, 1, 1, K)

    def score(pq, pk):
        rq = pieces.rope(q, jnp.array([pq]), 10_000.0)
        rk = pieces.rope(k, jnp.array([pk]), 10_000.0)
        return float(jnp.sum(rq * rk))

    base = score(5, 2)
    for shift in (1, 17, 100):
        assert score(5 + shift, 2 + shift) == pytest.approx(base, rel=1e-4, abs=1e-5)
    assert abs(score(5, 2) - score(5, 4)) > 1e-3  # and it does depend on the difference


def test_rope_is_a_complex_rotation_of_half_pairs():
    """Rotate-half RoPE: channel i pairs with i + K/2 as (re, im), rotated by pos * base^(-2i/K)."""
    T, K, base = 7, 8, 10_000.0
    x = RNG.normal(size=(1, T, 2, K))
    pos = np.arange(T) * 3
    z = x[..., : K // 2] + 1j * x[..., K // 2 :]
    theta = pos[:, None] * base ** (-np.arange(0, K, 2) / K)
    rotated = z * np.exp(1j * theta)[None, :, None, :]
    want = np.concatenate([rotated.real, rotated.imag], axis=-1)
    got = pieces.rope(jnp.asarray(x, jnp.float32), jnp.asarray(pos), base)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=10 * ATOL)


def test_rms_norm_and_cross_entropy_match_their_formulas():
    x, scale = RNG.normal(size=(3, 5, 16)), RNG.normal(size=16)
    want = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6) * scale
    got = pieces.rms_norm(jnp.asarray(x, jnp.float32), jnp.asarray(scale, jnp.float32), 1e-6)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    logits, targets = RNG.normal(size=(2, 6, 11)) * 3, RNG.integers(0, 11, (2, 6))
    lse = np.log(np.exp(logits).sum(-1))
    want = np.mean(lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0])
    got = pieces.cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(targets))
    assert float(got) == pytest.approx(want, rel=RTOL)


@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rms_norm_puts_eps_inside_the_square_root_on_small_inputs(eps):
    """x / sqrt(mean(x^2) + eps) * scale, on rows whose mean square is comparable to eps (RMS
    1e-4 .. 1e-2). On unit-scale inputs eps changes the output by ~eps, below the tolerance, so
    the test above cannot tell eps inside the root from x / (sqrt(mean(x^2)) + eps), x times
    (rsqrt(mean(x^2)) + eps) or a missing eps; here each is ~1.4x too large at RMS 1e-3 and
    ~10x at RMS 1e-4 (eps 1e-6)."""
    rms_B = np.array([1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    x_BTD = RNG.normal(size=(5, 3, 32)) * rms_B[:, None, None]
    scale_D = RNG.normal(size=32)
    ms_BT1 = np.mean(x_BTD**2, axis=-1, keepdims=True)
    want = x_BTD / np.sqrt(ms_BT1 + eps) * scale_D
    got = pieces.rms_norm(jnp.asarray(x_BTD, jnp.float32), jnp.asarray(scale_D, jnp.float32), eps)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    for wrong in (
        x_BTD / (np.sqrt(ms_BT1) + eps) * scale_D,
        x_BTD * (1 / np.sqrt(ms_BT1) + eps) * scale_D,
        x_BTD / np.sqrt(ms_BT1) * scale_D,
    ):  # the inputs tell the rules apart, far beyond the tolerance
        assert np.abs(wrong - want).max() > 100 * (ATOL + RTOL * np.abs(want).max())


def _numpy_forward(p, tokens, cfg: ModelConfig):
    """The transformer from its equations, float64, loops over layers and heads."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)

    def norm(x, s):
        return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + cfg.norm_eps) * s

    def rot(x, pos):  # x [T, K]
        K = x.shape[-1]
        z = x[:, : K // 2] + 1j * x[:, K // 2 :]
        z = z * np.exp(1j * pos[:, None] * cfg.rope_base ** (-np.arange(0, K, 2) / K))
        return np.concatenate([z.real, z.imag], -1)

    T = tokens.shape[1]
    pos, R = np.arange(T), cfg.n_heads // cfg.n_kv_heads
    out = []
    for row in np.asarray(tokens):
        x = p["embed_VD"][row]
        for layer in range(cfg.n_layers):
            w = {k: v[layer] for k, v in p["blocks"].items()}
            h = norm(x, w["attn_norm_D"])
            heads = []
            for hd in range(cfg.n_heads):
                q = rot(h @ w["wq_DHK"][:, hd], pos)
                k = rot(h @ w["wk_DGK"][:, hd // R], pos)
                v = h @ w["wv_DGK"][:, hd // R]
                s = q @ k.T / np.sqrt(cfg.head_dim) + np.triu(np.full((T, T), -np.inf), 1)
                a = np.exp(s - s.max(-1, keepdims=True))
                heads.append((a / a.sum(-1, keepdims=True)) @ v)
            x = x + np.einsum("thk,hkd->td", np.stack(heads, 1), w["wo_HKD"])
            h = norm(x, w["mlp_norm_D"])
            gate = h @ w["w_gate_DF"]
            x = x + (gate / (1 + np.exp(-gate)) * (h @ w["w_up_DF"])) @ w["w_down_FD"]
        out.append(norm(x, p["final_norm_D"]) @ p["unembed_DV"])
    return np.stack(out)


@pytest.mark.smoke
@pytest.mark.parametrize("attention_impl", ["jaxscale", "xla"])
def test_whole_forward_equals_a_numpy_transformer(attention_impl):
    """Either attention core (ours, or jax.nn.dot_product_attention's XLA path; its cuDNN path
    runs on NVIDIA GPUs only, docs/hardware.md) against the same numpy transformer."""
    cfg = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, attention_impl=attention_impl)
    params = ms.init_params(cfg, 3)
    tokens = jnp.asarray(RNG.integers(0, cfg.vocab, (2, 10)))
    got = jax.jit(lambda p, t: pieces.logits(p, t, cfg))(params, tokens)
    np.testing.assert_allclose(got, _numpy_forward(params, tokens, cfg), rtol=1e-4, atol=1e-4)


def test_norm_scales_get_no_weight_decay():
    """AdamW decays matrices, never norm scales: with zero gradients only the decay moves a
    parameter, so after one step every norm scale is unchanged and every matrix has shrunk."""
    cfg = ModelConfig(n_layers=1)
    tcfg = TrainConfig(weight_decay=0.5, warmup_steps=0, lr=0.1, steps=10)
    params = ms.init_params(cfg, 0)
    tx = optim.make_optimizer(tcfg, cfg)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    names = jax.tree.leaves(ms.logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    for old, upd, axes in zip(jax.tree.leaves(params), jax.tree.leaves(new), names, strict=True):
        if "norm" in axes:
            np.testing.assert_array_equal(upd, old)
        else:  # decoupled decay: w <- w - lr * wd * w
            np.testing.assert_allclose(upd, old * (1 - 0.1 * 0.5), rtol=1e-6, atol=1e-7)
