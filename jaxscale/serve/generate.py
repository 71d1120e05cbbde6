"""Static-batch generation with the KV cache: one prefill, then `lax.scan` over new tokens, each
row stopping at EOS or its own max_tokens. One compiled program per (batch, prompt length,
max_new) shape: what RL rollouts use; the serving engine schedules requests around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.model import state as ms
from jaxscale.serve import sampling
from jaxscale.sharding import REPLICATED_RULES, Sharder


@dataclass(frozen=True)
class Generated:
    tokens: np.ndarray  # [B, max_new] int32; 0 after a row stopped
    valid: np.ndarray  # [B, max_new] bool: the token was produced (EOS included)
    logprobs: np.ndarray  # [B, max_new] float32: log p(token) under the model (temperature 1)

    def row(self, b: int) -> list[int]:
        return [int(t) for t, ok in zip(self.tokens[b], self.valid[b], strict=True) if ok]


@partial(jax.jit, static_argnames=("cfg", "max_new", "eos_id", "sharder"))
def generate_batch(
    params, prompts_BT, lengths_B, settings, max_tokens_B, cfg, max_new, eos_id, sharder=None
):
    B, T = prompts_BT.shape
    cache = kv_cache.init_cache(cfg, B, T + max_new, sharder=sharder)
    logits_BV, cache = kv_cache.prefill(params, prompts_BT, lengths_B, cache, cfg)

    def step(carry, i):
        logits_BV, cache, done_B = carry
        keys_B = sampling.request_keys(settings["seed"], i)
        tok_B = sampling.sample(
            logits_BV, keys_B, settings["temperature"], settings["top_k"], settings["top_p"]
        )
        valid_B = ~done_B
        tok_B = jnp.where(valid_B, tok_B, 0)
        logp_B = jnp.take_along_axis(jax.nn.log_softmax(logits_BV), tok_B[:, None], -1)[:, 0]
        stop_B = (i + 1 >= max_tokens_B) | ((tok_B == eos_id) if eos_id is not None else False)
        logits_BV, cache = kv_cache.decode_step(params, tok_B, lengths_B + i, cache, cfg)
        return (logits_BV, cache, done_B | stop_B), (tok_B, valid_B, logp_B)

    done_B = max_tokens_B <= 0
    _, (toks, valid, logps) = jax.lax.scan(step, (logits_BV, cache, done_B), jnp.arange(max_new))
    return toks.T, valid.T, logps.T


def generate(
    params,
    prompts: list[list[int]],
    cfg: ModelConfig,
    max_new: int,
    params_per_row: list[sampling.SamplingParams] | None = None,
    max_tokens: list[int] | None = None,
    eos_id: int | None = None,
    mesh=None,
) -> Generated:
    """Continue each prompt by up to `max_new` tokens (or its own max_tokens), stopping a row at
    `eos_id` (kept as its last token). With a `mesh`, tensor-parallel decode: parameters laid
    out by the sharding rules (heads and MLP over `tensor`, whole otherwise), the KV cache split
    by kv heads, the rows over the data axes; GSPMD places the all-reduces."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    B, T = len(prompts), max(len(p) for p in prompts)
    if T + max_new > cfg.max_seq:
        raise ValueError(f"prompt ({T}) + max_new ({max_new}) exceeds max_seq={cfg.max_seq}")
    padded = np.zeros((B, T), np.int32)
    for b, p in enumerate(prompts):
        padded[b, : len(p)] = p
    settings = sampling.as_arrays(params_per_row or [sampling.SamplingParams(0.0)] * B)
    limits = np.asarray(max_tokens if max_tokens is not None else [max_new] * B, np.int32)
    args = (
        jnp.asarray(padded),
        jnp.asarray([len(p) for p in prompts], jnp.int32),
        settings,
        jnp.asarray(np.minimum(limits, max_new)),
    )
    if mesh is None:
        toks, valid, logps = generate_batch(params, *args, cfg, max_new, eos_id)
    else:
        sharder = Sharder(mesh, REPLICATED_RULES)
        with jax.set_mesh(mesh):
            params = jax.device_put(params, ms.param_shardings(cfg, sharder))
            toks, valid, logps = generate_batch(params, *args, cfg, max_new, eos_id, sharder)
    return Generated(np.asarray(toks), np.asarray(valid), np.asarray(logps))
