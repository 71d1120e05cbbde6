"""Seed 002's minimal_inference_server.py (ch8) on a virtual clock:
a FIFO queue, a running batch of at most `batch_size` requests, one prefill at a time whenever a
slot is free, otherwise one decode step for the whole running batch; a mock model whose tokens
come from Python's `random` (EOS with probability 0.1 per decode).

The seed's `SimpleModelRunner(latency_ms=10)` passes milliseconds to `asyncio.sleep`, which takes
seconds: each decode step sleeps 10 s [defect 7]. Here time is virtual (nothing sleeps), and a
decode step costs latency_ms milliseconds; `--seed-faithful` reports the seconds the seed's
sleeps would have taken. The real engine runs the same prompts in experiments/08.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from dataclasses import dataclass, field

PROMPTS = (  # the seed's run_demo prompts
    "What is the capital of France?",
    "Explain quantum computing in simple terms.",
    "Write a haiku about programming.",
    "What is machine learning?",
    "Tell me a joke.",
    "How does the internet work?",
    "What is the meaning of life?",
    "Describe a beautiful sunset.",
)
EOS, VOCAB = 1, 1000


def encode(text: str) -> list[int]:
    """The seed's word tokenizer with a stable hash (the seed's `hash()` is salted per process;
    only the counts matter to the schedule)."""
    return [zlib.crc32(w.encode()) % (VOCAB - 3) + 3 for w in text.lower().split()]


@dataclass
class MockRequest:
    id: int
    prompt_tokens: list[int]
    max_tokens: int
    generated: list[int] = field(default_factory=list)
    first_token_at: float = 0.0
    finished_at: float | None = None  # None while running (a clock of 0 ms is a real time)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


@dataclass(frozen=True)
class Event:
    kind: str  # "prefill" or "decode"
    at: float  # virtual seconds when it ends
    ids: tuple[int, ...]
    prompt_tokens: int = 0


def run(
    num_requests: int = 5,
    batch_size: int = 4,
    max_tokens: int = 20,
    seed: int = 0,
    latency_ms: float = 10.0,
    seed_faithful: bool = False,
):
    """(requests, events): the seed's schedule, one random generator for the whole run."""
    if num_requests < 1 or batch_size < 1 or max_tokens < 1:
        raise ValueError("num_requests, batch_size and max_tokens must be >= 1")
    if not latency_ms > 0:
        raise ValueError(f"latency_ms must be > 0, got {latency_ms}")
    rng = random.Random(seed)
    unit = 1.0 if seed_faithful else 1e-3  # the seed sleeps latency_ms seconds
    reqs = [
        MockRequest(i, encode(PROMPTS[i % len(PROMPTS)]), max_tokens) for i in range(num_requests)
    ]
    waiting, running, events, clock = deque(reqs), [], [], 0.0
    while waiting or running:
        running = [r for r in running if not r.finished]
        if waiting and len(running) < batch_size:  # one prefill when a slot is free
            r = waiting.popleft()
            clock += latency_ms * len(r.prompt_tokens) / 100 * unit
            r.generated.append(rng.randint(3, VOCAB - 1))
            r.first_token_at = clock
            running.append(r)
            events.append(Event("prefill", clock, (r.id,), len(r.prompt_tokens)))
        elif running:
            clock += latency_ms * unit
            for r in running:
                tok = EOS if rng.random() < 0.1 else rng.randint(3, VOCAB - 1)
                r.generated.append(tok)
                if tok == EOS or len(r.generated) >= r.max_tokens:
                    r.finished_at = clock
            events.append(Event("decode", clock, tuple(r.id for r in running)))
    return reqs, events
