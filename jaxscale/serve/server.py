"""`jaxscale serve`: an OpenAI-compatible HTTP API on the engine (Starlette app, uvicorn).

Routes: POST /v1/completions and POST /v1/chat/completions (streamed as server-sent events,
or whole; the request bodies are `api.py`'s), GET /v1/models, GET /health. The engine runs in
its own thread (`replicas.EngineThread`; data-parallel replicas one each, behind a `Router`):
requests reach it through a queue, tokens come back to each request's asyncio queue. A bad
request gets a 4xx with an OpenAI-style error body and changes nothing; a client that goes away
mid-stream has its request aborted, which frees its slot and pages. GET /metrics: Prometheus'
text format (`metrics.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time

from jaxscale.serve.api import ApiError, logprobs, parse_chat, parse_completion
from jaxscale.serve.engine import Engine
from jaxscale.serve.metrics import ServerMetrics, Timing
from jaxscale.serve.replicas import EngineError, Router
from jaxscale.serve.scheduler import Request


class ClientGone(Exception):
    """The client of a non-streaming request hung up before its answer was ready."""


def make_app(engines: Engine | list[Engine], model_name: str, profile=None):
    """The Starlette app serving `engines` (one, or data-parallel replicas: `replicas.py`)
    under `model_name`; `profile`: a profiling.StepWindow over the first replica's steps."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    ids = itertools.count()
    engines = engines if isinstance(engines, list) else [engines]
    engine = engines[0]  # the model's limits (every replica serves the same model)
    metrics = ServerMetrics(engines)
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["engine"] = Router(engines, profile)
        try:
            yield
        finally:  # Ctrl-C or the end of a test: the engine thread stops with the server
            state["engine"].stop()

    def error(e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    async def health(request):
        each = [
            {
                "running": len(e.scheduler.running),
                "waiting": len(e.scheduler.waiting),
                "free_pages": e.allocator.n_free,
                "compiles": e.compiles,
            }
            for e in engines
        ]
        totals = {k: sum(r[k] for r in each) for k in each[0]}
        replicas = {"replicas": each} if len(engines) > 1 else {}
        return JSONResponse(
            {"status": "ok", **totals, "engine_errors": state["engine"].errors, **replicas}
        )

    async def prometheus(request):
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    async def models(request):
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "jaxscale"}
                ],
            }
        )

    async def completions(request):
        return await _generate(request, chat=False)

    async def chat_completions(request):
        return await _generate(request, chat=True)

    async def _generate(request, chat: bool):
        """One request of either endpoint: parsed, run on the engine, answered whole or as
        server-sent events; the two differ only in the prompt and the answer's shape."""
        endpoint, timing = ("chat_completions" if chat else "completions"), Timing()
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ApiError(400, "the request body is not valid JSON") from None
            except RecursionError:
                raise ApiError(400, "the request body is nested too deeply") from None
            except ClientDisconnect:  # hung up (or cut by a shutdown) before its body ended
                metrics.refused(endpoint, 499)
                return Response(status_code=499)  # nobody is left to read it
            parse = parse_chat if chat else parse_completion
            c = parse(body, model_name, engine.cfg.max_seq, engine.cfg.vocab)
        except ApiError as e:
            metrics.refused(endpoint, e.status)
            return error(e)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(ids)}"
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        req = Request(rid, c.prompt, c.max_tokens, c.sampling, constraint=c.constraint)
        state["engine"].submit(req, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        created = int(time.time())

        def chunk(text, reason, first=False, tokens=()):
            """A whole answer (`text` all of it) or one server-sent event's piece, with the
            log-probabilities of its `tokens` when the request asked for them."""
            lp = None if c.logprobs is None else logprobs(tokens, c.logprobs, chat)
            if not chat:
                choice = {"text": text, "index": 0, "logprobs": lp, "finish_reason": reason}
                kind = "text_completion"
            elif not c.stream:
                message = {"role": "assistant", "content": text}
                choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": reason}
                kind = "chat.completion"
            else:  # the first piece names the role; the last carries only the finish reason
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                delta = {} if reason and not text else delta
                choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": reason}
                kind = "chat.completion.chunk"
            return {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model_name,
                "choices": [choice],
            }

        checked = [time.monotonic()]

        async def next_event():
            """The engine's next event for this request. A non-streaming client that hangs up
            ends the request (a stream's disconnect cancels its generator instead): checked
            every quarter second, whether tokens keep coming or not."""
            while True:
                if not c.stream and time.monotonic() - checked[0] > 0.25:
                    checked[0] = time.monotonic()
                    if await request.is_disconnected():
                        raise ClientGone
                try:
                    return await asyncio.wait_for(events.get(), timeout=0.25)
                except TimeoutError:
                    continue

        async def pieces():
            """(text, finish_reason, tokens) as they come, `tokens` the events behind the text
            since the last piece; a stop string ends the request."""
            text, sent, tokens, given = "", 0, [], 0
            while True:
                ev = await next_event()
                if isinstance(ev, EngineError):
                    raise ApiError(500, str(ev), kind="server_error")
                if isinstance(ev, Exception):
                    raise ApiError(400, str(ev))
                tokens.append((ev, len(text)))  # the token, and its text's offset
                text += ev.text
                timing.token()  # tokens behind the text sent (up to a stop string)
                reason = ev.finish_reason
                hits = [text.find(s) for s in c.stop if s in text]
                if hits:
                    text, reason = text[: min(hits)], "stop"
                    state["engine"].abort(rid)
                # hold back a tail that could still become a stop string
                hold = 0 if reason else max((len(s) - 1 for s in c.stop), default=0)
                upto = max(sent, len(text) - hold)
                if upto > sent or reason:
                    yield text[sent:upto], reason, tokens[given:]
                    sent, given = upto, len(tokens)
                if reason:
                    return

        if not c.stream:
            parts = []
            try:
                async for part in pieces():
                    parts.append(part)
            except ApiError as e:
                metrics.finished(endpoint, e.status, len(c.prompt), timing)
                return error(e)
            except ClientGone:
                metrics.finished(endpoint, 499, len(c.prompt), timing)
                return Response(status_code=499)  # nobody is left to read it
            finally:  # done, failed or hung up: the slot is free either way
                state["engine"].abort(rid)
            metrics.finished(endpoint, 200, len(c.prompt), timing)
            text, every = "".join(p[0] for p in parts), [t for p in parts for t in p[2]]
            body = chunk(text, parts[-1][1], tokens=every)
            n = timing.tokens
            body["usage"] = {
                "prompt_tokens": len(c.prompt),
                "completion_tokens": n,
                "total_tokens": len(c.prompt) + n,
            }
            return JSONResponse(body)

        async def sse():
            status = 499  # unless it ends below: the client went away
            try:
                if chat:  # the role first, as OpenAI's stream does
                    yield f"data: {json.dumps(chunk('', None, first=True))}\n\n"
                async for piece, reason, tokens in pieces():
                    yield f"data: {json.dumps(chunk(piece, reason, tokens=tokens))}\n\n"
                yield "data: [DONE]\n\n"
                status = 200
            except ApiError as e:  # the status line is sent: the error goes in the stream
                status = e.status
                yield f"data: {json.dumps(e.body())}\n\n"
            finally:  # the client went away (or we are done): free the slot either way
                state["engine"].abort(rid)
                metrics.finished(endpoint, status, len(c.prompt), timing)

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def http_error(request, exc):
        """404, 405 and the like, as OpenAI error bodies."""
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error(ApiError(exc.status_code, message, kind=kind))

    async def server_error(request, exc):
        return error(ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error"))

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/metrics", prometheus),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
