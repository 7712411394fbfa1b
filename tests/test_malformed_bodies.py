"""Malformed bodies get a 400 that says what is wrong, on every API: a value of the wrong JSON
type is refused naming its field, never coerced (`max_tokens: true` ran as a one-token reply
and `stream: "yes"` streamed); an empty body says so (it was "missing required field: None");
a lone surrogate on the Messages API is refused by where it is (it reached the tokenizer); a
Responses format or content part that is not an object is a 400 (it was a 500)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from radixchat.core.config import Settings
from radixchat.webui.server import build_app
from tests.support.fake_engine import FakeEngine

CHAT = ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}]})
MESSAGES = ("/v1/messages", {"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
RESPONSES = ("/v1/responses", {"model": "default", "input": "hi"})
COMPLETIONS = ("/v1/completions", {"model": "default", "prompt": "hi"})


def post_all(bodies: list[tuple[str, dict | bytes]]) -> list[httpx.Response]:
    app = build_app(FakeEngine(), Settings(no_auth=True), None)
    kind = {"content-type": "application/json"}

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return [
                await (c.post(path, content=body, headers=kind) if isinstance(body, bytes) else c.post(path, json=body))
                for path, body in bodies
            ]

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("api", "field", "value"),
    [
        (CHAT, "max_tokens", True),
        (CHAT, "stream", "yes"),
        (CHAT, "n", "2"),
        (CHAT, "temperature", "0.5"),
        (CHAT, "max_tokens", 5.5),
        (COMPLETIONS, "stream", 1),
        (MESSAGES, "max_tokens", "8"),
        (MESSAGES, "stream", "true"),
        (RESPONSES, "max_output_tokens", True),
        (RESPONSES, "stream", 0),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_its_field(api, field, value):
    path, good = api
    ok, bad = post_all([(path, good), (path, {**good, field: value})])
    assert ok.status_code == 200, ok.text
    assert bad.status_code == 400, bad.text
    assert field in bad.json()["error"]["message"]


def test_the_right_types_still_pass_an_integer_for_a_float_included():
    path, good = CHAT
    answers = post_all([(path, {**good, "temperature": 1, "top_p": 1, "max_tokens": 4, "stream": False, "n": 1})])
    assert [a.status_code for a in answers] == [200]


def message_of(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


@pytest.mark.parametrize("api", [CHAT, MESSAGES, RESPONSES, COMPLETIONS])
def test_an_empty_body_is_called_empty(api):
    (r,) = post_all([(api[0], b"")])
    assert r.status_code == 400 and message_of(r) == "the request body is empty: send a JSON object"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_lone_surrogate_on_the_messages_api_is_refused_where_it_is(path):
    body = b'{"model": "default", "max_tokens": 4, "system": "ok", "messages": [{"role": "user", "content": [{"type": "text", "text": "a\\ud800"}]}]}'
    (r,) = post_all([(path, body)])
    assert r.status_code == 400
    assert message_of(r).startswith("messages.0.content.0.text: text must be valid Unicode")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"text": {"format": "json"}}, "text.format"),
        ({"text": "json"}, "text"),
        ({"input": [{"role": "user", "content": ["x"]}]}, "input"),
        ({"input": [{"role": "user", "content": [3]}]}, "input"),
    ],
)
def test_a_responses_format_or_part_that_is_not_an_object_is_a_400(change, field):
    """A string where the Responses API takes an object (a format, a content part) was read as
    one: the route answered 500."""
    (r,) = post_all([(RESPONSES[0], {**RESPONSES[1], **change})])
    assert r.status_code == 400, r.text
    assert message_of(r).startswith(field)


@pytest.mark.parametrize(
    ("api", "change", "param"),
    [
        (RESPONSES, {"text": {"format": "json"}}, "text.format"),
        (RESPONSES, {"input": [{"role": "user", "content": [3]}]}, "input"),
        (RESPONSES, {"colour": "red"}, "colour"),
        (RESPONSES, {"reasoning": {"effort": "high"}}, "reasoning"),
        (RESPONSES, {"tools": [{"type": "web_search"}]}, "tools.0"),
        (CHAT, {"frobnicate": 1}, "frobnicate"),
        (CHAT, {"tool_choice": "required"}, "tool_choice"),
        (COMPLETIONS, {"best_of": 3}, "best_of"),
    ],
)
def test_a_refusal_names_its_field_as_param(api, change, param):
    """A refusal names the field it is about in `param`, as OpenAI's do (SDKs and agents read
    it): the whole-body checks (unknown or unimplemented fields, a Responses format or input
    checked by its route) answered `param: null`, naming the field only in the message."""
    path, good = api
    (r,) = post_all([(path, {**good, **change})])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "invalid_value", err
    assert err["message"].startswith(f"{param}: "), err
