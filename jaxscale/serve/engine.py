"""The serving engine: continuous batching over a paged KV cache (jaxscale/serve/scheduler.py
decides, this module runs the device programs).

Every step runs at most two compiled programs on the page pool: the one-token rows ([B, 1]:
decode steps, and prompts with one token left) and the prefill chunks ([B, T]); each samples
the next token of the rows that reached the end of their tokens. Shapes are static: B is rounded
up to a power of two (up to max_num_seqs) and T to a prefill bucket, padding rows write to page
0 and are never read, so the number of compiles is bounded by len(batch sizes) x (1 + len(prefill
buckets)) and reported (`compiles`; `warmup` compiles them all): the JAX form of the seed's
CUDA-graph lesson.
"""

from __future__ import annotations

import codecs
import contextlib
import time
from dataclasses import dataclass, field
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.serve import sampling
from jaxscale.serve.pages import NULL_PAGE, PageAllocator
from jaxscale.serve.prefix_cache import RadixCache
from jaxscale.serve.scheduler import Request, Scheduler


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8  # slots: requests running at once
    max_num_batched_tokens: int = 64  # tokens fed per step (decode tokens + prefill chunks)
    page_size: int = 16
    n_pages: int = 64  # the pool, page 0 included (reserved)
    eos_id: int | None = None
    prefix_cache: bool = True  # reuse the KV pages of cached prompt prefixes
    static_batching: bool = False  # admit only into an empty batch (the baseline it improves on)


@dataclass
class Event:
    """One new token of a request, with its text so far decoded (never a split character)."""

    request_id: str
    token: int
    text: str
    finish_reason: str | None
    # the token's log-probability under the model (raw logits: before temperature, top-k,
    # top-p and any grammar), and the TOP_LOGPROBS most likely tokens' (ids, log-probabilities)
    logprob: float = 0.0
    top: tuple = ()


TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs; computed for every row, a [B, 20] top-k


class Detokenizer:
    """Bytes to text as they arrive: a multi-byte UTF-8 character is held back until its last
    byte (invalid bytes become U+FFFD); tokens beyond the 256 bytes have no text."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(bytes([token]) if token < 256 else b"")

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


def _placed(params, pool, cfg: ModelConfig, mesh):
    """Parameters and pool laid out for tensor-parallel decode on `mesh` (a mesh whose only
    axis of size > 1 is `tensor`: a data axis would split the engine's rows, which replicas
    do, not one engine)."""
    from jaxscale.model import state as ms
    from jaxscale.sharding import REPLICATED_RULES, Sharder

    wide = {a: n for a, n in mesh.shape.items() if n > 1}
    if set(wide) - {"tensor"}:
        raise ValueError(
            f"the engine runs tensor-parallel decode (--mesh tp=N); the mesh {dict(mesh.shape)} "
            "has other axes"
        )
    tp = wide.get("tensor", 1)
    if cfg.n_kv_heads % tp:
        raise ValueError(f"tp={tp} must divide the model's {cfg.n_kv_heads} kv heads")
    if cfg.n_experts:
        raise ValueError("tensor-parallel decode of an MoE model is not implemented")
    sharder = Sharder(mesh, REPLICATED_RULES)
    with jax.set_mesh(mesh):
        params = jax.device_put(params, ms.param_shardings(cfg, sharder))
        pool = jax.device_put(pool, sharder.named(POOL_AXES))
    return params, pool


def _on(mesh):
    """The mesh as the context of the step's dispatch, or nothing on one device."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def _bucket(n: int, sizes) -> int:
    for s in sizes:
        if n <= s:
            return s
    raise ValueError(f"{n} exceeds the largest bucket {sizes[-1]}")


@partial(jax.jit, static_argnames="cfg", donate_argnames="pool")
def _run(params, pool, table_BN, tokens_BT, positions_BT, last_B, settings, index_B, mask_BV, cfg):
    """Feed tokens at positions through the paged cache; sample each row's next token from the
    logits at its last real token, among the tokens `mask_BV` allows (all, unless the request
    has a grammar). Returns (pool, tokens [B])."""
    logits_BTV, cache = kv_cache.forward(
        params, tokens_BT, positions_BT, kv_cache.paged(pool, table_BN), cfg
    )
    logits_BV = logits_BTV[jnp.arange(tokens_BT.shape[0]), last_B]
    keys_B = sampling.request_keys(settings["seed"], index_B)
    tok_B = sampling.sample(
        logits_BV, keys_B, settings["temperature"], settings["top_k"], settings["top_p"], mask_BV
    )
    logp_BV = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
    top_BK, top_ids_BK = jax.lax.top_k(logp_BV, min(TOP_LOGPROBS, logp_BV.shape[-1]))
    logp_B = jnp.take_along_axis(logp_BV, tok_B[:, None], axis=-1)[:, 0]
    return {"k": cache["k"], "v": cache["v"]}, (tok_B, logp_B, top_ids_BK, top_BK)


# the page pool [L, n_pages, page_size, G, K] under tensor parallelism: each device holds its
# kv heads' pages, the ones its query heads read (attention needs no collective)
POOL_AXES = ("layers", None, None, "kv_heads", "head_dim")


@dataclass
class Engine:
    params: dict
    cfg: ModelConfig
    ecfg: EngineConfig = field(default_factory=EngineConfig)
    # tensor-parallel decode: parameters by the sharding rules (heads and MLP over `tensor`),
    # the pool split by kv heads; GSPMD places the all-reduces (two per layer). None: one device
    mesh: jax.sharding.Mesh | None = None

    def __post_init__(self):
        if self.cfg.n_experts and self.cfg.moe_mode != "dropless":
            # capacity routing couples the tokens of one call (which ones drop depends on the
            # batch); served dropless, each token goes to its top-k experts whatever shares its
            # step: the trained model's forward wherever training dropped nothing
            self.cfg = self.cfg.replace(moe_mode="dropless")
        e, cfg = self.ecfg, self.cfg
        if cfg.max_seq % e.page_size:
            raise ValueError(f"page_size {e.page_size} must divide max_seq {cfg.max_seq}")
        self.n_table = cfg.max_seq // e.page_size
        self.allocator = PageAllocator(e.n_pages, e.page_size)
        self.cache = RadixCache(self.allocator) if e.prefix_cache else None
        self.scheduler = Scheduler(
            self.allocator,
            e.max_num_seqs,
            e.max_num_batched_tokens,
            cfg.max_seq,
            self.cache,
            e.static_batching,
        )
        self.pool = kv_cache.init_paged(cfg, e.n_pages, e.page_size)
        if self.mesh is not None:
            self.params, self.pool = _placed(self.params, self.pool, cfg, self.mesh)
        self.batch_sizes = tuple(2**i for i in range((e.max_num_seqs - 1).bit_length() + 1))
        # prefill chunk lengths: powers of two from 8 up to the first that holds the budget
        top = (max(e.max_num_batched_tokens, 8) - 1).bit_length()
        self.buckets = tuple(2**i for i in range(3, top + 1))
        self.shapes: set[tuple[int, int]] = set()  # (B, T) programs compiled
        self.exact_shapes: set[tuple[int, int]] = set()  # what an unbucketed engine compiles
        self.texts: dict[str, Detokenizer] = {}
        self.steps = 0

    @property
    def compiles(self) -> int:
        return len(self.shapes)

    def add(self, req: Request) -> None:
        """Queue a request (ValueError, and nothing queued, for one that could never run)."""
        if req.id in self.texts:
            raise ValueError(f"request id {req.id!r} is already in flight")
        bad = [t for t in req.prompt if not 0 <= t < self.cfg.vocab]
        if bad:
            raise ValueError(f"token {bad[0]} is outside the vocabulary [0, {self.cfg.vocab})")
        if req.constraint is not None:
            if req.grammar is None:
                req.grammar = req.constraint.initial()
            if not req.constraint.allowed(req.grammar, req.max_tokens - len(req.out)).any():
                never = not req.constraint.allowed(req.grammar, 1 << 30).any()
                raise ValueError(
                    "the output's grammar matches no text at all"
                    if never
                    else "the output's grammar cannot be completed within max_tokens "
                    f"{req.max_tokens}"
                )
        self.scheduler.add(req)
        self.texts[req.id] = Detokenizer()

    def _feed(self, rows: list[tuple[Request, int]], T: int, batch: int = 0) -> list[tuple]:
        """One program over `rows` (request, tokens fed), padded to a batch size and T: per row
        (token, its log-probability, the top (ids, log-probabilities))."""
        B = batch or _bucket(len(rows), self.batch_sizes)
        tokens = np.zeros((B, T), np.int32)
        positions = np.full((B, T), self.cfg.max_seq, np.int32)  # padding: beyond every table
        table = np.full((B, self.n_table), NULL_PAGE, np.int32)
        last = np.zeros(B, np.int32)
        index = np.zeros(B, np.int32)
        params = [sampling.SamplingParams(0.0)] * B
        mask = np.ones((B, self.cfg.vocab), bool)
        for b, (req, n) in enumerate(rows):
            if req.constraint is not None and req.computed + n == len(req.tokens):
                mask[b] = self._allowed(req)
            tokens[b, :n] = req.tokens[req.computed : req.computed + n]
            positions[b, :n] = np.arange(req.computed, req.computed + n)
            table[b, : len(req.pages)] = req.pages
            last[b], index[b], params[b] = n - 1, len(req.out), req.sampling
        self.shapes.add((B, T))
        if rows:
            self.exact_shapes.add((len(rows), max(n for _, n in rows)))
        with _on(self.mesh):
            self.pool, out = _run(
                self.params,
                self.pool,
                jnp.asarray(table),
                jnp.asarray(tokens),
                jnp.asarray(positions),
                jnp.asarray(last),
                sampling.as_arrays(params),
                jnp.asarray(index),
                jnp.asarray(mask),
                self.cfg,
            )
        tok_B, logp_B, top_ids_BK, top_BK = (np.asarray(x)[: len(rows)] for x in out)
        return [
            (int(t), float(lp), tuple(zip(ids.tolist(), lps.tolist(), strict=True)))
            for t, lp, ids, lps in zip(tok_B, logp_B, top_ids_BK, top_BK, strict=True)
        ]

    def _allowed(self, req: Request) -> np.ndarray:
        """The grammar's allowed next tokens [V] with the tokens left (the grammar's masks are
        over the 256 bytes)."""
        allowed = np.asarray(req.constraint.allowed(req.grammar, req.max_tokens - len(req.out)))
        row = np.zeros(self.cfg.vocab, bool)
        n = min(self.cfg.vocab, len(allowed))
        row[:n] = allowed[:n]
        return row

    def step(self) -> list[Event]:
        """One scheduling step: the decode program, then the prefill program."""
        plan = self.scheduler.schedule()
        if not (plan.decode or plan.prefill or plan.preempted) and self.scheduler.has_work():
            # add() refuses what the pool can never hold, so this is a scheduler bug: fail loudly
            # rather than spin
            raise RuntimeError(
                f"no progress possible: {len(self.scheduler.waiting)} waiting, "
                f"{len(self.scheduler.running)} running, "
                f"{self.allocator.n_free} pages free"
            )
        events = []
        # one-token feeds (decode steps, and prefills with one token left) share the T = 1
        # program; longer prefill chunks run in the prefill program
        ones = [(r, 1) for r in plan.decode] + [(r, n) for r, n in plan.prefill if n == 1]
        chunks = [(r, n) for r, n in plan.prefill if n > 1]
        groups = [(ones, 1)]
        if chunks:
            groups.append((chunks, _bucket(max(n for _, n in chunks), self.buckets)))
        for rows, T in groups:
            if not rows:
                continue
            for (req, n), (tok, logp, top) in zip(rows, self._feed(rows, T), strict=True):
                reaches_end = req.computed + n == len(req.tokens)
                self.scheduler.advance(req, n, tok if reaches_end else None, self.ecfg.eos_id)
                if reaches_end:
                    text = self._grammar_step(req, tok)
                    if req.done:
                        text += self.texts.pop(req.id).finish()
                    events.append(Event(req.id, tok, text, req.finish_reason, logp, top))
        self.steps += 1
        return events

    def _grammar_step(self, req: Request, tok: int) -> str:
        """`tok`'s text, after advancing the request's grammar: a grammar that is complete ends
        the request ("stop"); the byte that ends a regex or schema output is not text."""
        c = req.constraint
        if c is None:
            return self.texts[req.id].push(tok)
        req.grammar = c.advance(req.grammar, tok)
        if not c.done(req.grammar):
            return self.texts[req.id].push(tok)
        if not req.done:
            self.scheduler.finish(req, "stop")
        return "" if tok == getattr(c, "end", None) else self.texts[req.id].push(tok)

    def warmup(self) -> int:
        """Compile every shape the engine can run (batch sizes x (decode + prefill buckets)),
        so no request pays a compile; returns the number of shapes. Padding rows only: they
        write to page 0 and change nothing."""
        for B in self.batch_sizes:
            for T in (1, *self.buckets):
                self._feed([], T, batch=B)
        return self.compiles

    def abort(self, request_id: str, reason: str = "abort") -> bool:
        """Finish a waiting or running request now (a client went away, a stop string matched):
        its slot and pages are freed. False when no such request is in flight."""
        for req in [*self.scheduler.running, *self.scheduler.waiting]:
            if req.id == request_id:
                self.scheduler.finish(req, reason)
                self.texts.pop(request_id, None)
                return True
        return False

    def run(self, requests: list[Request]) -> dict[str, Request]:
        """Serve `requests` (all arriving now) to completion; returns them by id."""
        for r in requests:
            self.add(r)
        t0 = time.perf_counter()
        while self.scheduler.has_work():
            self.step()
        self.wall_s = time.perf_counter() - t0
        return {r.id: r for r in requests}
