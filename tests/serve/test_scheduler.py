"""The scheduler's preemption policy, driven step by step in pure Python (no model): when a
decoding request needs a page and none is free, the most recently admitted running request is
preempted, its pages are released, and it goes back to the FRONT of the waiting queue with
everything it generated, to be recomputed (jaxscale/serve/scheduler.py's docstring; vLLM preempts
the last request of its running queue the same way).

The scenarios are chosen so that the other plausible victims (the oldest request, the one asking
for the page, the one holding the most pages, the one holding the fewest) are each a different
request from the documented one in at least one of them."""

import numpy as np

from jaxscale.serve.pages import PageAllocator
from jaxscale.serve.scheduler import Request, Scheduler

PAGE = 4  # tokens per page


def _scheduler(n_pages: int) -> tuple[PageAllocator, Scheduler]:
    alloc = PageAllocator(n_pages, PAGE)
    return alloc, Scheduler(alloc, max_num_seqs=3, max_num_batched_tokens=64, max_len=32)


def _apply(sched: Scheduler, plan) -> None:
    """What the engine does with a plan (Engine.step), with made-up tokens: every fed row's
    tokens enter the cache; a row that reached the end of its tokens gets its next token."""
    rows = [(r, 1) for r in plan.decode] + list(plan.prefill)
    for req, n in rows:
        reaches_end = req.computed + n == len(req.tokens)
        sched.advance(req, n, 100 + len(req.out) if reaches_end else None, eos_id=None)


def _ids(reqs) -> list[str]:
    return [r.id for r in reqs]


def test_the_newest_request_is_preempted_not_the_oldest_or_the_asker():
    """Catches a changed victim (the oldest running request, or the one that needs the page, or
    the one holding the most pages), a victim re-queued at the back, and a preemption that keeps
    its pages or its `computed` count. The oldest request (A, 2 pages, the most) needs a page;
    the newest (C, 1 page) must give way."""
    alloc, sched = _scheduler(n_pages=5)  # 4 usable pages (page 0 is reserved)
    a, b, c, d = (
        Request("A", [1] * 8, 4),  # 2 pages; its first decode (position 8) needs a third
        Request("B", [2] * 3, 4),  # 1 page; its first decode (position 3) fits, its second not
        Request("C", [3] * 2, 4),  # 1 page
        Request("D", [4] * 2, 4),  # no slot: waits
    )
    for r in (a, b, c, d):
        sched.add(r)

    plan = sched.schedule()  # step 1: A, B, C admitted (FIFO), every page taken
    assert [(r.id, n) for r, n in plan.prefill] == [("A", 8), ("B", 3), ("C", 2)]
    assert _ids(sched.running) == ["A", "B", "C"] and _ids(sched.waiting) == ["D"]
    assert alloc.n_free == 0
    _apply(sched, plan)
    c_out = list(c.out)
    assert len(c_out) == 1

    plan = sched.schedule()  # step 2: A needs a page, none is free
    assert _ids(plan.preempted) == ["C"]  # the most recently admitted; not A (oldest, asker)
    assert _ids(plan.decode) == ["A", "B"] and plan.prefill == []
    assert _ids(sched.running) == ["A", "B"]
    assert _ids(sched.waiting) == ["C", "D"]  # back at the front, ahead of D
    assert (c.pages, c.computed, c.out, c.preemptions) == ([], 0, c_out, 1)
    assert len(a.pages) == 3 and len(b.pages) == 1 and alloc.n_free == 0
    assert a.preemptions == b.preemptions == 0
    _apply(sched, plan)

    plan = sched.schedule()  # step 3: B (now the newest running) needs a page: B itself goes
    assert _ids(plan.preempted) == ["B"] and _ids(plan.decode) == ["A"]
    assert _ids(sched.running) == ["A"] and _ids(sched.waiting) == ["B", "C", "D"]
    assert (b.pages, b.computed, b.preemptions, len(b.out)) == ([], 0, 1, 2)
    assert alloc.n_free == 1  # B's page, too few to readmit B (5 tokens, 2 pages)
    _apply(sched, plan)

    plan = sched.schedule()  # step 4: A's last token; it finishes and frees its 3 pages
    assert _ids(plan.decode) == ["A"] and plan.preempted == [] and plan.prefill == []
    _apply(sched, plan)
    assert a.finish_reason == "length" and alloc.n_free == 4

    plan = sched.schedule()  # step 5: readmitted in queue order, each recomputing all it has
    assert [(r.id, n) for r, n in plan.prefill] == [("B", 3 + 2), ("C", 2 + 1), ("D", 2)]
    assert b.out[:2] == [100, 101] and c.out == c_out  # what they generated is kept
    _apply(sched, plan)
    while sched.has_work():
        _apply(sched, sched.schedule())
    assert all(r.finish_reason == "length" and len(r.out) == 4 for r in (a, b, c, d))
    assert alloc.n_free == 4  # every page back


def test_the_newest_request_is_preempted_even_when_it_holds_the_most_pages():
    """Catches a victim chosen by page count (the fewest pages: A here) or by position (the
    oldest, A; the asker, B): the newest request C holds the most pages and must still be the
    one preempted, and only it."""
    alloc, sched = _scheduler(n_pages=6)  # 5 usable pages
    a = Request("A", [1] * 2, 4)  # 1 page; its decodes fit in it
    b = Request("B", [2] * 4, 4)  # 1 page; its first decode (position 4) needs a second
    c = Request("C", [3] * 9, 4)  # 3 pages
    for r in (a, b, c):
        sched.add(r)
    plan = sched.schedule()
    assert _ids(sched.running) == ["A", "B", "C"] and alloc.n_free == 0
    _apply(sched, plan)

    plan = sched.schedule()
    assert _ids(plan.preempted) == ["C"]
    assert _ids(plan.decode) == ["A", "B"]
    assert _ids(sched.running) == ["A", "B"] and _ids(sched.waiting) == ["C"]
    assert (c.pages, c.computed, c.preemptions, len(c.out)) == ([], 0, 1, 1)
    assert (len(a.pages), len(b.pages)) == (1, 2)
    assert alloc.n_free == 2  # C's 3 pages back, 1 of them now B's; C (10 tokens) needs 3
    assert a.preemptions == b.preemptions == 0


def test_a_preempted_request_recomputes_everything_even_when_nothing_is_admitted():
    """Catches a preemption that keeps the victim's `computed` count (its pages are gone, so
    every token it has must be fed again). Static batching admits nothing while a batch runs, so
    no failed readmission attempt in the same step resets the count and masks the bug."""
    alloc = PageAllocator(5, PAGE)
    sched = Scheduler(alloc, max_num_seqs=3, max_num_batched_tokens=64, max_len=32, static=True)
    a, b, c = Request("A", [1] * 8, 4), Request("B", [2] * 3, 4), Request("C", [3] * 2, 4)
    for r in (a, b, c):
        sched.add(r)
    _apply(sched, sched.schedule())

    plan = sched.schedule()  # A needs a page: C, the newest, is preempted; nothing is admitted
    assert _ids(plan.preempted) == ["C"] and _ids(plan.decode) == ["A", "B"]
    assert (c.pages, c.computed, c.preemptions) == ([], 0, 1)
    assert _ids(sched.waiting) == ["C"] and alloc.n_free == 0
    _apply(sched, plan)

    plan = sched.schedule()  # B, now the newest, needs a page: B itself, ahead of C
    assert _ids(plan.preempted) == ["B"] and _ids(plan.decode) == ["A"]
    assert (b.pages, b.computed, b.preemptions) == ([], 0, 1)
    assert _ids(sched.waiting) == ["B", "C"]
    _apply(sched, plan)
    _apply(sched, sched.schedule())  # A finishes: the batch is over
    assert a.done and alloc.n_free == 4

    plan = sched.schedule()  # the next batch: both fed every token they have, in queue order
    assert [(r.id, n) for r, n in plan.prefill] == [("B", 3 + 2), ("C", 2 + 1)]


def test_the_next_tokens_are_the_slice_of_prompt_and_output():
    """`next_tokens(n)` against slicing `tokens` (prompt + output), at every point of a request
    whose prompt and output are any length."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        prompt = rng.integers(0, 256, rng.integers(1, 9)).tolist()
        req = Request("r", prompt, 16, out=rng.integers(0, 256, rng.integers(0, 9)).tolist())
        req.computed = int(rng.integers(0, len(req.tokens) + 1))
        n = int(rng.integers(1, 12))
        assert req.next_tokens(n) == req.tokens[req.computed : req.computed + n]
