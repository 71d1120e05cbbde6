"""`jaxscale serve`'s HTTP API, driven by the real `openai` client against a server on a free
loopback port: completions whole and streamed equal the engine's own tokens, concurrent clients,
max_tokens, stop, seed; bad requests get OpenAI-style 4xx bodies and leave the server healthy; a
client that disconnects mid-stream has its slot freed."""

import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow  # one server for the module; about a minute of requests

from jaxscale.config import ModelConfig  # noqa: E402
from jaxscale.model import state as ms  # noqa: E402
from jaxscale.serve.api import chat_prompt  # noqa: E402
from jaxscale.serve.engine import Engine, EngineConfig  # noqa: E402
from jaxscale.serve.sampling import SamplingParams  # noqa: E402
from jaxscale.serve.scheduler import Request  # noqa: E402
from jaxscale.serve.server import make_app  # noqa: E402
from jaxscale.tolerances import ATOL, RTOL  # noqa: E402

CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, max_seq=64)
PARAMS = ms.init_params(CFG, 0)
ECFG = EngineConfig(max_num_seqs=4, max_num_batched_tokens=32, page_size=8, n_pages=40)
NAME = "tiny"


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = Engine(PARAMS, CFG, ECFG)
    srv = uvicorn.Server(
        uvicorn.Config(make_app(engine, NAME), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{base}/health").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    yield base, engine
    srv.should_exit = True
    thread.join(timeout=30)


def _client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


GREEDY = SamplingParams(0.0)


def _direct(prompt: str, n: int, sampling=GREEDY) -> str:
    """The engine's own answer, no server."""
    eng = Engine(PARAMS, CFG, ECFG)
    out = eng.run([Request("r", list(prompt.encode()), n, sampling)])["r"].out
    return bytes(out).decode("utf-8", errors="replace")


def test_models_and_a_completion(server):
    base, _ = server
    client = _client(base)
    assert [m.id for m in client.models.list().data] == [NAME]
    r = client.completions.create(model=NAME, prompt="def add(a, b):", max_tokens=10, temperature=0)
    assert r.choices[0].text == _direct("def add(a, b):", 10)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 14 and r.usage.completion_tokens == 10


def test_streaming_equals_the_whole_answer(server):
    base, _ = server
    stream = _client(base).completions.create(
        model=NAME, prompt="import os", max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert len(chunks) >= 2
    assert "".join(c.choices[0].text for c in chunks) == _direct("import os", 12)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_completions_whole_and_streamed_through_the_template(server):
    """The openai client's chat API: the answer is the engine's own continuation of the
    documented template's prompt, whole and streamed (the role first, then the text)."""
    base, _ = server
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]
    want = _direct(chat_prompt(messages), 12)
    client = _client(base)
    whole = client.chat.completions.create(
        model=NAME, messages=messages, max_completion_tokens=12, temperature=0
    )
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == want
    assert whole.choices[0].finish_reason == "length"
    # "<|system|>\nx\n" + "<|user|>\nhi\n" + "<|assistant|>\n": 13 + 12 + 14 bytes
    assert whole.usage.prompt_tokens == 13 + 12 + 14
    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=messages, max_tokens=12, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=NAME, messages=messages, top_logprobs=3)


def test_log_probabilities_on_both_endpoints_whole_and_streamed(server):
    """Greedy: each token is its own top-1, with that log-probability; the streamed tokens and
    values are the whole answer's."""
    base, _ = server
    client = _client(base)
    r = client.completions.create(model=NAME, prompt="ab", max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and max(top, key=top.get) == tok and top[tok] == value <= 0
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    messages = [{"role": "user", "content": "hi"}]
    kw = dict(model=NAME, messages=messages, max_tokens=8, temperature=0, logprobs=True)
    whole = client.chat.completions.create(top_logprobs=2, **kw).choices[0].logprobs.content
    assert [len(t.top_logprobs) for t in whole] == [2] * 8
    assert all(t.top_logprobs[0].token == t.token for t in whole)
    streamed = [
        t
        for c in client.chat.completions.create(stream=True, top_logprobs=2, **kw)
        if c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in whole]
    # the same numbers up to float rounding (the two ran in batches of different shapes)
    np.testing.assert_allclose(
        [t.logprob for t in streamed], [t.logprob for t in whole], rtol=RTOL, atol=ATOL
    )


def _scrape(base) -> dict:
    """/metrics parsed by prometheus_client's own parser: {(sample, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{base}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_metrics_parse_and_count_the_requests_run_while_scraping(server):
    base, engine = server
    ok = ("jaxscale_requests_total", (("endpoint", "completions"), ("status", "200")))
    missing = ("jaxscale_requests_total", (("endpoint", "completions"), ("status", "404")))
    counts = ("jaxscale_generation_tokens_total", "jaxscale_prompt_tokens_total")
    counts += ("jaxscale_time_to_first_token_seconds_count",)
    counts += ("jaxscale_time_per_output_token_seconds_count",)
    counts += ("jaxscale_e2e_request_latency_seconds_count",)
    before = _scrape(base)
    prompts = [f"n = {i}" for i in range(4)]
    client = _client(base)
    with ThreadPoolExecutor(4) as pool:
        answers = [
            pool.submit(
                client.completions.create, model=NAME, prompt=p, max_tokens=20, temperature=0
            )
            for p in prompts
        ]
        during = [_scrape(base) for _ in range(5)]  # a scrape never waits for the engine
        assert all(a.result().usage.completion_tokens == 20 for a in answers)
    httpx.post(f"{base}/v1/completions", json={"model": "gpt-4", "prompt": "hi"})
    after = _scrape(base)
    delta = {k: after.get((k, ()), 0) - before.get((k, ()), 0) for k in counts}
    assert after[ok] - before.get(ok, 0) == 4 and after[missing] - before.get(missing, 0) == 1
    assert delta["jaxscale_generation_tokens_total"] == 4 * 20
    assert delta["jaxscale_prompt_tokens_total"] == sum(len(p) for p in prompts)
    assert all(delta[k] == 4 for k in counts[2:]), delta
    for scrape in (*during, after):
        used, free = scrape[("jaxscale_kv_pages_used", ())], scrape[("jaxscale_kv_pages_free", ())]
        assert used + free == ECFG.n_pages - 1
        assert 0 <= scrape[("jaxscale_prefix_cache_hit_rate", ())] <= 1
    assert after[("jaxscale_requests_running", ())] == after[("jaxscale_requests_waiting", ())] == 0


SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["id", "ok"],
    "additionalProperties": False,
}


def test_structured_outputs_hold_for_a_hundred_seeded_requests(server):
    """response_format json_schema (outlines-core), json_object and vLLM's guided_regex, whole
    and streamed, sampled at temperature 1: every text is what was asked for."""
    base, _ = server
    client = _client(base)
    fmt = {"type": "json_schema", "json_schema": {"name": "row", "schema": SCHEMA}}

    def ask(seed):
        r = client.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=36,
            temperature=1.0,
            seed=seed,
            response_format=fmt,
        )
        return r.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        rows = [json.loads(t) for t in pool.map(ask, range(100))]
    for row in rows:  # the schema, checked by hand: two keys, an int and a bool
        assert set(row) == {"id", "ok"} and type(row["id"]) is int and type(row["ok"]) is bool
    chunks = client.completions.create(
        model=NAME,
        prompt="{",
        max_tokens=30,
        seed=1,
        stream=True,
        extra_body={"response_format": {"type": "json_object"}},
    )
    json.loads("".join(c.choices[0].text for c in chunks))
    regex = "[0-9]{3}-[a-z]{2,4}"
    text = client.completions.create(
        model=NAME, prompt="a", max_tokens=12, seed=2, extra_body={"guided_regex": regex}
    )
    assert re.fullmatch(regex, text.choices[0].text), text.choices[0].text
    for extra, says in (
        ({"guided_regex": "(ab"}, "guided_regex"),
        ({"guided_regex": "[0-9]{30}"}, "max_tokens 12"),  # the grammar cannot finish in time
    ):
        with pytest.raises(openai.BadRequestError, match=says):
            client.completions.create(model=NAME, prompt="a", max_tokens=12, extra_body=extra)


def test_concurrent_clients_each_get_their_own_answer(server):
    base, _ = server
    prompts = [f"x = {i}" * (i + 1) for i in range(6)]  # more than the 4 slots

    def ask(p):
        return (
            _client(base)
            .completions.create(model=NAME, prompt=p, max_tokens=8, temperature=0)
            .choices[0]
            .text
        )

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(ask, prompts))
    assert got == [_direct(p, 8) for p in prompts]


def test_seed_and_stop(server):
    base, _ = server
    client = _client(base)

    def ask(**kw):
        return client.completions.create(model=NAME, prompt="for i in", max_tokens=16, **kw)

    a, b = ask(temperature=1.0, seed=11), ask(temperature=1.0, seed=11)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].text == _direct("for i in", 16, SamplingParams(1.0, seed=11))
    full = ask(temperature=0).choices[0].text
    stop = full[5:7]
    cut = ask(temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    # usage counts the tokens up to the one that completed the stop string, not what the
    # engine generated before the stop reached it (the text here is ASCII: a byte is a token)
    assert cut.usage.completion_tokens == full.find(stop) + len(stop)
    # no seed: each request draws its own, so the same request samples differently
    assert ask(temperature=1.0).choices[0].text != ask(temperature=1.0).choices[0].text


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{not json", 400, None),
        ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
        ({"model": NAME, "prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
        ({"model": NAME, "prompt": "hi", "max_tokens": 10**9}, 400, "max_tokens"),
        ({"model": NAME, "prompt": "x" * 60, "max_tokens": 16}, 400, "prompt"),
        ({"model": NAME, "prompt": "hi", "temperature": -0.5}, 400, "temperature"),
        ({"model": NAME, "prompt": ""}, 400, "prompt"),
        ({"model": NAME, "prompt": "hi", "stream": "false"}, 400, "stream"),
        ({"model": NAME, "prompt": "hi", "n": 2}, 400, "n"),
        # what the engine does not implement is refused by name, not ignored
        ({"model": NAME, "prompt": "hi", "logprobs": 9}, 400, "logprobs"),
        ({"model": NAME, "prompt": "hi", "echo": True}, 400, "echo"),
        ({"model": NAME, "prompt": "hi", "presence_penalty": 5.0}, 400, "presence_penalty"),
        ({"model": NAME, "prompt": "hi", "logit_bias": {"65": 5}}, 400, "logit_bias"),
        (
            {"model": NAME, "prompt": "hi", "stream_options": {"include_usage": True}},
            400,
            "stream_options",
        ),
        ({"model": NAME, "prompt": "hi", "temprature": 0.5}, 400, "temprature"),
        ({"prompt": "hi"}, 400, "model"),
        ({"model": NAME, "prompt": "a\ud800b"}, 400, "prompt"),  # a lone surrogate
        (b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    ],
)
def test_bad_requests_get_an_openai_error_and_change_nothing(server, body, status, param):
    base, engine = server
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        f"{base}/v1/completions", content=raw, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == status
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["param"] == param
    assert httpx.get(f"{base}/health").json()["running"] == 0


def test_errors_are_openai_json_and_the_connection_stays_usable(server):
    base, _ = server
    with httpx.Client(base_url=base) as c:  # one connection for every request below
        for method, path, status in (("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405)):
            r = c.request(method, path)
            assert r.status_code == status and r.json()["error"]["message"], r.text
        surrogate = json.dumps({"model": NAME, "prompt": "\udfff"}).encode()  # ASCII escapes
        bad = c.post("/v1/completions", content=surrogate)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
        ok = c.post("/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server):
    base, engine = server
    free = engine.allocator.n_free + (engine.cache.evictable_pages() if engine.cache else 0)
    body = {"model": NAME, "prompt": "while True:", "max_tokens": 50, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one token, then hang up
    for _ in range(100):
        h = httpx.get(f"{base}/health").json()
        if h["running"] == 0 and h["waiting"] == 0:
            break
        time.sleep(0.05)
    assert h["running"] == 0 and h["waiting"] == 0
    left = engine.allocator.n_free + (engine.cache.evictable_pages() if engine.cache else 0)
    assert left == free  # every page it took is free again (or an evictable cached prefix)


def test_an_engine_failure_is_a_500_and_the_next_request_is_served(server):
    """A step that raises ends the requests in flight with an OpenAI-style server error (whole
    or in the stream), frees them, and the engine serves the next request as before."""
    base, engine = server
    real_step, calls = engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) <= 2:  # the whole request's first step, then the stream's
            raise RuntimeError("planted failure")
        return real_step()

    engine.step = failing_step
    try:
        body = {"model": NAME, "prompt": "x = 1", "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "server_error" and "planted failure" in err["message"]
        with httpx.stream(
            "POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=60
        ) as s:
            lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
        assert "planted failure" in json.loads(lines[-1][6:])["error"]["message"]
        health = httpx.get(f"{base}/health").json()
        assert health["running"] == 0 and health["engine_errors"] == 2
        r = _client(base).completions.create(
            model=NAME, prompt="x = 1", max_tokens=4, temperature=0
        )
        assert r.choices[0].text == _direct("x = 1", 4)
    finally:
        engine.step = real_step


def test_a_non_streaming_client_that_hangs_up_frees_its_slot(server):
    """Steps slowed to 0.2 s: the 50 tokens asked for would take 10 s; the client gives up after
    half a second and the request is gone from the engine within a few polls."""
    base, engine = server
    real_step = engine.step

    def slow_step():
        time.sleep(0.2)
        return real_step()

    engine.step = slow_step
    try:
        body = {"model": NAME, "prompt": "for x in", "max_tokens": 50, "temperature": 0}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{base}/v1/completions", json=body, timeout=0.5)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 5:
            h = httpx.get(f"{base}/health").json()
            if h["running"] == 0 and h["waiting"] == 0:
                break
            time.sleep(0.1)
        assert h["running"] == 0 and h["waiting"] == 0
    finally:
        engine.step = real_step
