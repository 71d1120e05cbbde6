"""The sampling filters against a plain NumPy statement of the documented rule (float64, one
row at a time): after logits / temperature, keep every token whose logit is at least the k-th
largest (ties at the cut kept); then, unless top_p is 1, keep the smallest set of most likely
of those tokens whose probability (renormalised over them) reaches top_p, again with ties at
the cut kept. top_p = 1 keeps everything the top-k step kept."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.serve.sampling import filtered_logits

_filtered = jax.jit(filtered_logits)  # one compile per shape, not one per op


def rule(logits_V, temperature, top_k, top_p) -> np.ndarray:
    """The kept tokens (bool [V]) by the documented rule, in float64."""
    x = np.asarray(logits_V, np.float64) / (temperature if temperature > 0 else 1.0)
    V = len(x)
    keep = np.ones(V, bool)
    if 0 < top_k < V:
        keep = x >= np.sort(x)[::-1][top_k - 1]
    if top_p >= 1:
        return keep
    p = np.where(keep, np.exp(x - x[keep].max()), 0.0)
    p /= p.sum()
    mass, cut = 0.0, None
    for i in np.argsort(-x, kind="stable"):
        if not keep[i]:
            break
        if mass >= top_p:  # the more likely tokens already reach top_p
            break
        mass, cut = mass + p[i], x[i]
    return keep & (x >= cut)


def kept(logits_BV, temperature, top_k, top_p) -> np.ndarray:
    B = logits_BV.shape[0]
    x = _filtered(
        jnp.asarray(logits_BV),
        jnp.full((B,), temperature, jnp.float32),
        jnp.full((B,), top_k, jnp.int32),
        jnp.full((B,), top_p, jnp.float32),
    )
    return np.isfinite(np.asarray(x))


def test_a_tie_at_the_kth_logit_joins_the_nucleus():
    # top-k 2 keeps the tie [2, 1, 1]; the nucleus over those three: token 0 has 0.576 < 0.7,
    # so the next (tied) logit joins, and with it its tie
    logits = np.array([[2.0, 1.0, 1.0, 0.0]], np.float32)
    assert rule(logits[0], 1.0, 2, 0.7).tolist() == [True, True, True, False]
    assert kept(logits, 1.0, 2, 0.7)[0].tolist() == [True, True, True, False]


def test_top_p_one_keeps_every_token_of_a_confident_row():
    # a confident row: float32's running sum reaches 1 long before the tail
    logits = -np.arange(256, dtype=np.float32)[None] / 10
    logits[0, 7] = 30.0
    assert kept(logits, 1.0, 0, 1.0).sum() == 256
    assert kept(logits, 0.7, 40, 1.0).sum() == 40  # the top-k cut alone
    assert kept(logits, 1.0, 0, 0.999).sum() == 1


@pytest.mark.parametrize("top_k", [0, 1, 3, 255, 256, 300])
@pytest.mark.parametrize("top_p", [1e-6, 0.3, 0.9, 0.9999, 1.0])
def test_the_filters_keep_what_the_rule_keeps(top_k, top_p):
    rng = np.random.default_rng(0)
    rows = [
        rng.normal(size=256) * 3,  # spread
        rng.normal(size=256) * 0.01,  # nearly flat
        np.round(rng.normal(size=256) * 4) / 2,  # many ties
        np.where(np.arange(256) == 5, 25.0, rng.normal(size=256)),  # confident
    ]
    # bf16 logits, as a bf16 model gives them: ties are common
    logits = np.asarray(jnp.asarray(np.stack(rows), jnp.bfloat16).astype(jnp.float32))
    for temperature in (1.0, 0.6):
        got = kept(logits, temperature, top_k, top_p)
        for b, row in enumerate(logits):
            want = rule(row, temperature, top_k, top_p)
            assert got[b].tolist() == want.tolist(), (b, temperature, got[b].sum(), want.sum())


def test_each_row_is_cut_by_its_own_settings_when_only_some_rows_ask_for_a_cut():
    """A batch's rows with and without cuts side by side (the cuts are skipped only for a batch
    where no row asks for one): every row keeps what the rule keeps with its own settings."""
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(4, 256)) * 3).astype(np.float32)
    settings = [(1.0, 0, 1.0), (1.0, 5, 1.0), (0.8, 0, 1.0), (1.0, 0, 0.5)]
    for order in (settings, settings[::-1], [settings[0], settings[2]] * 2):
        t, k, p = (jnp.asarray(c) for c in zip(*order, strict=True))
        got = np.isfinite(np.asarray(_filtered(jnp.asarray(logits), t, k, p)))
        for b, (temperature, top_k, top_p) in enumerate(order):
            assert got[b].tolist() == rule(logits[b], temperature, top_k, top_p).tolist(), b
