"""`jaxscale serve`: an OpenAI-compatible HTTP API on the engine (Starlette app, uvicorn).

Routes: POST /v1/completions (streamed as server-sent events, or whole), GET /v1/models,
GET /health. The engine runs in its own thread (`EngineThread`): requests reach it through a
queue, tokens come back to each request's asyncio queue. A bad request gets a 4xx with an
OpenAI-style error body and changes nothing; a client that goes away mid-stream has its request
aborted, which frees its slot and pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import secrets
import threading
import time
from dataclasses import dataclass

from jaxscale.serve.engine import Engine
from jaxscale.serve.sampling import SamplingParams
from jaxscale.serve.scheduler import Request


class ClientGone(Exception):
    """The client of a non-streaming request hung up before its answer was ready."""


class EngineError(RuntimeError):
    """An engine step failed while this request was in flight (a 500, not the client's fault)."""


class EngineThread:
    """The engine's own loop: takes submissions and aborts from a queue, steps while there is
    work, and hands each event to the callback its request was submitted with."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.inbox: queue.Queue = queue.Queue()
        self.callbacks: dict[str, callable] = {}
        self.stopped = threading.Event()
        self.errors = 0  # engine steps that raised
        self.thread = threading.Thread(target=self._loop, name="jaxscale-engine", daemon=True)
        self.thread.start()

    def submit(self, req: Request, callback) -> None:
        self.inbox.put(("add", req, callback))

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id, None))

    def stop(self) -> None:
        self.stopped.set()
        self.inbox.put(("stop", None, None))
        self.thread.join(timeout=30)

    def _handle(self, kind, item, callback) -> None:
        if kind == "add":
            try:
                self.engine.add(item)
                self.callbacks[item.id] = callback
            except ValueError as e:
                callback(e)
        elif kind == "abort" and self.engine.abort(item):
            self.callbacks.pop(item, None)

    def _loop(self) -> None:
        while not self.stopped.is_set():
            busy = self.engine.scheduler.has_work()
            try:  # block only when idle
                self._handle(*self.inbox.get(timeout=None if not busy else 0))
                while True:
                    self._handle(*self.inbox.get_nowait())
            except queue.Empty:
                pass
            if self.stopped.is_set() or not self.engine.scheduler.has_work():
                continue
            try:
                events = self.engine.step()
            except Exception as e:  # noqa: BLE001 - reported to every client, the loop goes on
                self._fail_all(e)
                continue
            for ev in events:
                cb = self.callbacks.get(ev.request_id)
                if cb is not None:
                    cb(ev)
                if ev.finish_reason is not None:
                    self.callbacks.pop(ev.request_id, None)

    def _fail_all(self, error: Exception) -> None:
        """An engine step raised: every request in flight ends with the error (a 500 to its
        client) and is aborted, so the engine is empty and serves the next requests."""
        self.errors += 1
        for rid, cb in list(self.callbacks.items()):
            self.engine.abort(rid, "error")
            cb(EngineError(f"the engine failed: {type(error).__name__}: {error}"))
        self.callbacks.clear()


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Completion:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool


def _number(body: dict, name: str, default, kind, low, high):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        raise ApiError(
            400,
            f"'{name}' must be {'an integer' if kind is int else 'a number'} in "
            f"[{low}, {high}], got {value!r}",
            name,
        )
    return value


# The completion fields this server implements; "user" is the client's own label (kept in no
# log, changes nothing). Any other field is refused by name, never silently ignored -- except
# OpenAI's fields that are not implemented here sent at the value that asks for nothing.
IMPLEMENTED = frozenset(
    ("model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n")
    + ("stream", "user")
)
INERT = {  # value(s) besides null that ask for nothing
    "logprobs": (),
    "echo": (False,),
    "best_of": (1,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "suffix": ("",),
    "stream_options": (),
}


def _unsupported(body: dict) -> None:
    """ApiError naming the first field this server does not implement."""
    for name, value in body.items():
        if name in IMPLEMENTED:
            continue
        if name not in INERT:
            raise ApiError(400, f"unrecognized request argument supplied: {name!r}", name)
        inert = value is None or any(
            value == v and isinstance(value, bool) == isinstance(v, bool) for v in INERT[name]
        )
        if not inert:
            raise ApiError(400, f"{name!r} is not supported by this server", name)


def parse_completion(body, model_name: str, max_seq: int, vocab: int = 256) -> Completion:
    """The request body, checked; ApiError names the first thing wrong. Tokens are bytes; a
    model trained with a smaller vocabulary refuses the bytes it has no embedding for."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _unsupported(body)
    if body.get("model") is None:
        raise ApiError(400, "you must provide a model parameter ('model')", "model")
    if body.get("model") != model_name:
        raise ApiError(
            404,
            f"the model {body.get('model')!r} does not exist; this server has {model_name!r}",
            "model",
            "model_not_found",
        )
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        try:
            ids = list(prompt.encode("utf-8"))
        except UnicodeEncodeError as e:  # a lone surrogate ("\ud800") has no UTF-8 bytes
            raise ApiError(
                400, f"'prompt' is not valid Unicode text: {e.reason} at {e.start}", "prompt"
            ) from None
    elif (
        isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < 256 for t in prompt)
    ):
        ids = prompt
    else:
        raise ApiError(400, "'prompt' must be a non-empty string (or a list of byte ids)", "prompt")
    if not ids:
        raise ApiError(400, "'prompt' must not be empty", "prompt")
    if max(ids) >= vocab:
        raise ApiError(
            400,
            f"this model's vocabulary is bytes 0..{vocab - 1}; the prompt has byte {max(ids)}",
            "prompt",
        )
    # OpenAI's default of 16 new tokens, cut to the context the prompt leaves
    max_tokens = _number(body, "max_tokens", max(1, min(16, max_seq - len(ids))), int, 1, max_seq)
    if len(ids) + max_tokens > max_seq:
        raise ApiError(
            400,
            f"this model's context is {max_seq} tokens; the prompt has {len(ids)} "
            f"and max_tokens asks for {max_tokens}",
            "prompt",
            "context_length_exceeded",
        )
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "'stop' must be a string or a list of non-empty strings", "stop")
    if body.get("n") not in (None, 1):
        raise ApiError(400, "only n = 1 is supported", "n")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, f"'stream' must be true or false, got {stream!r}", "stream")
    sampling = SamplingParams(
        temperature=float(_number(body, "temperature", 1.0, (int, float), 0.0, 2.0)),
        top_p=float(_number(body, "top_p", 1.0, (int, float), 1e-6, 1.0)),
        top_k=_number(body, "top_k", 0, int, 0, 1 << 20),
        # no seed: a fresh one per request, so equal requests get different samples (OpenAI's
        # behaviour); with a seed, the same request gets the same tokens
        seed=_number(body, "seed", secrets.randbelow(2**32), int, 0, 2**32 - 1),
    )
    return Completion(ids, max_tokens, sampling, tuple(stop), bool(stream))


def make_app(engine: Engine, model_name: str):
    """The Starlette app serving `engine` under `model_name`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    ids = itertools.count()
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["engine"] = EngineThread(engine)
        try:
            yield
        finally:  # Ctrl-C or the end of a test: the engine thread stops with the server
            state["engine"].stop()

    def error(e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    async def health(request):
        s = engine.scheduler
        return JSONResponse(
            {
                "status": "ok",
                "running": len(s.running),
                "waiting": len(s.waiting),
                "free_pages": engine.allocator.n_free,
                "compiles": engine.compiles,
                "engine_errors": state["engine"].errors,
            }
        )

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
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ApiError(400, "the request body is not valid JSON") from None
            except RecursionError:
                raise ApiError(400, "the request body is nested too deeply") from None
            c = parse_completion(body, model_name, engine.cfg.max_seq, engine.cfg.vocab)
        except ApiError as e:
            return error(e)
        rid = f"cmpl-{next(ids)}"
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        req = Request(rid, c.prompt, c.max_tokens, c.sampling)
        state["engine"].submit(req, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        created = int(time.time())

        def chunk(text, reason):
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model_name,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": reason}],
            }

        returned = {"tokens": 0}  # tokens behind the text sent (up to a stop string)
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
            """(text, finish_reason) as they come; a stop string ends the request."""
            text, sent = "", 0
            while True:
                ev = await next_event()
                if isinstance(ev, EngineError):
                    raise ApiError(500, str(ev), kind="server_error")
                if isinstance(ev, Exception):
                    raise ApiError(400, str(ev))
                text += ev.text
                returned["tokens"] += 1
                reason = ev.finish_reason
                hits = [text.find(s) for s in c.stop if s in text]
                if hits:
                    text, reason = text[: min(hits)], "stop"
                    state["engine"].abort(rid)
                # hold back a tail that could still become a stop string
                hold = 0 if reason else max((len(s) - 1 for s in c.stop), default=0)
                upto = max(sent, len(text) - hold)
                if upto > sent or reason:
                    yield text[sent:upto], reason
                    sent = upto
                if reason:
                    return

        if not c.stream:
            parts = []
            try:
                async for part in pieces():
                    parts.append(part)
            except ApiError as e:
                return error(e)
            except ClientGone:
                return Response(status_code=499)  # nobody is left to read it
            finally:  # done, failed or hung up: the slot is free either way
                state["engine"].abort(rid)
            body = chunk("".join(p for p, _ in parts), parts[-1][1])
            n = returned["tokens"]
            body["usage"] = {
                "prompt_tokens": len(c.prompt),
                "completion_tokens": n,
                "total_tokens": len(c.prompt) + n,
            }
            return JSONResponse(body)

        async def sse():
            try:
                async for piece, reason in pieces():
                    yield f"data: {json.dumps(chunk(piece, reason))}\n\n"
                yield "data: [DONE]\n\n"
            except ApiError as e:  # the status line is sent: the error goes in the stream
                yield f"data: {json.dumps(e.body())}\n\n"
            finally:  # the client went away (or we are done): free the slot either way
                state["engine"].abort(rid)

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
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
