"""Continuous batching's bookkeeping, in pure Python: requests waiting, requests running in a
fixed number of slots, the pages each holds, and the plan of every engine step.

A request's tokens are its prompt followed by what it generated; `computed` of them have their
keys and values in the cache. Each step feeds every running request its next tokens: one for a
request that is decoding (its last sampled token), a chunk of the rest for one still in prefill,
within a budget of tokens per step (vLLM's max_num_batched_tokens; slots are max_num_seqs).
Admission is FIFO. When a decoding request needs a page and none is free, the most recently
admitted request is preempted: its pages are released and it goes back to the front of the
queue with everything it generated, to be recomputed (its sampling keys depend on its seed and
token index only, so it continues with the same tokens).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from jaxscale.serve.pages import OutOfPages, PageAllocator
from jaxscale.serve.prefix_cache import RadixCache
from jaxscale.serve.sampling import SamplingParams


# identity, not field-by-field equality: the scheduler's lists find a request by `in`, `remove`
# and `index`, which with dataclass equality built and compared every field's tuple per test
# (and would take a request for its twin)
@dataclass(eq=False)
class Request:
    id: str
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    out: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose keys and values are in the cache
    pages: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS or a stop string) or "length"
    preemptions: int = 0
    cached: int = 0  # prompt tokens found in the prefix cache at admission
    path: list = field(default_factory=list)  # prefix-cache nodes this request holds
    # a grammar (serve/constrained.py: initial/allowed/advance/done) every sampled token obeys,
    # and its state after the tokens in `out`
    constraint: object = None
    grammar: object = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    def next_tokens(self, n: int) -> list[int]:
        """The `n` tokens fed next (from `computed` on), without building `tokens`."""
        start, P = self.computed, len(self.prompt)
        if start >= P:
            return self.out[start - P : start - P + n]
        return (self.prompt[start : start + n] + self.out[: max(0, start + n - P)])[:n]

    @property
    def pending(self) -> int:
        """Tokens not yet fed: the prompt's rest, or 1 (the last sampled token) when decoding."""
        return len(self.prompt) + len(self.out) - self.computed

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class Plan:
    decode: list[Request]  # one token each
    prefill: list[tuple[Request, int]]  # (request, tokens fed this step)
    preempted: list[Request]


class Scheduler:
    def __init__(
        self,
        allocator: PageAllocator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_len: int,
        prefix_cache: RadixCache | None = None,
        static: bool = False,
        lookahead: int = 0,
    ):
        if max_num_seqs < 1 or max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                "need max_num_seqs >= 1 and max_num_batched_tokens >= max_num_seqs "
                "(every running request must get a token each step)"
            )
        self.allocator, self.max_len = allocator, max_len
        self.max_num_seqs, self.budget = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order
        self.cache = prefix_cache
        self.static = static  # static batching: a new batch only when the last one is done
        # positions a decoding request writes past its next one (speculative decoding's k
        # drafts): its pages must hold them, and its context must leave room for them
        self.lookahead = lookahead

    def add(self, req: Request) -> None:
        if not req.prompt:
            raise ValueError("a request needs at least one prompt token")
        if req.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
        ahead = f" + {self.lookahead} speculative tokens" if self.lookahead else ""
        if len(req.prompt) + req.max_tokens + self.lookahead > self.max_len:
            raise ValueError(
                f"prompt ({len(req.prompt)}) + max_tokens ({req.max_tokens}){ahead} "
                f"exceeds the context of {self.max_len} tokens"
            )
        # the last sampled token is never fed, so a request holds prompt + max_tokens - 1
        # positions at most (+ lookahead); one that needs more pages than the whole pool could
        # never finish
        need = self.allocator.pages_for(len(req.prompt) + req.max_tokens - 1 + self.lookahead)
        if need > self.allocator.n_pages - 1:
            raise ValueError(
                f"prompt ({len(req.prompt)}) + max_tokens ({req.max_tokens}) "
                f"needs {need} KV pages; the pool has "
                f"{self.allocator.n_pages - 1}"
            )
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _grow(self, req: Request, upto: int) -> None:
        """Pages so that positions < upto fit, evicting unused cached prefixes if need be
        (OutOfPages leaves the request unchanged)."""
        need = self.allocator.pages_for(upto) - len(req.pages)
        if need <= 0:
            return
        if need > self.allocator.n_free and self.cache is not None:
            self.cache.evict(need - self.allocator.n_free)
        req.pages += self.allocator.allocate(need)

    def _let_go(self, req: Request) -> None:
        """Give back the request's pages and prefix-cache nodes."""
        self.allocator.release(req.pages)
        if self.cache is not None:
            self.cache.unlock(req.path)
        req.pages, req.path = [], []

    def _admit(self, req: Request, budget: int) -> int:
        """Pages for the first tokens of a waiting request (reusing a cached prefix); the tokens
        it will be fed this step, or OutOfPages with nothing held."""
        if self.cache is not None:
            req.pages, req.path = self.cache.match(req.tokens)
            req.computed = len(req.pages) * self.allocator.page_size
        n = min(req.pending, budget)
        try:
            self._grow(req, req.computed + n)
        except OutOfPages:
            self._let_go(req)
            req.computed = 0
            raise
        if self.cache is not None:
            self.cache.record(req.computed, len(req.tokens))
            if not req.preemptions:  # a readmission's match covers generated tokens too
                req.cached = req.computed
        return n

    def _preempt(self, req: Request) -> None:
        self._let_go(req)
        req.computed = 0
        req.preemptions += 1
        self.running.remove(req)
        self.waiting.appendleft(req)

    def schedule(self) -> Plan:
        """This step's plan: decode tokens first (each running request that is decoding), then
        prefill chunks for running requests, then newly admitted ones, within the budget."""
        preempted: list[Request] = []
        decode: list[Request] = []
        for req in list(self.running):
            if req not in self.running or req.pending != 1:
                continue
            while True:
                try:
                    self._grow(req, req.computed + 1 + self.lookahead)
                    decode.append(req)
                    break
                except OutOfPages:
                    victim = self.running[-1]
                    if victim in decode:
                        decode.remove(victim)
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req:
                        break
        budget = self.budget - len(decode)
        prefill: list[tuple[Request, int]] = []
        for req in [r for r in self.running if r.pending > 1]:
            n = min(req.pending, budget)
            if n <= 0:
                break
            try:
                self._grow(req, req.computed + n)
            except OutOfPages:
                break
            prefill.append((req, n))
            budget -= n
        # static batching: a new batch is admitted (in this step, as far as the budget goes)
        # only when the previous one has finished entirely
        admitting = not (self.static and self.running)
        while admitting and self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            try:
                n = self._admit(req, budget)
            except OutOfPages:
                break
            self.waiting.popleft()
            self.running.append(req)
            prefill.append((req, n))
            budget -= n
        return Plan(decode, prefill, preempted)

    def advance(self, req: Request, fed: int, token: int | None, eos_id: int | None) -> None:
        """`fed` tokens of `req` are now in the cache; `token` (when the step reached the end of
        its tokens) is its next one. Finishes it at EOS or max_tokens and frees its pages."""
        req.computed += fed
        if token is None:
            return
        req.out.append(token)
        if eos_id is not None and token == eos_id:
            self.finish(req, "stop")
        elif len(req.out) >= req.max_tokens:
            self.finish(req, "length")

    def finish(self, req: Request, reason: str) -> None:
        """Done: its computed tokens' pages go into the prefix cache (if any), then it lets go."""
        req.finish_reason = reason
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if self.cache is not None:
            self.cache.insert(req.tokens[: req.computed], req.pages)
        self._let_go(req)
