"""The radix prefix cache's tree (matching whole pages, splitting edges, LRU eviction of unused
leaves, reference counts) and the engine with it: the same tokens as without it."""

import numpy as np

from jaxscale.config import ModelConfig
from jaxscale.model import state as ms
from jaxscale.serve.engine import Engine, EngineConfig
from jaxscale.serve.pages import PageAllocator
from jaxscale.serve.prefix_cache import RadixCache
from jaxscale.serve.sampling import SamplingParams
from jaxscale.serve.scheduler import Request

PS = 4


def _cache(n_pages=32):
    a = PageAllocator(n_pages, PS)
    return a, RadixCache(a)


def _cached_run(a, c, tokens):
    """A finished request's pages for `tokens`, handed to the tree, its own reference dropped."""
    pages = a.allocate(a.pages_for(len(tokens)))
    c.insert(tokens, pages)
    a.release(pages)
    return pages


def test_a_shared_prefix_is_matched_by_whole_pages():
    a, c = _cache()
    system = list(range(100, 108))  # two pages
    pages = _cached_run(a, c, system + [1, 2, 3, 4, 5])
    got, path = c.match(system + [9, 9, 9])
    assert got == pages[:2]  # the request's third page differs from the cached one
    assert len(got) * PS == 8 and len(path) == 1
    assert all(a.refs[p] == 2 for p in got)  # the tree's reference and the request's
    c.unlock(path)


def test_at_least_one_token_is_left_to_compute():
    a, c = _cache()
    pages = _cached_run(a, c, list(range(8)))
    got, _ = c.match(list(range(8)))  # all 8 cached, but the last token's logits are needed
    assert got == pages[:1]


def test_an_edge_is_split_where_prompts_part():
    a, c = _cache()
    pages = _cached_run(a, c, list(range(12)))  # one edge of 3 pages
    got, path = c.match(list(range(4)) + [50] * 8)
    assert got == pages[:1]
    c.unlock(path)
    got, path = c.match(list(range(12)) + [7])  # the split edge still serves the whole run
    assert got == pages
    c.unlock(path)


def test_least_recently_used_unused_leaves_are_evicted_first():
    a, c = _cache(n_pages=9)
    old = _cached_run(a, c, [1] * 8)
    new = _cached_run(a, c, [2] * 8)
    held, path = c.match([2] * 8 + [0])  # `new` in use now, and most recent
    assert a.n_free == 4 and c.evictable_pages() == 2
    assert c.evict(3) == 2  # only `old` can go
    assert set(old) <= set(a.free_ids) and not set(new) & set(a.free_ids) and a.n_free == 6
    c.unlock(path)
    a.release(held)
    assert c.evict(2) == 2 and a.n_free == 8  # every page back


def _full_runs(c):
    """Each node's whole token run from the root -> its users."""
    got = {}
    for nd in c._nodes():
        run, up = nd.tokens, nd.parent
        while up is not c.root:
            run, up = up.tokens + run, up.parent
        got[run] = nd.users
    return got


def _covering(runs, running):
    """The rule, stated apart from the tree: a node is used by every running request whose
    matched prefix (its pages' tokens) contains the node's whole run."""
    return {run: sum(prefix[: len(run)] == run for prefix in running) for run in runs}


def test_a_split_under_a_running_request_is_released_with_it():
    """Request 1 holds the cached run [1 2 3 4 | 5 6 7 8]; request 2 shares only its first page,
    which splits the edge while request 1 still uses it. At every point each node's users are
    the running requests whose matched prefix covers it; when both let go, every node is unused
    and eviction gives every page back to the pool."""
    a, c = _cache(n_pages=8)
    _cached_run(a, c, [1, 2, 3, 4, 5, 6, 7, 8])
    running = {}
    for name, prompt in (("one", [1, 2, 3, 4, 5, 6, 7, 8, 9]), ("two", [1, 2, 3, 4, 0, 0, 0, 0])):
        pages, path = c.match(prompt)
        running[name] = (tuple(prompt[: len(pages) * PS]), pages, path)
        runs = _full_runs(c)
        assert runs == _covering(runs, [prefix for prefix, _, _ in running.values()])
    assert [len(pages) for _, pages, _ in running.values()] == [2, 1]
    assert sorted(map(len, _full_runs(c))) == [4, 8]  # the edge was split after one page
    for name in ("one", "two"):
        _, pages, path = running.pop(name)
        a.release(pages)
        c.unlock(path)
        runs = _full_runs(c)
        assert runs == _covering(runs, [prefix for prefix, _, _ in running.values()])
    assert all(nd.users == 0 for nd in c._nodes()) and c.evictable_pages() == 2
    assert c.evict(100) == 2 and a.n_free == a.n_pages - 1


CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=64)
PARAMS = ms.init_params(CFG, 0)


def test_the_hit_rate_counts_each_admission_once():
    """A request that waits for pages looks the cache up at every step it tries to get in; only
    the lookup of its admission counts."""
    from jaxscale.serve.scheduler import Scheduler

    a, c = _cache(n_pages=5)  # 4 usable pages of 4 tokens
    _cached_run(a, c, [7] * 4)  # one cached page
    sched = Scheduler(a, max_num_seqs=2, max_num_batched_tokens=16, max_len=64, prefix_cache=c)
    sched.add(Request("hog", [1] * 12, 5))  # 3 pages, then a 4th when it decodes
    sched.add(Request("wait", [7] * 4 + [2], 2))  # needs 2 pages: never free while hog runs

    def run_step(plan):
        for r, n in plan.prefill:
            sched.advance(r, n, 65 if r.computed + n == len(r.tokens) else None, None)
        for r in plan.decode:
            sched.advance(r, 1, 65, None)

    for _ in range(4):  # "wait" fails to get in at every one of these steps
        run_step(sched.schedule())
        assert [r.id for r in sched.waiting] == ["wait"]
    assert c.query_tokens == 12 and c.hit_tokens == 0  # the hog's lookup only
    while sched.has_work():
        run_step(sched.schedule())
    assert c.query_tokens == 12 + 5  # and "wait"'s admission, once


def test_the_engine_gives_the_same_tokens_with_and_without_the_cache():
    rng = np.random.default_rng(5)
    system = [int(t) for t in rng.integers(32, 127, 20)]
    prompts = [system + [int(t) for t in rng.integers(32, 127, n)] for n in (3, 7, 1, 5)]

    def run(cache: bool):
        ecfg = EngineConfig(
            max_num_seqs=2, max_num_batched_tokens=32, page_size=PS, n_pages=40, prefix_cache=cache
        )
        eng = Engine(PARAMS, CFG, ecfg)
        reqs = [Request(str(i), p, 6, SamplingParams(1.0, seed=i)) for i, p in enumerate(prompts)]
        done = eng.run(reqs)
        return [done[str(i)].out for i in range(4)], eng

    plain, _ = run(False)
    cached, eng = run(True)
    assert cached == plain
    # the first two run together (nothing cached yet); the last two reuse 20 // 4 = 5 pages each
    assert eng.cache.hit_tokens == 2 * 20
