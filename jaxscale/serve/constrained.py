"""Constrained decoding: a grammar's mask applied to the logits before sampling
(`jnp.where(mask, logits, -inf)`), on the model with its KV cache.

A constraint is a small object with `initial()`, `allowed(state, budget) -> [256] bool`,
`advance(state, byte) -> state` and `done(state)`; states are immutable, so speculative decoding
can advance a copy for the draft. Masks take the tokens left (`budget`) into account: a byte is
allowed only if the output can still be completed within the budget, so a constrained output is
always complete (JSON that parses, a full regex match) however the model and the seed choose.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.serve import json_pda
from jaxscale.serve.regex_dfa import compile_regex
from jaxscale.serve.sampling import SamplingParams, sample


class JsonConstraint:
    """Compact JSON with a top-level object or array (jaxscale/serve/json_pda.py)."""

    def initial(self):
        return json_pda.INITIAL

    def allowed(self, state, budget: int) -> np.ndarray:
        return json_pda.allowed(state, budget)

    def advance(self, state, byte: int):
        return json_pda.advance(state, byte)

    def done(self, state) -> bool:
        return json_pda.done(state)


class RegexConstraint:
    """A full match of `pattern`; the output ends when the model picks `end` (default newline) in
    an accepting state, or when the match cannot be extended. `end` is not part of the match."""

    def __init__(self, pattern: str, end: int = ord("\n")):
        self.pattern, self.end, self.dfa = pattern, end, compile_regex(pattern)

    def initial(self):
        return (0, False)  # (DFA state, ended)

    def allowed(self, state, budget: int) -> np.ndarray:
        s, _ = state
        nxt = self.dfa.next[s]
        ok = (nxt >= 0) & (self.dfa.dist[np.maximum(nxt, 0)] >= 0)
        ok &= 1 + self.dfa.dist[np.maximum(nxt, 0)] <= budget
        if self.dfa.accepting[s]:
            ok[self.end] = True
        return ok

    def advance(self, state, byte: int):
        s, _ = state
        if self.dfa.accepting[s] and byte == self.end:
            return (s, True)
        return (int(self.dfa.next[s, byte]), False)

    def done(self, state) -> bool:
        s, ended = state
        return ended or (bool(self.dfa.accepting[s]) and not (self.dfa.next[s] >= 0).any())

    def text(self, out: list[int]) -> bytes:
        return bytes(b for b in out if b != self.end) if out and out[-1] == self.end else bytes(out)


@partial(jax.jit, static_argnames="cfg")
def _step(params, tokens_1T, start, cache, mask_V, key, settings, cfg):
    positions_1T = start + jnp.arange(tokens_1T.shape[1])[None, :]
    logits_1TV, cache = kv_cache.forward(params, tokens_1T, positions_1T, cache, cfg)
    # the grammar's mask after temperature/top-k/top-p, as the engine samples
    tok_1 = sample(
        logits_1TV[:, -1],
        key[None],
        settings["temperature"],
        settings["top_k"],
        settings["top_p"],
        mask_V[None],
    )
    return tok_1[0], cache


def generate(
    params,
    cfg: ModelConfig,
    prompt: list[int],
    constraint,
    max_new: int,
    sampling: SamplingParams | None = None,
) -> list[int]:
    """Up to `max_new` bytes after `prompt`, each allowed by `constraint` with the bytes left."""
    sampling = sampling or SamplingParams(0.0)
    if len(prompt) + max_new > cfg.max_seq:
        raise ValueError(f"prompt ({len(prompt)}) + max_new ({max_new}) exceeds max_seq")
    from jaxscale.serve.sampling import as_arrays

    settings = as_arrays([sampling])
    cache, key = kv_cache.init_cache(cfg, 1), jax.random.key(sampling.seed)
    state, out, feed, pos = constraint.initial(), [], list(prompt), 0
    while len(out) < max_new and not constraint.done(state):
        mask = constraint.allowed(state, max_new - len(out))
        if not mask.any():
            raise RuntimeError(f"the constraint allows nothing after {bytes(out)!r}")
        tok, cache = _step(
            params,
            jnp.asarray([feed], jnp.int32),
            pos,
            cache,
            jnp.asarray(mask),
            jax.random.fold_in(key, len(out)),
            settings,
            cfg,
        )
        tok = int(tok)
        pos += len(feed)
        out.append(tok)
        state, feed = constraint.advance(state, tok), [tok]
    return out


class SchemaConstraint:
    """JSON that satisfies a JSON schema, through outlines-core (the optional `grammar` extra):
    its Rust compiler turns the schema into a regex and an index of allowed next tokens over our
    byte vocabulary (printable ASCII; `end`, default newline, ends the output). Budget-aware like
    the others: the fewest bytes from each index state to a final one come from a reverse
    breadth-first search over the index's transitions."""

    def __init__(self, schema: dict | str, end: int = ord("\n")):
        import json
        from collections import deque

        from outlines_core import Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema

        text = schema if isinstance(schema, str) else json.dumps(schema)
        self.regex = build_regex_from_schema(text)
        vocab = Vocabulary(end, {chr(b): [b] for b in range(0x20, 0x7F)})
        self.index, self.end = Index(self.regex, vocab), end
        self.moves = {
            s: {t: n for t, n in m.items() if t != end}
            for s, m in self.index.get_transitions().items()
        }
        back: dict[int, list[int]] = {}
        for s, m in self.moves.items():
            for n in m.values():
                back.setdefault(n, []).append(s)
        self.dist = {s: 0 for s in self.index.get_final_states()}
        queue = deque(self.dist)
        while queue:
            n = queue.popleft()
            for s in back.get(n, ()):
                if s not in self.dist:
                    self.dist[s] = self.dist[n] + 1
                    queue.append(s)

    def initial(self):
        return (self.index.get_initial_state(), False)

    def allowed(self, state, budget: int) -> np.ndarray:
        s, _ = state
        mask = np.zeros(256, bool)
        for t, n in self.moves.get(s, {}).items():
            mask[t] = n in self.dist and 1 + self.dist[n] <= budget
        if self.index.is_final_state(s):
            mask[self.end] = True
        return mask

    def advance(self, state, byte: int):
        s, _ = state
        if byte == self.end and self.index.is_final_state(s):
            return (s, True)
        return (self.moves[s][byte], False)

    def done(self, state) -> bool:
        s, ended = state
        return ended or (self.index.is_final_state(s) and not self.moves.get(s))

    def text(self, out: list[int]) -> bytes:
        return bytes(out[:-1]) if out and out[-1] == self.end else bytes(out)
