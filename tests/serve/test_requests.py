"""The completion request's fields, checked before anything reaches the engine (no server):
every field is implemented or refused by name, and OpenAI's fields this server does not
implement pass only at the value that asks for nothing."""

import pytest

from jaxscale.serve.api import ApiError, chat_prompt, parse_chat, parse_completion


def _parse(**fields):
    return parse_completion({"model": "m", "prompt": "hi", **fields}, "m", max_seq=64)


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": None, "echo": False, "best_of": 1, "suffix": None, "seed": 3},
        {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "me"},
        {"stream_options": None, "n": 1, "stream": False},
    ],
)
def test_fields_at_their_inert_values_are_accepted(fields):
    assert _parse(**fields).prompt == list(b"hi")


@pytest.mark.parametrize(
    "fields, param, says",
    [
        ({"logprobs": 6}, "logprobs", "must be an integer in [0, 5]"),
        ({"echo": True}, "echo", "not supported"),
        ({"best_of": 2}, "best_of", "not supported"),
        ({"best_of": True}, "best_of", "not supported"),  # a bool is not the count 1
        ({"frequency_penalty": -0.5}, "frequency_penalty", "not supported"),
        ({"suffix": "}"}, "suffix", "not supported"),
        ({"functions": []}, "functions", "unrecognized"),
        ({"max_tokens": 2.5}, "max_tokens", "must be an integer"),
        ({"prompt": "\udc80"}, "prompt", "not valid Unicode"),
    ],
)
def test_other_values_are_refused_by_name(fields, param, says):
    with pytest.raises(ApiError) as e:
        _parse(**fields)
    assert e.value.status == 400 and e.value.param == param and says in str(e.value)


def test_a_request_without_a_model_is_told_so():
    with pytest.raises(ApiError) as e:
        parse_completion({"prompt": "hi"}, "m", max_seq=64)
    assert e.value.status == 400 and e.value.param == "model" and "None" not in str(e.value)


def _chat(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat(body, "m", max_seq=64)


def test_the_chat_template_as_documented():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    assert chat_prompt(messages) == (
        "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\nhello\n<|user|>\nbye\n<|assistant|>\n"
    )
    # text parts are joined; "developer" (OpenAI's newer name) is the system role
    parts = [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]
    c = _chat(messages=[{"role": "developer", "content": parts}], max_completion_tokens=5)
    assert bytes(c.prompt).decode() == "<|system|>\nbe brief\n<|assistant|>\n"
    assert c.max_tokens == 5
    assert _chat(logprobs=False, tools=[], response_format={"type": "text"}).max_tokens == 16


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "hi", "name": "a"}]}, "messages[0]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"guided_regex": "(ab"}, "guided_regex"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
        ({"prompt": "hi"}, "prompt"),  # the completions endpoint's field
        ({"max_completion_tokens": 60}, "messages"),  # the context: 26 + 60 > 64
    ],
)
def test_bad_chat_requests_name_the_field(fields, param):
    with pytest.raises(ApiError) as e:
        _chat(**fields)
    assert e.value.status == 400 and e.value.param == param, str(e.value)


def test_log_probabilities_are_asked_for_per_endpoint():
    assert _parse().logprobs is None and _parse(logprobs=0).logprobs == 0
    assert _chat().logprobs is None and _chat(logprobs=False).logprobs is None
    assert _chat(logprobs=True).logprobs == 0
    assert _chat(logprobs=True, top_logprobs=20).logprobs == 20
