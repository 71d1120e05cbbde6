"""The KV cache against full recomputation (pieces.logits), generation against the recomputing
greedy sampler, and sampling's per-row settings and per-request seeds."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache, pieces
from jaxscale.model import state as ms
from jaxscale.serve import generate as gen
from jaxscale.serve import sampling
from jaxscale.tolerances import ATOL, INT8_KV_FRACTION, RTOL

CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=32)  # GQA


@functools.cache
def _params():  # on first use, not at collection (every xdist worker collects)
    return ms.init_params(CFG, 0)


RNG = np.random.default_rng(0)


def greedy_sample(cfg: ModelConfig, params, prompt_ids, n_new: int):
    """The oracle for generation: greedy continuation with no cache, the whole prefix
    recomputed by `pieces.logits` for every new token."""
    buf_1T = jnp.zeros((1, len(prompt_ids) + n_new), jnp.int32)
    buf_1T = buf_1T.at[0, : len(prompt_ids)].set(jnp.asarray(prompt_ids))

    @jax.jit
    def run(params, buf_1T):
        def body(i, buf_1T):
            logits_1TV = pieces.logits(params, buf_1T, cfg)
            return buf_1T.at[0, i].set(jnp.argmax(logits_1TV[0, i - 1]).astype(jnp.int32))

        return jax.lax.fori_loop(len(prompt_ids), buf_1T.shape[1], body, buf_1T)

    return [int(t) for t in run(params, buf_1T)[0, len(prompt_ids) :]]


def _tokens(*shape):
    return jnp.asarray(RNG.integers(0, CFG.vocab, shape), jnp.int32)


def test_prefill_then_decode_equals_full_recompute_at_every_position():
    tokens_BT = _tokens(2, 12)
    want_BTV = pieces.logits(_params(), tokens_BT, CFG)
    cache = kv_cache.init_cache(CFG, 2, 16)
    P = 5  # prompt, then one token at a time
    logits_BV, cache = kv_cache.prefill(_params(), tokens_BT[:, :P], jnp.full((2,), P), cache, CFG)
    got = [logits_BV]
    for t in range(P, 12):
        logits_BV, cache = kv_cache.decode_step(
            _params(), tokens_BT[:, t], jnp.full((2,), t), cache, CFG
        )
        got.append(logits_BV)
    np.testing.assert_allclose(jnp.stack(got, 1), want_BTV[:, P - 1 :], rtol=RTOL, atol=ATOL)


def test_prefill_reads_each_rows_last_prompt_token_not_the_window_end():
    """Right-padded prompts of 3 and 5 tokens in a window of 8: prefill's logits are the
    uncached model's at position length - 1 of each row's own tokens (the padding replaced by
    other tokens there, which causal attention never reads)."""
    lengths = [3, 5]
    rows_BT = _tokens(2, 8)
    padded_BT = jnp.where(jnp.arange(8)[None, :] < jnp.array(lengths)[:, None], rows_BT, 0)
    cache = kv_cache.init_cache(CFG, 2, 8)
    logits_BV, _ = jax.jit(kv_cache.prefill, static_argnums=4)(
        _params(), padded_BT, jnp.array(lengths), cache, CFG
    )
    full_BTV = jax.jit(pieces.logits, static_argnums=2)(_params(), rows_BT, CFG)
    want_BV = np.stack([full_BTV[b, n - 1] for b, n in enumerate(lengths)])
    np.testing.assert_allclose(logits_BV, want_BV, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
@pytest.mark.first_line
def test_rows_of_different_lengths_decode_as_if_alone():
    """Right-padded prompts of 3 and 7 tokens in one batch, then decode at per-row positions."""
    a, b = _tokens(1, 10)[0], _tokens(1, 10)[0]
    batch = jnp.stack([a.at[3:7].set(0)[:7], b[:7]])
    cache = kv_cache.init_cache(CFG, 2, 16)
    _, cache = kv_cache.prefill(_params(), batch, jnp.array([3, 7]), cache, CFG)
    logits_BV, _ = kv_cache.decode_step(
        _params(), jnp.array([a[3], b[7]]), jnp.array([3, 7]), cache, CFG
    )
    want_a = pieces.logits(_params(), a[None, :4], CFG)[0, -1]
    want_b = pieces.logits(_params(), b[None, :8], CFG)[0, -1]
    np.testing.assert_allclose(logits_BV, jnp.stack([want_a, want_b]), rtol=RTOL, atol=ATOL)


@pytest.mark.slow
@pytest.mark.first_line
def test_chunked_prefill_equals_one_prefill():
    tokens_1T = _tokens(1, 11)
    one, _ = kv_cache.prefill(
        _params(), tokens_1T, jnp.array([11]), kv_cache.init_cache(CFG, 1), CFG
    )
    cache = kv_cache.init_cache(CFG, 1)
    _, cache = kv_cache.prefill(_params(), tokens_1T[:, :6], jnp.array([6]), cache, CFG)
    two, _ = kv_cache.prefill(
        _params(), tokens_1T[:, 6:], jnp.array([5]), cache, CFG, start_B=jnp.array([6])
    )
    np.testing.assert_allclose(two, one, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
@pytest.mark.first_line
def test_greedy_generation_equals_the_recomputing_sampler():
    prompts = [[100, 101, 32], [35, 32, 116, 104, 101]]
    out = gen.generate(_params(), prompts, CFG, max_new=10)
    for b, prompt in enumerate(prompts):
        assert out.row(b) == greedy_sample(CFG, _params(), prompt, 10)


@pytest.mark.slow
@pytest.mark.first_line
def test_a_request_samples_the_same_tokens_whatever_else_is_in_the_batch():
    hot = sampling.SamplingParams(temperature=1.0, seed=7)
    alone = gen.generate(_params(), [[1, 2, 3]], CFG, 12, [hot])
    crowd = gen.generate(
        _params(),
        [[9, 9], [1, 2, 3], [4]],
        CFG,
        12,
        [sampling.SamplingParams(1.0, seed=1), hot, sampling.SamplingParams(0.5, top_k=5, seed=2)],
    )
    assert alone.row(0) == crowd.row(1)
    other = gen.generate(_params(), [[1, 2, 3]], CFG, 12, [sampling.SamplingParams(1.0, seed=8)])
    assert other.row(0) != alone.row(0)  # the seed matters (12 tokens from 256: a tie is ~0)


@pytest.mark.slow
@pytest.mark.first_line
def test_eos_and_max_tokens_stop_each_row():
    first = gen.generate(_params(), [[1, 2, 3]], CFG, 8).row(0)
    eos = first[3]
    out = gen.generate(_params(), [[1, 2, 3], [1, 2, 3]], CFG, 8, max_tokens=[8, 2], eos_id=eos)
    stop = first.index(eos) + 1
    assert out.row(0) == first[:stop]  # up to and including the first EOS
    assert out.row(1) == first[: min(2, stop)]
    assert not out.valid[0, stop:].any() and (out.tokens[0, stop:] == 0).all()


LOGITS_V = jnp.log(jnp.array([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02]))


def _draws(n, **kw):
    p = sampling.SamplingParams(**kw)
    a = {k: jnp.repeat(v, n) for k, v in sampling.as_arrays([p]).items()}
    keys = sampling.request_keys(jnp.arange(n, dtype=jnp.uint32), 0)
    return np.asarray(
        sampling.sample(jnp.tile(LOGITS_V, (n, 1)), keys, a["temperature"], a["top_k"], a["top_p"])
    )


def test_temperature_zero_top_k_one_and_a_tiny_nucleus_are_greedy():
    for kw in ({"temperature": 0.0}, {"top_k": 1}, {"top_p": 0.05}):
        assert (_draws(64, **kw) == 0).all(), kw


def test_top_k_and_top_p_restrict_the_support():
    assert set(_draws(4000, top_k=3)) == {0, 1, 2}
    # nucleus 0.6: 0.30 + 0.20 = 0.50 < 0.6, so token 2 is needed too; token 3 never
    assert set(_draws(4000, top_p=0.6)) == {0, 1, 2}


def test_draws_follow_the_softmax():
    """Pearson's chi-square over the 8 outcomes, 20000 draws: df = 7, and the 0.999 quantile of
    chi-square(7) is 24.32, so a correct sampler fails this 1 time in 1000."""
    n = 20_000
    counts = np.bincount(_draws(n), minlength=8)
    expected = n * np.exp(np.asarray(LOGITS_V))
    assert ((counts - expected) ** 2 / expected).sum() < 24.32


def test_bad_sampling_settings_are_refused():
    for kw in ({"temperature": -0.1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            sampling.SamplingParams(**kw)
    with pytest.raises(ValueError, match="max_seq"):
        gen.generate(_params(), [[1] * 30], CFG, 8)


@pytest.mark.parametrize("moe_every", [1, 2])
def test_an_moe_models_cached_forward_equals_its_uncached_one(moe_every):
    """The cached pass is the trunk with a cache piece, so an MoE model decodes: prefill of the
    prompt, then one token at a time, equals the full forward at every position. Dropless
    routing, since capacity-based routing depends on the tokens per call."""
    cfg = CFG.replace(n_experts=4, top_k=2, moe_mode="dropless", moe_every=moe_every)
    params = ms.init_params(cfg, 0)
    tokens_BT = _tokens(2, 10)
    want_BTV = pieces.logits(params, tokens_BT, cfg)
    cache = kv_cache.init_cache(cfg, 2, 16)
    P = 4
    logits_BV, cache = kv_cache.prefill(params, tokens_BT[:, :P], jnp.full((2,), P), cache, cfg)
    got = [logits_BV]
    for t in range(P, 10):
        logits_BV, cache = kv_cache.decode_step(
            params, tokens_BT[:, t], jnp.full((2,), t), cache, cfg
        )
        got.append(logits_BV)
    np.testing.assert_allclose(np.stack(got, 1), want_BTV[:, P - 1 :], rtol=RTOL, atol=ATOL)


def _blockwise_logits(cache, tokens_BT, P, block):
    """Prefill P tokens, then one at a time: every position's logits [B, T - P + 1, V] through
    `kv_cache.forward` reading `block` slots per iteration."""
    B, T = tokens_BT.shape
    fwd = jax.jit(kv_cache.forward, static_argnames=("cfg", "block"))
    positions_BT = jnp.broadcast_to(jnp.arange(P), (B, P))
    logits_BTV, cache = fwd(_params(), tokens_BT[:, :P], positions_BT, cache, cfg=CFG, block=block)
    got = [logits_BTV[:, -1]]
    for t in range(P, T):
        logits_BTV, cache = fwd(
            _params(), tokens_BT[:, t : t + 1], jnp.full((B, 1), t), cache, cfg=CFG, block=block
        )
        got.append(logits_BTV[:, 0])
    return jnp.stack(got, 1)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_attention_read_in_blocks_equals_full_recompute(layout):
    """Blocks of 4 slots over 18 (contiguous: the last block starts early and masks the slots it
    shares with the one before) or of 2 pages of 2 over a table of 9 pages (paged, scattered):
    prefill of 5, then decode to 16 tokens, every position equal to the uncached model."""
    tokens_BT = _tokens(2, 16)
    if layout == "contiguous":
        cache = kv_cache.init_cache(CFG, 2, 18)
    else:
        table = np.array([[3, 7, 1, 5, 9, 11, 2, 4, 6], [8, 10, 12, 13, 14, 15, 16, 17, 18]])
        cache = kv_cache.paged(kv_cache.init_paged(CFG, 19, 2), table)
    got = _blockwise_logits(cache, tokens_BT, 5, block=4)
    want_BTV = pieces.logits(_params(), tokens_BT, CFG)[:, 4:]
    np.testing.assert_allclose(got, want_BTV, rtol=RTOL, atol=ATOL)


def test_slots_past_the_live_blocks_are_never_read():
    """A cache whose slots beyond the live blocks hold NaN: a decode step at position 9 (blocks of
    4: slots 0-11 live) gives the same finite logits as with zeros there. Reading those slots at
    all, even masked, would make them NaN (0 x NaN in the probabilities' product with V)."""
    tokens_BT = _tokens(2, 10)
    clean = kv_cache.init_cache(CFG, 2, 32)
    poisoned = {k: v.at[:, :, 12:].set(jnp.nan) for k, v in clean.items()}
    got = {
        name: _blockwise_logits(cache, tokens_BT, 9, block=4)
        for name, cache in (("clean", clean), ("poisoned", poisoned))
    }
    assert np.isfinite(np.asarray(got["poisoned"])).all()
    np.testing.assert_array_equal(got["poisoned"], got["clean"])


def test_a_decode_steps_bytes_do_not_grow_with_unused_slots():
    """The compiled decode step (cache donated, as the engine's pool is) at 64 live tokens: bytes
    accessed (cost_analysis) in a 4,096-slot cache within 5% of a 128-slot one's. A whole-cache
    copy or read per step would add 32x the small cache's bytes."""
    cfg = CFG.replace(max_seq=4096)
    step = jax.jit(lambda p, t, pos, c: kv_cache.decode_step(p, t, pos, c, cfg), donate_argnums=3)
    tok, pos = jnp.zeros((1,), jnp.int32), jnp.full((1,), 63, jnp.int32)

    def bytes_accessed(S):
        lowered = step.lower(_params(), tok, pos, kv_cache.init_cache(cfg, 1, S))
        return lowered.compile().cost_analysis()["bytes accessed"]

    small, large = bytes_accessed(128), bytes_accessed(4096)
    assert large <= 1.05 * small, (small, large)


def test_int8_quantization_is_the_symmetric_per_vector_rule():
    """Against NumPy: scale = max |x| / 127 over head_dim, q = x / scale rounded to the nearest
    (ties to even), |q x scale - x| <= scale / 2; a zero vector stores 0 with scale 0. Vectors
    of magnitudes 1e-3 to 1e3 side by side: one scale per token and head, not per tensor."""
    x = RNG.normal(size=(5, 3, 2, 16)) * 10.0 ** RNG.integers(-3, 4, size=(5, 3, 2, 1))
    x[1, 2, 0] = 0.0
    x = x.astype(np.float32)
    q, scale = jax.device_get(kv_cache.quantize(jnp.asarray(x)))
    want_scale = np.abs(x).max(-1) / np.float32(127)
    np.testing.assert_allclose(scale, want_scale, rtol=1e-6)
    safe = np.where(want_scale > 0, want_scale, 1)[..., None]
    np.testing.assert_array_equal(q, np.round(x / safe).astype(np.int8))
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert (np.abs(q * scale[..., None] - x) <= 0.5 * scale[..., None] * (1 + 1e-6)).all()
    assert scale[1, 2, 0] == 0 and (q[1, 2, 0] == 0).all()


def _rounded_attend(q_BTHK, k_BSGK, v_BSGK, q_positions, k_positions):
    """The model's attention with its keys and values stored as int8 and read back: each token's
    and kv head's vector rounded to 255 levels of max |x| / 127 (the oracle for an int8 cache)."""

    def rounded(x):
        s = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127.0
        return (jnp.round(x / jnp.where(s > 0, s, 1.0)) * s).astype(x.dtype)

    return pieces.attend(q_BTHK, rounded(k_BSGK), rounded(v_BSGK), q_positions, k_positions)


def assert_int8_rounding(got, rounded, full):
    """`got` (through an int8 cache) is the model with int8-rounded keys and values (`rounded`),
    not the full-precision one (`full`): its distance from `rounded` is under INT8_KV_FRACTION of
    the distance rounding makes (tolerances.py: a value on a rounding boundary may round the
    other way in the cached path's summation order)."""
    got, rounded, full = (np.asarray(x, np.float64) for x in (got, rounded, full))
    rounding = np.abs(rounded - full).max()
    assert rounding > 10 * ATOL  # the rounding is really there
    assert np.abs(got - rounded).max() <= INT8_KV_FRACTION * rounding, (
        np.abs(got - rounded).max(),
        rounding,
    )


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_an_int8_cache_equals_the_model_with_rounded_keys_and_values(layout):
    """Prefill of 5, then decode to 16 tokens through an int8 cache (blocks of 4; paged: a
    scattered table): every position's logits are the uncached model's whose attention reads
    int8-rounded keys and values, not the full-precision model's."""
    tokens_BT = _tokens(2, 16)
    if layout == "contiguous":
        cache = kv_cache.init_cache(CFG, 2, 18, dtype="int8")
    else:
        table = np.array([[3, 7, 1, 5, 9, 11, 2, 4, 6], [8, 10, 12, 13, 14, 15, 16, 17, 18]])
        cache = kv_cache.paged(kv_cache.init_paged(CFG, 19, 2, dtype="int8"), table)
    assert cache["k"].dtype == jnp.int8 and cache["k_scale"].shape == cache["k"].shape[:-1]
    got = _blockwise_logits(cache, tokens_BT, 5, block=4)
    rounded = pieces.DENSE.replace(attend=_rounded_attend)
    want_BTV = pieces.logits(_params(), tokens_BT, CFG, rounded)[:, 4:]
    assert_int8_rounding(got, want_BTV, pieces.logits(_params(), tokens_BT, CFG)[:, 4:])


def test_an_int8_token_takes_its_values_bytes_plus_one_scale_per_head():
    """Bytes per token of the pool the engine allocates, measured from its arrays: bf16 is
    `calc kv`'s 2 x L x G x K x 2; int8 is `calc kv --dtype-bytes 1` plus a float32 scale per
    layer, kv head and K or V, so a page of head_dim 64 holds 128 / 68 = 1.88x bf16's tokens."""
    from jaxscale.calc.kv import kv_bytes_per_token

    cfg = CFG.replace(d_model=512, n_heads=8, n_kv_heads=2)  # head_dim 64
    L, G, K, ps = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 16

    def per_token(dtype):
        pool = kv_cache.init_paged(cfg, 4, ps, dtype=dtype)
        return sum(x.nbytes for x in pool.values()) / (4 * ps)

    assert per_token("bfloat16") == kv_bytes_per_token(L, G, K, 2)
    assert per_token("int8") == kv_bytes_per_token(L, G, K, 1) + 2 * L * G * 4
    assert per_token("bfloat16") / per_token("int8") == pytest.approx(128 / 68)
    assert kv_cache.bytes_per_token(cfg, "int8") == per_token("int8")


def test_a_cache_dtype_that_is_neither_float_nor_int8_is_refused():
    with pytest.raises(ValueError, match="int32.*int8"):
        kv_cache.init_paged(CFG, 4, 2, dtype="int32")
