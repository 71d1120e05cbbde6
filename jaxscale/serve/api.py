"""The OpenAI request bodies `jaxscale serve` takes, checked before anything reaches the engine:
`/v1/completions` (a prompt) and `/v1/chat/completions` (messages, through `CHAT_TEMPLATE`).
Every field is implemented or refused by name (`ApiError`: an OpenAI-style 4xx), never silently
ignored; OpenAI's fields the engine does not implement pass only at the value that asks for
nothing.

The chat template of the byte-level model: each message as `<|role|>` on a line of its own,
then its content and a newline; the prompt ends with `<|assistant|>` and a newline, where the
answer starts. The template's markers are plain bytes: a model trained on such transcripts
learns them, one trained on anything else treats them as text.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from jaxscale.serve.engine import TOP_LOGPROBS
from jaxscale.serve.sampling import SamplingParams


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
    constraint: object = None  # a grammar every generated token obeys (serve/constrained.py)
    logprobs: int | None = None  # None: none; n: each token's and the n most likely tokens'


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


# The fields both endpoints implement; "user" is the client's own label (kept in no log,
# changes nothing). Any other field is refused by name -- except OpenAI's fields that are not
# implemented here, sent at the value that asks for nothing.
COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n")
COMMON += ("stream", "user", "response_format", "guided_regex")
IMPLEMENTED = {
    "completion": frozenset((*COMMON, "prompt", "logprobs")),
    "chat": frozenset((*COMMON, "messages", "max_completion_tokens", "logprobs", "top_logprobs")),
}
_INERT = {  # value(s) besides null that ask for nothing
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "stream_options": (),
}
INERT = {
    "completion": {**_INERT, "echo": (False,), "best_of": (1,), "suffix": ("",)},
    "chat": {
        **_INERT,
        "tools": ([],),
        "tool_choice": ("none",),
    },
}
CHAT_ROLES = ("system", "developer", "user", "assistant")  # developer: OpenAI's newer system


def _unsupported(body: dict, form: str) -> None:
    """ApiError naming the first field this server does not implement."""
    for name, value in body.items():
        if name in IMPLEMENTED[form]:
            continue
        inert_values = INERT[form].get(name)
        if inert_values is None:
            raise ApiError(400, f"unrecognized request argument supplied: {name!r}", name)
        inert = value is None or any(
            value == v and isinstance(value, bool) == isinstance(v, bool) for v in inert_values
        )
        if not inert:
            raise ApiError(400, f"{name!r} is not supported by this server", name)


def _checked(body, form: str, model_name: str) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _unsupported(body, form)
    if body.get("model") is None:
        raise ApiError(400, "you must provide a model parameter ('model')", "model")
    if body.get("model") != model_name:
        raise ApiError(
            404,
            f"the model {body.get('model')!r} does not exist; this server has {model_name!r}",
            "model",
            "model_not_found",
        )
    return body


def _utf8(text: str, param: str) -> list[int]:
    try:
        return list(text.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate ("\ud800") has no UTF-8 bytes
        raise ApiError(
            400, f"'{param}' is not valid Unicode text: {e.reason} at {e.start}", param
        ) from None


def parse_completion(body, model_name: str, max_seq: int, vocab: int = 256) -> Completion:
    """A /v1/completions body, checked; ApiError names the first thing wrong. Tokens are bytes;
    a model trained with a smaller vocabulary refuses the bytes it has no embedding for."""
    body = _checked(body, "completion", model_name)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = _utf8(prompt, "prompt")
    elif (
        isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < 256 for t in prompt)
    ):
        ids = prompt
    else:
        raise ApiError(400, "'prompt' must be a non-empty string (or a list of byte ids)", "prompt")
    return _completion(body, ids, body.get("max_tokens"), max_seq, vocab, "prompt")


def chat_prompt(messages: list[dict]) -> str:
    """`CHAT_TEMPLATE` (the module's docstring) applied to checked messages."""
    turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return turns + "<|assistant|>\n"


def parse_chat(body, model_name: str, max_seq: int, vocab: int = 256) -> Completion:
    """A /v1/chat/completions body, checked, its messages through the chat template."""
    body = _checked(body, "chat", model_name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages", "messages")
    plain = [_message(m, i) for i, m in enumerate(messages)]
    ids = _utf8(chat_prompt(plain), "messages")
    limit = body.get("max_completion_tokens")
    if limit is not None and body.get("max_tokens") not in (None, limit):
        raise ApiError(
            400, "'max_tokens' and 'max_completion_tokens' disagree", "max_completion_tokens"
        )
    limit = body.get("max_tokens") if limit is None else limit
    return _completion(body, ids, limit, max_seq, vocab, "messages", "max_completion_tokens")


def _message(m, i: int) -> dict:
    """One message as {role, content: str}; content parts of type text are joined."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
        raise ApiError(400, f"{where} must have a 'role' in {', '.join(CHAT_ROLES)}", where)
    extra = sorted(set(m) - {"role", "content"})
    if extra:
        raise ApiError(400, f"{where}: {extra[0]!r} is not supported by this server", where)
    content = m.get("content")
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ApiError(
            400, f"{where}.content must be a string or a list of text parts", f"{where}.content"
        )
    return {"role": "system" if m["role"] == "developer" else m["role"], "content": content}


def _completion(
    body, ids, max_tokens, max_seq, vocab, what: str, limit_name: str = "max_tokens"
) -> Completion:
    """The checks and settings both endpoints share: ids against the vocabulary and context,
    the token limit, stop strings, n, stream and sampling."""
    if not ids:
        raise ApiError(400, f"'{what}' must not be empty", what)
    if max(ids) >= vocab:
        raise ApiError(
            400,
            f"this model's vocabulary is bytes 0..{vocab - 1}; the {what} has byte {max(ids)}",
            what,
        )
    # OpenAI's default of 16 new tokens, cut to the context the prompt leaves
    default = max(1, min(16, max_seq - len(ids)))
    max_tokens = _number({limit_name: max_tokens}, limit_name, default, int, 1, max_seq)
    if len(ids) + max_tokens > max_seq:
        raise ApiError(
            400,
            f"this model's context is {max_seq} tokens; the {what} has {len(ids)} "
            f"and {limit_name} asks for {max_tokens}",
            what,
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
    return Completion(
        ids, max_tokens, sampling, tuple(stop), bool(stream), _constraint(body), _logprobs(body)
    )


def _logprobs(body: dict) -> int | None:
    """How many top log-probabilities per token the request asks for (None: none): the legacy
    endpoint's `logprobs` (0..5), or chat's `logprobs` true with `top_logprobs` (0..20)."""
    if "messages" not in body:
        return _number(body, "logprobs", None, int, 0, 5)
    on = body.get("logprobs")
    if on not in (None, True, False):
        raise ApiError(400, f"'logprobs' must be true or false, got {on!r}", "logprobs")
    top = _number(body, "top_logprobs", None, int, 0, TOP_LOGPROBS)
    if top is not None and not on:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if on else None


def _token(t: int) -> str:
    """A byte token as text: itself when printable ASCII, else vLLM's `bytes:\\xNN` form."""
    return chr(t) if 32 <= t < 127 else f"bytes:\\x{t:02x}"


def logprobs(tokens: list, n: int, chat: bool) -> dict:
    """OpenAI's `logprobs` object for `tokens` [(Event, text offset)]: the chat form
    (`content`: token, logprob, bytes, top_logprobs) or the legacy one (tokens, token_logprobs,
    top_logprobs as {token: logprob}, text_offset)."""
    if chat:
        return {
            "content": [
                {
                    "token": _token(ev.token),
                    "logprob": ev.logprob,
                    "bytes": [ev.token],
                    "top_logprobs": [
                        {"token": _token(t), "logprob": lp, "bytes": [t]} for t, lp in ev.top[:n]
                    ],
                }
                for ev, _ in tokens
            ]
        }
    return {
        "tokens": [_token(ev.token) for ev, _ in tokens],
        "token_logprobs": [ev.logprob for ev, _ in tokens],
        "top_logprobs": [{_token(t): lp for t, lp in ev.top[:n]} for ev, _ in tokens],
        "text_offset": [offset for _, offset in tokens],
    }


FORMATS = (
    '{"type": "text"}, {"type": "json_object"} or '
    '{"type": "json_schema", "json_schema": {"schema": {...}}}'
)


def _constraint(body: dict):
    """The structured output a request asks for, as a grammar: OpenAI's `response_format`
    (`json_object`: compact JSON; `json_schema`: JSON valid under `json_schema.schema`, through
    outlines-core) or vLLM's `guided_regex` (a full match). None for plain text."""
    from jaxscale.serve import constrained

    fmt, regex = body.get("response_format"), body.get("guided_regex")
    fmt = None if fmt in (None, {"type": "text"}) else fmt
    if fmt is not None and regex is not None:
        raise ApiError(400, "give 'response_format' or 'guided_regex', not both", "guided_regex")
    if regex is not None:
        if not isinstance(regex, str):
            raise ApiError(400, "'guided_regex' must be a string", "guided_regex")
        try:
            return constrained.RegexConstraint(regex)
        except ValueError as e:
            raise ApiError(400, f"'guided_regex': {e}", "guided_regex") from None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return constrained.JsonConstraint()
    spec = fmt.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise ApiError(400, f"'response_format' must be {FORMATS}", "response_format")
    try:
        return constrained.SchemaConstraint(spec["schema"])
    except ImportError:
        raise ApiError(
            400,
            "json_schema outputs need outlines-core on the server: pip install -e '.[grammar]'",
            "response_format",
        ) from None
    except Exception as e:  # noqa: BLE001 - outlines-core's compiler names what it cannot do
        where = "'response_format.json_schema.schema'"
        raise ApiError(400, f"{where}: {e}", "response_format") from None
