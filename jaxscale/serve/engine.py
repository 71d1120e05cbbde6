"""The serving engine: continuous batching over a paged KV cache (jaxscale/serve/scheduler.py
decides, jaxscale/serve/program.py is the device program it launches).

Every step launches one compiled program on the page pool. It feeds the step's one-token rows
([B, 1]: decode steps, and prompts with one token left), its prefill chunks ([B, T]), or both
(`program.run_mixed`: the two parts one after the other in one program), and samples the next
token of the rows that reached the end of their tokens. Shapes are static: B is rounded up to a
power of two (up to max_num_seqs) and T to a prefill bucket; in a step with both parts the
one-token part is padded to `b_mix` rows, the most that can share a step with a chunk
(max_num_seqs - 1, rounded up), so that its shape adds no factor to the count. Padding rows
write to page 0 and are never read. With nb batch sizes and nt prefill buckets the compiles are
nb x (1 + nt) single-part programs and at most nb x nt mixed ones (`compile_bound`: the chunk
batches and buckets a mixed step can reach), at most nb x (1 + 2 nt) in all; they are reported
(`compiles`; `warmup` compiles them all): the JAX form of the seed's CUDA-graph lesson.

Host work hides behind the device (`EngineConfig.overlap`): a step schedules and launches its
program, and only then reads back the previous step's tokens, while it runs. A sampled token
stays on the device until then: the scheduler holds a PLACEHOLDER for it, and the next step's
program takes it from the previous step's output. So `step()` returns the events of the step
before; a request that ended there (EOS, a grammar's end) was fed once more meanwhile, and that
row's result is dropped. A constrained request's mask needs its last token, so while one runs the
previous step is read before scheduling. The tokens are the same either way (tested).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxscale.config import ModelConfig
from jaxscale.model import kv_cache
from jaxscale.serve import program, sampling, spec_program
from jaxscale.serve.events import Detokenizer, Event
from jaxscale.serve.pages import NULL_PAGE, PageAllocator
from jaxscale.serve.prefix_cache import RadixCache
from jaxscale.serve.program import TOP_LOGPROBS
from jaxscale.serve.scheduler import Request, Scheduler
from jaxscale.serve.speculative import SpecStats

PLACEHOLDER = -1  # a sampled token still on the device (the scheduler's stand-in)


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8  # slots: requests running at once
    max_num_batched_tokens: int = 64  # tokens fed per step (decode tokens + prefill chunks)
    page_size: int = 16
    n_pages: int = 64  # the pool, page 0 included (reserved)
    eos_id: int | None = None
    prefix_cache: bool = True  # reuse the KV pages of cached prompt prefixes
    static_batching: bool = False  # admit only into an empty batch (the baseline it improves on)
    overlap: bool = True  # read a step's tokens while the next one runs (False: before it)
    kv_dtype: str | None = None  # the pool's dtype: None (the compute dtype) or "int8"
    # k > 0: decoding rows advance by speculative rounds (serve/spec_program.py) with the
    # engine's draft model; each step is read before the next (no overlap)
    speculative_tokens: int = 0


__all__ = ["TOP_LOGPROBS", "Detokenizer", "Engine", "EngineConfig", "Event"]


def _bucket(n: int, sizes) -> int:
    for s in sizes:
        if n <= s:
            return s
    raise ValueError(f"{n} exceeds the largest bucket {sizes[-1]}")


@dataclass
class _Launched:
    """One part of a step's program (its one-token rows, or its prefill chunks), launched and
    not yet read: its rows (request, tokens fed, the index in `out` of the token it samples, or
    None) and its device outputs (its tokens [B_max] are a half of the next step's `prev`)."""

    rows: list[tuple[Request, int, int | None]]
    out: tuple


@dataclass
class Engine:
    params: dict
    cfg: ModelConfig
    ecfg: EngineConfig = field(default_factory=EngineConfig)
    # tensor-parallel decode: parameters by the sharding rules (heads and MLP over `tensor`),
    # the pool split by kv heads; GSPMD places the all-reduces (two per layer). None: one device
    mesh: jax.sharding.Mesh | None = None
    draft_params: dict | None = None  # the draft model of speculative decoding
    draft_cfg: ModelConfig | None = None

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
        self.k = e.speculative_tokens
        self.spec = SpecStats()
        if self.k or self.draft_cfg is not None:
            spec_program.check(cfg, self.draft_cfg, self.k, self.mesh)
            self.dpool = kv_cache.init_paged(self.draft_cfg, e.n_pages, e.page_size, e.kv_dtype)
        self.allocator = PageAllocator(e.n_pages, e.page_size)
        self.cache = RadixCache(self.allocator) if e.prefix_cache else None
        self.scheduler = Scheduler(
            self.allocator,
            e.max_num_seqs,
            e.max_num_batched_tokens,
            cfg.max_seq,
            self.cache,
            e.static_batching,
            lookahead=self.k,
        )
        self.pool = kv_cache.init_paged(cfg, e.n_pages, e.page_size, e.kv_dtype)
        if self.mesh is not None:
            self.params, self.pool = program.place(self.params, self.pool, cfg, self.mesh)
        self.batch_sizes = tuple(2**i for i in range((e.max_num_seqs - 1).bit_length() + 1))
        # prefill chunk lengths: powers of two from 8 up to the first that holds the budget
        top = (max(e.max_num_batched_tokens, 8) - 1).bit_length()
        self.buckets = tuple(2**i for i in range(3, top + 1))
        # a step with both parts: its one-token rows padded to b_mix (a chunk holds a slot, so
        # at most max_num_seqs - 1 of them), its chunks [B, T] as a chunk-only step's, where a
        # one-token row leaves room for them (B up to b_mix, T up to budget - 1)
        self.b_mix = _bucket(max(e.max_num_seqs - 1, 1), self.batch_sizes)
        t_mix = _bucket(max(e.max_num_batched_tokens - 1, 1), self.buckets)
        self.mixed = [
            (B, T)
            for B in self.batch_sizes
            if B <= self.b_mix and e.max_num_seqs > 1
            for T in self.buckets
            if T <= t_mix
        ]
        # programs compiled, by their parts' token shapes: ((B, T),), or ((b_mix, 1), (B, T))
        self.shapes: set[tuple[tuple[int, int], ...]] = set()
        self.exact_shapes: set[tuple[tuple[int, int], ...]] = set()  # an unbucketed engine's
        self.launches = 0  # programs launched
        # seconds spent blocked reading sampled tokens back (the device still computing): a
        # step's wall time less this is its host work (bench/engine_step.py)
        self.wait_s = 0.0
        self.texts: dict[str, Detokenizer] = {}
        self.steps = 0
        self.launched: list[_Launched] = []  # the last step's parts, not yet read
        self.src: dict[str, int] = {}  # request id -> its placeholder's index in `prev`
        self.b_max = self.batch_sizes[-1]
        self._zeros = jnp.zeros((self.b_max,), jnp.int32)  # `prev`'s half with no step behind
        if self.mesh is not None:  # typed on the mesh like the tokens a step returns: the
            # warm-up's programs are then the ones every step runs (before: a new program per
            # step shape on a tensor mesh, 6 compiles in 10 steps)
            self._zeros = jax.device_put(self._zeros, NamedSharding(self.mesh, P()))

    def has_work(self) -> bool:
        """Requests waiting or running, or a step whose tokens are not read yet."""
        return self.scheduler.has_work() or bool(self.launched)

    @property
    def compiles(self) -> int:
        return len(self.shapes)

    @property
    def compile_bound(self) -> int:
        """The programs the engine can run (what `warmup` compiles): every batch size with the
        one-token rows and with each prefill bucket, and the mixed steps' chunk shapes."""
        return len(self.batch_sizes) * (1 + len(self.buckets)) + len(self.mixed)

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

    def feed(self, rows: list[tuple[Request, int]], T: int, batch: int = 0) -> dict:
        """The host arrays of one program over `rows` (request, tokens fed), padded to a batch
        size and T; a placeholder token names its place in the previous step's output."""
        B = batch or _bucket(len(rows), self.batch_sizes)
        feed = self.padding(B, T)
        params = [sampling.SamplingParams(0.0)] * B
        R = len(rows)
        # whole columns at once where every row has them (a NumPy assignment per row and array
        # cost more than scheduling the step, at 64 rows)
        toks = [req.next_tokens(n) for req, n in rows]
        starts = [req.computed for req, _ in rows]
        if T == 1:
            feed["tokens"][:R, 0] = [t[0] for t in toks]
            feed["positions"][:R, 0] = starts
        feed["last"][:R] = [n - 1 for _, n in rows]
        feed["index"][:R] = [len(req.out) for req, _ in rows]
        for b, (req, n) in enumerate(rows):
            if req.constraint is not None and req.computed + n == len(req.tokens):
                feed["mask"][b] = self._allowed(req)
            if T > 1:
                feed["tokens"][b, :n] = toks[b]
                feed["positions"][b, :n] = np.arange(starts[b], starts[b] + n)
            if PLACEHOLDER in toks[b]:
                feed["src"][b, toks[b].index(PLACEHOLDER)] = self.src[req.id]
            feed["table"][b, : len(req.pages)] = req.pages
            params[b] = req.sampling
        feed["settings"] = sampling.as_arrays(params)
        return feed

    def _launch(self, parts: list[tuple[list[tuple[Request, int]], int, int]]) -> list[_Launched]:
        """Launch one program over the step's parts (rows, T, batch size or 0 for the bucket):
        the one-token rows, the prefill chunks, or both in that order; the tokens stay on the
        device."""
        feeds = [self.feed(rows, T, batch) for rows, T, batch in parts]
        self.shapes.add(tuple(f["tokens"].shape for f in feeds))
        if all(rows for rows, _, _ in parts):
            self.exact_shapes.add(tuple((len(r), max(n for _, n in r)) for r, _, _ in parts))
        prev = [x.out[0] for x in self.launched] + [self._zeros] * (2 - len(self.launched))
        with program.on(self.mesh):
            if len(feeds) == 1:
                self.pool, out = program.run(self.params, self.pool, feeds[0], *prev, self.cfg)
                outs = (out,)
            else:
                self.pool, outs = program.run_mixed(self.params, self.pool, *feeds, *prev, self.cfg)
        self.launches += 1
        if self.k:  # the draft's cache follows the target's (its tokens are all real here)
            for feed in feeds:
                self.dpool = spec_program.fill(self.draft_params, self.dpool, feed, self.draft_cfg)
        return [
            _Launched([(r, n, None) for r, n in rows], out)
            for (rows, _, _), out in zip(parts, outs, strict=True)
        ]

    def padding(self, B: int, T: int) -> dict:
        """The host arrays of a program of B rows x T tokens, all padding: positions beyond
        every table, the null page, no placeholder."""
        return {
            "table": np.full((B, self.n_table), NULL_PAGE, np.int32),
            "tokens": np.zeros((B, T), np.int32),
            "positions": np.full((B, T), self.cfg.max_seq, np.int32),
            "src": np.full((B, T), -1, np.int32),
            "last": np.zeros(B, np.int32),
            "index": np.zeros(B, np.int32),
            "settings": sampling.as_arrays([sampling.SamplingParams(0.0)] * B),
            "mask": np.ones((B, self.cfg.vocab), bool),
        }

    def _allowed(self, req: Request) -> np.ndarray:
        """The grammar's allowed next tokens [V] with the tokens left (the grammar's masks are
        over the 256 bytes)."""
        return self._allowed_at(req, req.grammar, req.max_tokens - len(req.out))

    def _allowed_at(self, req: Request, state, budget: int) -> np.ndarray:
        """The same for a grammar state of `req` (a speculative draft's) and a budget."""
        allowed = np.asarray(req.constraint.allowed(state, budget))
        row = np.zeros(self.cfg.vocab, bool)
        n = min(self.cfg.vocab, len(allowed))
        row[:n] = allowed[:n]
        return row

    def step(self) -> list[Event]:
        """One scheduling step: launch its program (one-token rows, prefill chunks, or both);
        then the previous step's tokens (with overlap; else this step's) become events."""
        events = []
        if any(r.constraint is not None for r in self.scheduler.running):
            events += self._read()  # a grammar's mask needs the last token: read it first
        plan = self.scheduler.schedule()
        if not (plan.decode or plan.prefill or plan.preempted or self.launched) and (
            self.scheduler.has_work()
        ):
            # add() refuses what the pool can never hold, so this is a scheduler bug: fail loudly
            # rather than spin
            raise RuntimeError(
                f"no progress possible: {len(self.scheduler.waiting)} waiting, "
                f"{len(self.scheduler.running)} running, "
                f"{self.allocator.n_free} pages free"
            )
        # with a draft, every decoding row advances by a speculative round
        rounds = plan.decode if self.k else []
        # one-token feeds (decode steps, and prefills with one token left) are one part [B, 1];
        # longer prefill chunks the other [B, T]; a step with both runs them in one program,
        # its one-token part padded to b_mix rows
        ones = [(r, 1) for r in plan.decode if not self.k]
        ones += [(r, n) for r, n in plan.prefill if n == 1]
        chunks = [(r, n) for r, n in plan.prefill if n > 1]
        parts = [(ones, 1, self.b_mix if chunks else 0)] if ones else []
        if chunks:
            parts.append((chunks, _bucket(max(n for _, n in chunks), self.buckets), 0))
        launched = self._launch(parts) if parts else []
        events += self._read()  # the previous step's tokens, while this one runs
        for i, step in enumerate(launched):
            for b, (req, n, _) in enumerate(step.rows):
                if req.done:  # ended in the step just read: this row's result is dropped
                    continue
                samples = req.computed + n == len(req.tokens)
                if samples:
                    self.src[req.id] = i * self.b_max + b
                    step.rows[b] = (req, n, len(req.out))
                self.scheduler.advance(req, n, PLACEHOLDER if samples else None, None)
        self.launched = launched
        if not self.ecfg.overlap or self.k:
            events += self._read()
        if rounds:
            events += spec_program.step(self, rounds)
        self.steps += bool(launched or rounds)  # steps that ran programs (the last may only read)
        return events

    def _read(self) -> list[Event]:
        """The launched step's sampled tokens, read back: each replaces its placeholder, ends its
        request at EOS or its grammar's end, and becomes an event."""
        events = []
        for step in self.launched:
            t0 = time.perf_counter()
            out = [np.asarray(x) for x in step.out]
            self.wait_s += time.perf_counter() - t0
            # Python lists at once: indexing NumPy arrays row by row costs more than the step's
            # scheduling at 64 rows
            tok_B, logp_B, top_ids_BK, top_BK = (x.tolist() for x in out)
            for b, (req, _, at) in enumerate(step.rows):
                if at is None or req.id not in self.texts:  # no token, or aborted
                    continue
                tok = tok_B[b]
                req.out[at] = tok
                eos = self.ecfg.eos_id is not None and tok == self.ecfg.eos_id
                if eos and not req.done:
                    self.scheduler.finish(req, "stop")
                elif eos:  # it reached max_tokens with the EOS token: EOS names the end
                    req.finish_reason = "stop"
                text = self._grammar_step(req, tok)
                if req.done:
                    text += self.texts.pop(req.id).finish()
                top = tuple(zip(top_ids_BK[b], top_BK[b], strict=True))
                events.append(Event(req.id, tok, text, req.finish_reason, logp_B[b], top))
        self.launched, self.src = [], {}
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
        """Compile every shape the engine can run (`compile_bound`: batch sizes x (one-token
        rows + prefill buckets), and the mixed steps'), so no request pays a compile; returns
        the number of shapes. Padding rows only: they write to page 0 and change nothing."""
        launched, self.launched = self.launched, []
        for B in self.batch_sizes:
            for T in (1, *self.buckets):
                self._launch([([], T, B)])
            if self.k:
                spec_program.speculate(self, [], B)
        for B, T in self.mixed:
            self._launch([([], 1, self.b_mix), ([], T, B)])
        if self.k:
            spec_program.warm_constrained(self)
        self.launched = launched
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
        while self.has_work():
            self.step()
        self.wall_s = time.perf_counter() - t0
        return {r.id: r for r in requests}
