"""Speculative decoding in the engine (`serve --draft-ckpt DIR --speculative-tokens k`): greedy
output is the target's own, a draft equal to the target is always accepted (its cache follows
the target's exactly), and sampled tokens are distributed as the target's (chi-square)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxscale.config import ModelConfig
from jaxscale.model import pieces
from jaxscale.model import state as ms
from jaxscale.serve import sampling
from jaxscale.serve.engine import Engine, EngineConfig
from jaxscale.serve.sampling import SamplingParams
from jaxscale.serve.scheduler import Request

CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=64)
DRAFT = ModelConfig(n_layers=1, n_heads=2, n_kv_heads=1, d_model=32, d_ff=64, max_seq=64)
ECFG = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, page_size=8, n_pages=40)
PROMPTS = [[100, 101, 32, 61], [35, 32, 116, 104, 101, 110], [7], list(range(40, 60))]


@functools.cache
def _params():
    return ms.init_params(CFG, 0), ms.init_params(DRAFT, 1)


def _outs(engine, max_new=12):
    reqs = [Request(str(i), p, max_new, SamplingParams(0.0)) for i, p in enumerate(PROMPTS)]
    return {i: r.out for i, r in engine.run(reqs).items()}


@pytest.mark.parametrize(
    "k", [pytest.param(1, marks=[pytest.mark.slow, pytest.mark.first_line]), 4]
)
def test_greedy_speculative_engine_output_is_the_targets_own(k):
    """Four queued requests of different lengths (chunked prefill, rows joining mid-run), with
    a random draft that is rarely right: the one-device engine's greedy tokens without a draft."""
    target, draft = _params()
    want = _outs(Engine(target, CFG, ECFG))
    ecfg = dataclasses.replace(ECFG, speculative_tokens=k)
    eng = Engine(target, CFG, ecfg, draft_params=draft, draft_cfg=DRAFT)
    assert _outs(eng) == want
    assert eng.spec.target_passes > 0 and eng.spec.drafted == k * eng.spec.target_passes


def test_a_draft_equal_to_the_target_is_always_accepted():
    """With the target as its own draft every greedy draft is accepted, k + 1 tokens a pass:
    a draft cache one position behind (the fed-twice position after a fully accepted round) or
    a draft fed at the wrong positions would propose other tokens."""
    target, _ = _params()
    ecfg = dataclasses.replace(ECFG, speculative_tokens=3)
    eng = Engine(target, CFG, ecfg, draft_params=target, draft_cfg=CFG)
    assert _outs(eng, 13) == _outs(Engine(target, CFG, ECFG), 13)
    assert eng.spec.acceptance == 1.0 and eng.spec.rejected == 0


@pytest.mark.slow  # 1,200 requests through the engine
@pytest.mark.first_line
def test_sampled_tokens_through_the_engine_are_distributed_as_the_target():
    """1,200 requests of one prompt, each with its own seed, temperature 1 and top_k 4, the
    random draft proposing k = 2: the first token comes from the prefill program, the second
    from a speculative round. Grouped by the first token t, the second's counts against the
    target's filtered p(. | prompt, t) computed without a cache: Pearson's chi-square summed
    over the groups with at least 100 requests (3 degrees of freedom each); the statistic must
    stay below the 0.999 quantile of chi-square(3 x groups)."""
    from scipy import stats

    target, draft = _params()
    prompt = [72, 101, 108, 108, 111]
    ecfg = EngineConfig(
        max_num_seqs=32, max_num_batched_tokens=256, page_size=8, n_pages=200, speculative_tokens=2
    )
    eng = Engine(target, CFG, ecfg, draft_params=draft, draft_cfg=DRAFT)
    s = [SamplingParams(1.0, top_k=4, seed=i) for i in range(1200)]
    done = eng.run([Request(str(i), prompt, 2, s[i]) for i in range(1200)])
    pairs = np.array([done[str(i)].out for i in range(1200)])
    assert eng.spec.rejected > 0  # the residual draws are exercised
    stat, df = 0.0, 0
    for t in np.unique(pairs[:, 0]):
        second = pairs[pairs[:, 0] == t, 1]
        if len(second) < 100:
            continue
        logits = pieces.logits(target, jnp.asarray([prompt + [int(t)]]), CFG)[0, -1]
        x = sampling.filtered_logits(logits[None], jnp.ones(1), jnp.full(1, 4), jnp.ones(1))
        p = np.asarray(jax.nn.softmax(x[0]), np.float64)
        keep = p > 0
        assert set(second) <= set(np.flatnonzero(keep))  # never outside the top 4
        counts = np.bincount(second, minlength=len(p))[keep]
        expected = len(second) * p[keep]
        stat += ((counts - expected) ** 2 / expected).sum()
        df += keep.sum() - 1
    assert df >= 6 and stat < stats.chi2.ppf(0.999, df), (stat, df)


def test_a_draft_that_cannot_serve_the_target_is_refused():
    target, draft = _params()
    ecfg = dataclasses.replace(ECFG, speculative_tokens=2)
    for dcfg, says in (
        (DRAFT.replace(vocab=512), "vocabulary"),
        (DRAFT.replace(max_seq=32), "context"),
        (None, "needs a draft model"),
    ):
        with pytest.raises(ValueError, match=says):
            Engine(target, CFG, ecfg, draft_params=draft, draft_cfg=dcfg)
    eng = Engine(target, CFG, ecfg, draft_params=draft, draft_cfg=DRAFT)
    with pytest.raises(ValueError, match="2 speculative tokens"):  # no room for the drafts
        eng.add(Request("r", [1] * 20, 44))


@pytest.mark.slow  # eight engines warmed up
@pytest.mark.first_line
def test_bench_serve_decoding_rows():
    """bench serve --decoding on a small workload: every draft leaves the greedy output as it was,
    the target as its own draft is accepted throughout (k + 1 tokens a pass, the closed form's
    value at g = 1), and every json_object output parses."""
    import numpy as np

    from jaxscale.bench import serve_decoding, serve_setup

    setup = serve_setup.Setup(n_requests=4, prompt_len=8, max_new=10, max_num_seqs=4, budget=32)
    params = ms.init_params(setup.cfg, 0)
    res = serve_decoding.run(setup, params, serve_setup.prompts(setup, np.random.default_rng(0)))
    rows = {r["draft"]: r for r in res["speculative"]}
    assert all(r["same_output"] for r in rows.values())
    perfect = rows["the target itself"]
    k = serve_decoding.K
    assert perfect["acceptance"] == 1.0 and perfect["predicted_per_pass"] == k + 1
    assert res["structured"]["json_object"]["parsed"] == 1.0
    assert "speculative decoding, k = 4" in serve_decoding.format_rows(res)


# the random draft's rejections are the long case (10 s): the slow suite's
@pytest.mark.parametrize(
    "draft", [pytest.param("random", marks=[pytest.mark.slow, pytest.mark.first_line]), "self"]
)
def test_constrained_rows_speculate_and_keep_the_grammar_and_the_greedy_output(draft):
    """JSON and regex requests beside a free one on a speculative engine: the draft advances a
    copy of each grammar's state and both models' positions are masked by it. Greedy: the plain
    engine's constrained tokens; the target as its own draft is accepted in every round (up to
    the grammar's end); sampled JSON outputs parse."""
    import json
    import re

    from jaxscale.serve.constrained import JsonConstraint, RegexConstraint

    target, small = _params()
    dparams, dcfg = (target, CFG) if draft == "self" else (small, DRAFT)

    def reqs(temperature=0.0):
        s = [SamplingParams(temperature, seed=i) for i in range(4)]
        return [
            Request("json", PROMPTS[0], 24, s[0], constraint=JsonConstraint()),
            Request("free", PROMPTS[1], 12, s[1]),
            Request("re", PROMPTS[2], 16, s[2], constraint=RegexConstraint("[a-c]{3}-[0-9]+")),
            Request("json2", PROMPTS[3], 20, s[3], constraint=JsonConstraint()),
        ]

    def outs(eng, temperature=0.0):
        return {i: r.out for i, r in eng.run(reqs(temperature)).items()}

    want = outs(Engine(target, CFG, ECFG))
    ecfg = dataclasses.replace(ECFG, speculative_tokens=3)
    eng = Engine(target, CFG, ecfg, draft_params=dparams, draft_cfg=dcfg)
    assert outs(eng) == want
    json.loads(bytes(want["json"]))
    assert re.fullmatch(r"[a-c]{3}-[0-9]+\n?", bytes(want["re"]).decode())
    if draft == "self":
        assert eng.spec.rejected == 0 and eng.spec.accepted > 0
    else:
        sampled = outs(Engine(target, CFG, ecfg, draft_params=dparams, draft_cfg=dcfg), 1.0)
        json.loads(bytes(sampled["json"]))
        json.loads(bytes(sampled["json2"]))
