"""The continuous-batching engine against static-batch generation (jaxscale/serve/generate.py,
contiguous cache): the same tokens for every request however they are queued, chunked, batched
or preempted."""

import numpy as np
import pytest

from jaxscale.config import ModelConfig
from jaxscale.model import state as ms
from jaxscale.serve import generate as gen
from jaxscale.serve.engine import Detokenizer, Engine, EngineConfig
from jaxscale.serve.sampling import SamplingParams
from jaxscale.serve.scheduler import Request

CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=64)
PARAMS = ms.init_params(CFG, 0)
RNG = np.random.default_rng(3)
PROMPTS = [list(RNG.integers(32, 127, n)) for n in (3, 20, 9, 13, 5)]
MAX_NEW = 12
SETTINGS = [
    SamplingParams(0.0),
    SamplingParams(1.0, seed=1),
    SamplingParams(0.8, top_k=20, seed=2),
    SamplingParams(1.0, top_p=0.9, seed=3),
    SamplingParams(0.0),
]


def _expected():
    """Each request alone, static batch, contiguous cache."""
    return [
        gen.generate(PARAMS, [p], CFG, MAX_NEW, [s]).row(0)
        for p, s in zip(PROMPTS, SETTINGS, strict=True)
    ]


WANT = None


def _want():
    global WANT
    WANT = WANT or _expected()
    return WANT


def _requests():
    return [
        Request(str(i), [int(t) for t in p], MAX_NEW, s)
        for i, (p, s) in enumerate(zip(PROMPTS, SETTINGS, strict=True))
    ]


@pytest.mark.slow
@pytest.mark.first_line
def test_queued_chunked_batched_requests_get_their_own_tokens():
    """3 slots for 5 requests (a queue), a budget of 16 tokens a step (the 20-token prompt is
    prefilled in chunks, beside other requests' decode steps)."""
    eng = Engine(
        PARAMS,
        CFG,
        EngineConfig(max_num_seqs=3, max_num_batched_tokens=16, page_size=8, n_pages=32),
    )
    done = eng.run(_requests())
    assert [done[str(i)].out for i in range(5)] == _want()
    assert all(r.finish_reason == "length" for r in done.values())
    # bounded compiles: batch sizes {1, 2, 4} x (decode + prefill buckets {8, 16}), and mixed
    # steps' chunks {1, 2} x {8, 16} beside 2 one-token rows
    assert eng.compiles <= eng.compile_bound == 3 * 3 + 2 * 2
    assert any(len(shape) == 2 for shape in eng.shapes)  # a step mixed decode and prefill
    eng.cache.evict(32)  # the prefix cache keeps finished prompts' pages until evicted
    assert eng.allocator.n_free == 31  # every page back


@pytest.mark.slow
@pytest.mark.first_line
def test_preempted_requests_finish_with_the_same_tokens():
    """A pool too small for all running requests: the newest is preempted and recomputed."""
    eng = Engine(
        PARAMS,
        CFG,
        EngineConfig(max_num_seqs=4, max_num_batched_tokens=32, page_size=4, n_pages=14),
    )
    done = eng.run(_requests())
    assert sum(r.preemptions for r in done.values()) > 0
    assert [done[str(i)].out for i in range(5)] == _want()


@pytest.mark.slow
@pytest.mark.first_line
def test_eos_stops_a_request_early():
    first = _want()[0]
    eng = Engine(PARAMS, CFG, EngineConfig(eos_id=first[4]))
    done = eng.run([Request("a", [int(t) for t in PROMPTS[0]], MAX_NEW, SETTINGS[0])])
    assert done["a"].out == first[: first.index(first[4]) + 1]
    assert done["a"].finish_reason == "stop"


def test_streamed_text_never_splits_a_character():
    d = Detokenizer()
    pieces = [d.push(b) for b in "aé€😀".encode()] + [d.finish()]
    assert pieces == ["a", "", "é", "", "", "€", "", "", "", "😀", ""]
    d = Detokenizer()
    assert d.push(0xE2) == "" and d.finish() == "\ufffd"  # a truncated character at the end


def test_requests_that_cannot_fit_are_refused():
    eng = Engine(PARAMS, CFG)
    with pytest.raises(ValueError, match="context"):
        eng.add(Request("x", [1] * 60, 8))
    with pytest.raises(ValueError, match="prompt token"):
        eng.add(Request("y", [], 8))
    with pytest.raises(ValueError, match="divide"):
        Engine(PARAMS, CFG, EngineConfig(page_size=7))
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        eng.add(Request("z", [1], 0))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add(Request("v", [1, 256], 4))
    # 40 + 20 - 1 positions need 4 pages of 16; a pool of 3 usable pages could never hold them,
    # and waiting for pages would spin forever
    small = Engine(PARAMS, CFG, EngineConfig(page_size=16, n_pages=4))
    with pytest.raises(ValueError, match="needs 4 KV pages; the pool has 3"):
        small.add(Request("big", [1] * 40, 20))
    small.add(Request("fits", [1] * 40, 9))  # 48 positions: 3 pages
    with pytest.raises(ValueError, match="already in flight"):
        small.add(Request("fits", [2], 1))
    assert [r.id for r in small.scheduler.waiting] == ["fits"]


def test_grammars_in_the_batch_constrain_their_own_rows_only():
    """A JSON request, a regex request and a plain one in one batch on 2 slots: the JSON parses,
    the regex text fully matches, each equals the single-request constrained generator's greedy
    output, and the plain request's tokens are those it gets alone."""
    import json
    import re

    from jaxscale.serve import constrained

    prompt = [int(t) for t in PROMPTS[0]]
    regex = r"[a-c]{2,5}@(x|yz)"
    grammars = [constrained.JsonConstraint(), constrained.RegexConstraint(regex), None]
    max_new = [40, 12, MAX_NEW]
    eng = Engine(PARAMS, CFG, EngineConfig(max_num_seqs=2, max_num_batched_tokens=16))
    reqs = [
        Request(str(i), prompt, n, SamplingParams(0.0), constraint=g)
        for i, (g, n) in enumerate(zip(grammars, max_new, strict=True))
    ]
    texts = {r.id: "" for r in reqs}
    for r in reqs:
        eng.add(r)
    while eng.has_work():
        for ev in eng.step():
            texts[ev.request_id] += ev.text
    json.loads(texts["0"])
    assert re.fullmatch(regex, texts["1"]) and reqs[1].finish_reason == "stop"
    for r, g in zip(reqs[:2], grammars[:2], strict=True):
        alone = constrained.generate(PARAMS, CFG, prompt, g, r.max_tokens)
        assert r.out == alone, (r.out, alone)
    assert reqs[2].out == gen.generate(PARAMS, [PROMPTS[0]], CFG, MAX_NEW).row(0)


def test_a_grammar_that_cannot_finish_within_max_tokens_is_refused_at_add():
    from jaxscale.serve import constrained

    eng = Engine(PARAMS, CFG)
    c = constrained.RegexConstraint("[0-9]{10}")
    with pytest.raises(ValueError, match="max_tokens 5"):
        eng.add(Request("r", [65], 5, constraint=c))
    assert not eng.has_work()


def test_log_probabilities_are_the_uncached_models():
    """Each event's log-probability and top tokens: log_softmax of the full recomputation
    (pieces.logits over prompt + output) at the position that produced the token."""
    import jax

    from jaxscale.model import pieces
    from jaxscale.tolerances import ATOL, RTOL

    prompt = [int(t) for t in PROMPTS[1]]
    eng = Engine(PARAMS, CFG, EngineConfig(max_num_seqs=2, max_num_batched_tokens=16))
    eng.add(Request("r", prompt, MAX_NEW, SamplingParams(1.0, seed=5)))
    events = []
    while eng.has_work():
        events += eng.step()
    out = [ev.token for ev in events]
    logits = pieces.logits(PARAMS, np.asarray([prompt + out], np.int32), CFG)
    logp = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
    for i, ev in enumerate(events):
        want = logp[len(prompt) - 1 + i]
        np.testing.assert_allclose(ev.logprob, want[ev.token], rtol=RTOL, atol=ATOL)
        ids = [t for t, _ in ev.top]
        assert ids == list(np.argsort(-want, kind="stable")[: len(ids)]) and len(ids) == 20
        np.testing.assert_allclose([lp for _, lp in ev.top], want[ids], rtol=RTOL, atol=ATOL)


def test_an_int8_pool_serves_the_model_with_rounded_keys_and_values():
    """`kv_dtype="int8"`: two requests, chunked and batched over a paged int8 pool; each event's
    log-probability is the uncached model's whose attention reads int8-rounded keys and values
    (at the position that produced the token), not the full-precision model's."""
    import jax

    from jaxscale.model import pieces
    from tests.model.test_kv_cache import _rounded_attend, assert_int8_rounding

    ecfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, page_size=8, kv_dtype="int8")
    eng = Engine(PARAMS, CFG, ecfg)
    assert eng.pool["k"].dtype == np.int8
    reqs = [
        Request(str(i), [int(t) for t in PROMPTS[i]], 6, SamplingParams(1.0, seed=i))
        for i in (1, 2)
    ]
    events = {r.id: [] for r in reqs}
    for r in reqs:
        eng.add(r)
    while eng.has_work():
        for ev in eng.step():
            events[ev.request_id].append(ev)
    rounded = pieces.DENSE.replace(attend=_rounded_attend)
    got, want, full = [], [], []
    for r in reqs:
        out = [ev.token for ev in events[r.id]]
        assert out == r.out and len(out) == 6
        seq = np.asarray([r.prompt + out], np.int32)
        at = [(len(r.prompt) - 1 + i, t) for i, t in enumerate(out)]  # each token's position
        for pc, dst in ((rounded, want), (pieces.DENSE, full)):
            logp = np.asarray(jax.nn.log_softmax(pieces.logits(PARAMS, seq, CFG, pc)[0], -1))
            dst += [logp[i, t] for i, t in at]
        got += [ev.logprob for ev in events[r.id]]
    assert_int8_rounding(got, want, full)


@pytest.mark.parametrize(
    "moe_every", [pytest.param(1, marks=[pytest.mark.slow, pytest.mark.first_line]), 2]
)
def test_an_moe_model_is_served_dropless_with_its_uncached_greedy_tokens(moe_every):
    """A capacity-routed MoE checkpoint is served dropless (a token's experts do not depend on
    what shares its step): queued, chunked and batched, each request's greedy tokens are the
    uncached model's, recomputed over the whole sequence at every step."""

    cfg = CFG.replace(n_experts=4, top_k=2, moe_mode="capacity", moe_every=moe_every)
    params = ms.init_params(cfg, 0)
    eng = Engine(params, cfg, EngineConfig(max_num_seqs=2, max_num_batched_tokens=8))
    assert eng.cfg.moe_mode == "dropless"
    greedy = SamplingParams(0.0)
    reqs = [Request(str(i), [int(t) for t in p], 6, greedy) for i, p in enumerate(PROMPTS[:3])]
    for r in reqs:
        eng.add(r)
    while eng.has_work():
        eng.step()
    _assert_uncached_greedy(reqs, params, cfg.replace(moe_mode="dropless"), 6)


def _assert_uncached_greedy(reqs, params, cfg, n: int) -> None:
    """Each request's n tokens are the model's own greedy ones, recomputed without a cache."""
    import jax

    from jaxscale.model import pieces

    width = max(len(r.prompt) for r in reqs) + n  # one shape: causal, so the padding is unread
    logits = jax.jit(lambda t: pieces.logits(params, t, cfg))
    for r in reqs:
        seq = list(r.prompt)
        for _ in range(n):
            row = np.zeros((1, width), np.int32)
            row[0, : len(seq)] = seq
            seq.append(int(np.argmax(logits(row)[0, len(seq) - 1])))
        assert r.out == seq[len(r.prompt) :], r.id


def _events_by_request(overlap: bool, eos_id=None, grammar=False):
    """Every event of 5 requests (a queue on 3 slots, a pool small enough to preempt, chunked
    prefill; with `grammar`, request 2 regex-constrained), by request, and the requests."""
    from jaxscale.serve import constrained

    ecfg = EngineConfig(
        max_num_seqs=3, max_num_batched_tokens=16, page_size=4, n_pages=12, eos_id=eos_id
    )
    eng = Engine(PARAMS, CFG, ecfg.__class__(**{**ecfg.__dict__, "overlap": overlap}))
    reqs = _requests()
    if grammar:
        reqs[2].constraint = constrained.RegexConstraint(r"[a-c]{2,5}@(x|yz)")
    for r in reqs:
        eng.add(r)
    events = {r.id: [] for r in reqs}
    still_on_device = 0
    while eng.has_work():
        for ev in eng.step():
            events[ev.request_id].append((ev.token, ev.text, ev.finish_reason, ev.logprob))
        still_on_device += bool(eng.launched)
    outcome = {r.id: (r.out, r.finish_reason) for r in reqs}
    return events, outcome, sum(r.preemptions for r in reqs), still_on_device


def test_reading_tokens_a_step_late_changes_no_event():
    """The engine launching step n + 1 before reading step n's tokens (the default) gives the
    events, tokens and finish reasons of the engine that reads each step first: with
    preemption, chunked prefill, an EOS met mid-run, and a grammar-constrained row. (Which
    request is preempted when may differ: a request that met EOS holds its pages one step
    longer. Its tokens may not.)"""
    _, sync_reqs, preempted, _ = _events_by_request(overlap=False)
    assert preempted > 0
    eos = sync_reqs["1"][0][3]  # a token request 1 samples mid-run
    for grammar in (False, True):
        want, want_reqs, _, left = _events_by_request(False, eos, grammar)
        got, got_reqs, _, behind = _events_by_request(True, eos, grammar)
        assert left == 0 and behind > 0  # read before returning / left on the device
        assert any(reason == "stop" for _, reason in want_reqs.values())
        assert got_reqs == want_reqs
        assert got == want


def test_a_step_with_decode_rows_and_prefill_chunks_launches_one_program(monkeypatch):
    """Every step launches one compiled program: a step whose one-token rows share it with
    prefill chunks runs `program.run_mixed` once (its two parts, the next step's two `prev`
    halves), the others `program.run` once. warmup() compiles the stated bound, every shape
    a step then runs among them; the greedy tokens are the uncached model's."""

    from jaxscale.serve import program

    calls = []
    for name in ("run", "run_mixed"):
        fn = getattr(program, name)
        monkeypatch.setattr(
            program, name, lambda *a, _fn=fn, _n=name, **kw: (calls.append(_n), _fn(*a, **kw))[1]
        )
    ecfg = EngineConfig(max_num_seqs=3, max_num_batched_tokens=16, page_size=8, n_pages=32)
    eng = Engine(PARAMS, CFG, ecfg)
    # batch sizes {1, 2, 4} x (one-token rows + buckets {8, 16}); a mixed step's one-token part
    # padded to b_mix = 2 rows (3 slots, one held by a chunk), its chunks {1, 2} x {8, 16}
    assert (eng.b_mix, eng.mixed) == (2, [(1, 8), (1, 16), (2, 8), (2, 16)])
    assert eng.compile_bound == 3 * (1 + 2) + 2 * 2 <= 3 * (1 + 2 * 2)
    assert eng.warmup() == eng.compile_bound == eng.compiles
    warm = set(eng.shapes)
    greedy = SamplingParams(0.0)
    reqs = [Request(str(i), [int(t) for t in p], 6, greedy) for i, p in enumerate(PROMPTS[:4])]
    for r in reqs:
        eng.add(r)
    parts = []
    while eng.has_work():
        before, launches = len(calls), eng.launches
        eng.step()
        parts.append(len(eng.launched))
        want = {0: [], 1: ["run"], 2: ["run_mixed"]}[len(eng.launched)]
        assert calls[before:] == want and eng.launches - launches == len(want)
    assert parts.count(2) >= 2  # steps that mixed decode rows and prefill chunks
    assert eng.shapes == warm  # nothing compiled after the warm-up
    _assert_uncached_greedy(reqs, PARAMS, CFG, 6)


@pytest.mark.slow  # a speculative engine compiled
@pytest.mark.first_line
def test_a_speculative_engines_mixed_step_fills_the_drafts_cache_from_both_parts(monkeypatch):
    """With a draft, a step's one-token part holds prompts cut to one token by the budget: a
    15-token prompt and the next prompt's first token share a step (one program, both parts).
    The draft's cache follows both parts: the target as its own draft is always accepted, and
    the greedy tokens are the engine's without a draft."""
    import dataclasses

    from jaxscale.serve import program

    mixed = []
    fn = program.run_mixed
    monkeypatch.setattr(program, "run_mixed", lambda *a, **kw: (mixed.append(1), fn(*a, **kw))[1])
    ecfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, page_size=8, n_pages=40)
    prompts = [list(range(40, 55)), [35, 32, 116, 104, 101, 110], [7], list(range(60, 80))]

    def outs(eng):
        reqs = [Request(str(i), p, 12, SamplingParams(0.0)) for i, p in enumerate(prompts)]
        return {i: r.out for i, r in eng.run(reqs).items()}

    want = outs(Engine(PARAMS, CFG, ecfg))
    mixed.clear()
    spec = dataclasses.replace(ecfg, speculative_tokens=3)
    eng = Engine(PARAMS, CFG, spec, draft_params=PARAMS, draft_cfg=CFG)
    assert outs(eng) == want
    assert mixed and eng.spec.acceptance == 1.0 and eng.spec.rejected == 0
