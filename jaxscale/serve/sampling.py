"""Sampling a next token per row: greedy, temperature, top-k and top-p, each row with its own
settings and its own key, so a request's tokens depend on its seed alone, never on what else is
in the batch.

Per-request keys: token i of a request with seed s is drawn with fold_in(key(s), i).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1: no nucleus cut
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def as_arrays(params: list[SamplingParams]) -> dict:
    """Per-row arrays of a batch's settings (what `sample` takes), on the host: a jitted
    caller moves them with its other inputs (a device array each would cost a dispatch)."""
    return {
        "temperature": np.asarray([p.temperature for p in params], np.float32),
        "top_k": np.asarray([p.top_k for p in params], np.int32),
        "top_p": np.asarray([p.top_p for p in params], np.float32),
        "seed": np.asarray([p.seed for p in params], np.uint32),
    }


def request_keys(seeds_B, index):
    """The key of each row's token number `index` (a scalar or one per row)."""
    index_B = jnp.broadcast_to(jnp.asarray(index, jnp.uint32), seeds_B.shape)
    return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seeds_B, index_B)


def filtered_logits(logits_BV, temperature_B, top_k_B, top_p_B):
    """logits / temperature with everything outside the top-k and the top-p nucleus at -inf.
    The nucleus is the smallest set of most likely tokens whose probability reaches top_p (after
    the top-k cut); ties at a cut are kept; top_p = 1 makes no nucleus cut."""
    t_B = jnp.where(temperature_B > 0, temperature_B, 1.0)
    x_BV = logits_BV.astype(jnp.float32) / t_B[:, None]
    # the cuts sort every row's vocabulary: at a real vocabulary that costs more than the model's
    # step ([8, 32000]: 50 ms on a CPU), so a batch where no row asks for a cut skips it
    cuts = jnp.any(top_k_B > 0) | jnp.any(top_p_B < 1)
    # both branches named at module level: a caller running this op by op (outside jit) then
    # finds the cond it compiled before; a fresh lambda made every call compile again
    return jax.lax.cond(cuts, _cut, _no_cut, x_BV, top_k_B, top_p_B)


def _no_cut(x_BV, top_k_B, top_p_B):
    return x_BV


def _cut(x_BV, top_k_B, top_p_B):
    """`filtered_logits`' top-k and top-p cuts of the scaled logits."""
    V = x_BV.shape[-1]
    desc_BV = -jnp.sort(-x_BV, axis=-1)
    k_B = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, V), V)
    kth_B1 = jnp.take_along_axis(desc_BV, (k_B - 1)[:, None], axis=-1)
    x_BV = jnp.where(x_BV >= kth_B1, x_BV, -jnp.inf)
    # the nucleus is measured over what the top-k step kept, ties at the k-th logit included
    desc_BV = jnp.where(desc_BV >= kth_B1, desc_BV, -jnp.inf)
    probs_BV = jax.nn.softmax(desc_BV, axis=-1)
    # a token is in the nucleus while the more likely tokens' mass is below top_p, i.e. while
    # its own and the less likely tokens' mass exceeds 1 - top_p: summed from the tail, so a
    # confident row's running sum cannot round to 1 before its last tokens
    tail_BV = jnp.cumsum(probs_BV[:, ::-1], axis=-1)[:, ::-1]
    n_keep_B = jnp.maximum(jnp.sum(tail_BV > 1 - top_p_B[:, None], axis=-1), 1)
    pth_B1 = jnp.take_along_axis(desc_BV, (n_keep_B - 1)[:, None], axis=-1)
    nucleus_BV = jnp.where(x_BV >= pth_B1, x_BV, -jnp.inf)
    return jnp.where(top_p_B[:, None] >= 1, x_BV, nucleus_BV)


def sample(logits_BV, keys_B, temperature_B, top_k_B, top_p_B, mask_BV=None):
    """Next token per row [B] int32: argmax where temperature is 0, else a draw from the
    filtered softmax with that row's key. `mask_BV` (a grammar's allowed tokens, bool) applies
    after temperature, top-k and top-p; where those cut every allowed token, the allowed argmax."""
    x_BV = filtered_logits(logits_BV, temperature_B, top_k_B, top_p_B)
    if mask_BV is not None:
        x_BV = jnp.where(mask_BV, x_BV, -jnp.inf)
        logits_BV = jnp.where(mask_BV, logits_BV, -jnp.inf)
    greedy_B = jnp.argmax(logits_BV, axis=-1)
    drawn_B = jax.vmap(jax.random.categorical)(keys_B, x_BV)
    if mask_BV is not None:
        drawn_B = jnp.where(jnp.isfinite(x_BV).any(axis=-1), drawn_B, greedy_B)
    return jnp.where(temperature_B > 0, drawn_B, greedy_B).astype(jnp.int32)
