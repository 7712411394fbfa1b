"""Anthropic's Messages API through the official `anthropic` SDK against a real server of a
small random model (its template has no tool format: the generic one serves tools): a reply
whole and streamed (the same text, Anthropic's event order), its usage with the prefix
cache's tokens, stop sequences, tools forced and streamed and their results sent back,
count_tokens, Claude Code's model names, and errors in Anthropic's envelope that the SDK
maps to its exceptions; litellm's `anthropic/` route."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel

from radixchat.core.store import Store
from tests.support.clients import ANTHROPIC_WEATHER as WEATHER
from tests.support.clients import RECIPE
from tests.support.randmodel import build_random_model
from tests.support.server import Server

ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
GREEDY = {"temperature": 0}  # no longer a parameter of the SDK; older clients send it, and it is read


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # imported here and in the tests that use it, not at the top: the fast tier collects this
    # module and runs none of it, and the SDK's import is ~2.7 s of each xdist worker's collection
    import anthropic

    folder = tmp_path_factory.mktemp("messages")
    model = build_random_model(folder / "plain", context=2048)
    with Store(folder / "m.db") as store:
        _, key = store.create_api_key(store.create_user("alice", "correct horse battery"), "tests")
    srv = Server(model, folder / "m.db", "--max-tokens", "64", "--no-warm-presets")
    yield srv, anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0), key
    assert "Traceback" not in srv.stop()


@pytest.mark.slow
def test_a_reply_whole_and_streamed_with_its_usage(served):
    srv, client, _ = served
    system = "You answer questions about Python lists, briefly and precisely. " * 4
    whole = client.messages.create(model="plain", max_tokens=12, system=system, messages=ASK, extra_body=GREEDY)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == "plain"
    assert whole.id.startswith("msg_") and whole.stop_reason in ("end_turn", "max_tokens")
    [block] = whole.content
    assert block.type == "text" and block.text
    again = client.messages.create(model="plain", max_tokens=12, system=system, messages=ASK, extra_body=GREEDY)
    assert again.content[0].text == block.text
    assert again.usage.cache_read_input_tokens > 0  # the prefix cache's tokens, reported apart
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == (
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    )
    with client.messages.stream(model="plain", max_tokens=12, system=system, messages=ASK, extra_body=GREEDY) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == block.text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    # the events in Anthropic's order
    body = {"model": "plain", "max_tokens": 5, "messages": ASK, "stream": True, "temperature": 0}
    headers = {"x-api-key": served[2], "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, headers=headers, timeout=60) as r:
        events = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert events[:3] == ["message_start", "ping", "content_block_start"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(events[3:-3]) == {"content_block_delta"}


@pytest.mark.slow
def test_a_stop_sequence_is_named_where_it_ended_the_reply(served):
    _, client, _ = served
    full = client.messages.create(model="plain", max_tokens=24, messages=ASK, extra_body=GREEDY).content[0].text
    stop = full[4:7]
    assert stop.strip()
    cut = client.messages.create(model="plain", max_tokens=24, messages=ASK, extra_body=GREEDY, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == full[: full.index(stop)]


@pytest.mark.slow
def test_tools_forced_streamed_and_answered(served):
    _, client, _ = served
    forced = client.messages.create(
        model="plain", max_tokens=60, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"}, extra_body=GREEDY
    )
    assert forced.stop_reason == "tool_use"
    [use] = [b for b in forced.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input["city"] in ("Paris", "Oslo") and use.id.startswith("toolu_")
    with client.messages.stream(
        model="plain",
        max_tokens=60,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    ) as s:
        final = s.get_final_message()
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert streamed.input == use.input and final.stop_reason == "tool_use"
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "snow, -3 C"}]}
    follow = [
        *ASK,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        result,
    ]
    after = client.messages.create(model="plain", max_tokens=5, messages=follow, tools=[WEATHER], extra_body=GREEDY)
    # what an agent sends back: the SDK's own blocks, as objects and as model_dump() (which
    # adds "caller": None, "toolset_name": None to a tool_use, "citations": None to text)
    for sent in (forced.content, [b.model_dump() for b in forced.content]):
        again = [*ASK, {"role": "assistant", "content": sent}, result]
        echo = client.messages.create(model="plain", max_tokens=5, messages=again, tools=[WEATHER], extra_body=GREEDY)
        assert echo.content == after.content and echo.usage.input_tokens + echo.usage.cache_read_input_tokens == (
            after.usage.input_tokens + after.usage.cache_read_input_tokens
        )
    assert after.usage.input_tokens + after.usage.cache_read_input_tokens > forced.usage.input_tokens
    counted = client.messages.count_tokens(model="plain", messages=follow, tools=[WEATHER])
    assert counted.input_tokens == after.usage.input_tokens + after.usage.cache_read_input_tokens


class Dish(BaseModel):  # no free text: a random model's string could run past max_tokens
    vegan: bool
    course: Literal["starter", "main", "dessert"]


@pytest.mark.slow
def test_structured_output_through_output_config(served):
    """output_config.format (what langchain-anthropic's json_schema method sends) takes the
    grammar path of chat completions' response_format: even a random model's reply parses."""
    import anthropic

    _, client, _ = served
    fmt = {"format": {"type": "json_schema", "schema": RECIPE}}
    whole = client.messages.create(model="plain", max_tokens=60, messages=ASK, output_config=fmt, extra_body=GREEDY)
    value = json.loads(whole.content[0].text)
    assert whole.stop_reason == "end_turn" and set(value) == {"name", "vegan", "course"}, whole
    assert value["course"] in ("starter", "main", "dessert") and len(value["name"]) <= 12
    with client.messages.stream(model="plain", max_tokens=60, messages=ASK, output_config=fmt, extra_body=GREEDY) as s:
        assert json.loads("".join(s.text_stream)) == value
    parsed = client.messages.parse(model="plain", max_tokens=60, messages=ASK, output_format=Dish, extra_body=GREEDY)
    assert isinstance(parsed.parsed_output, Dish), parsed
    with pytest.raises(anthropic.BadRequestError, match="forced tool call"):
        client.messages.create(
            model="plain", max_tokens=9, messages=ASK, output_config=fmt, tools=[WEATHER], tool_choice={"type": "any"}
        )


def _use(extra: dict) -> dict:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "n", "input": {}, **extra}]}


def _result() -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}


@pytest.mark.slow
def test_claude_codes_model_names_and_errors_in_anthropics_envelope(served):
    import anthropic

    srv, client, key = served
    claude = client.messages.create(model="claude-sonnet-4-5", max_tokens=3, messages=ASK, extra_body=GREEDY)
    assert claude.model == "plain"  # an unknown claude-* name: the first model
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="gpt-9", max_tokens=3, messages=ASK)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=srv.url, api_key="sk-wrong", max_retries=0).messages.create(
            model="plain", max_tokens=3, messages=ASK
        )
    with pytest.raises(anthropic.BadRequestError, match="maximum context length"):
        client.messages.create(model="plain", max_tokens=3, messages=[{"role": "user", "content": "lists " * 4000}])
    headers = {"x-api-key": key, "content-type": "application/json"}
    for body, words in [
        ({"model": "plain", "messages": ASK}, "max_tokens"),
        ({"model": "plain", "max_tokens": 3, "messages": [{"role": "assistant", "content": "I"}]}, "last message"),
        (
            {"model": "plain", "max_tokens": 3, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "image",
        ),
        ({"model": "plain", "max_tokens": 3, "messages": ASK, "thinking": {"type": "enabled"}}, "thinking"),
        ({"model": "plain", "max_tokens": 3, "messages": [{"role": "user", "content": []}]}, "at least one block"),
        ({"model": "plain", "max_tokens": 3, "messages": ASK, "output_config": {"effort": "low"}}, "output_config"),
        # a refused key on a block is named where it is, not as "content: not a string"
        (
            {"model": "plain", "max_tokens": 3, "messages": [*ASK, _use({"bogus": 1}), _result()]},
            "messages.1.content.0.bogus: Extra inputs",
        ),
        (
            {
                "model": "plain",
                "max_tokens": 3,
                "messages": [*ASK, _use({"caller": {"type": "code_execution"}}), _result()],
            },
            "messages.1.content.0.caller.type",
        ),
        ({"model": "plain", "max_tokens": "3", "messages": ASK}, "max_tokens: Input should be a valid integer"),
    ]:
        r = httpx.post(srv.url + "/v1/messages", content=json.dumps(body), headers=headers, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        assert words in err["error"]["message"], err
    # ignored, as documented: cache_control, metadata
    ok = client.messages.create(
        model="plain",
        max_tokens=3,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=ASK,
        metadata={"user_id": "u1"},
        cache_control={"type": "ephemeral"},
        speed="fast",
        extra_body=GREEDY,  # sampled, a random model may end at its first token with no text
    )
    assert ok.content


@pytest.mark.slow
def test_a_prefilled_answer_is_gone_on_from(served):
    """An assistant message last is the start of the answer (Anthropic's prefill): the prompt
    holds its tokens, with no end of turn, and the reply is only what follows it."""
    srv, client, key = served
    prefill = [*ASK, {"role": "assistant", "content": "The weather in Oslo is"}]
    plain = client.messages.count_tokens(model="plain", messages=ASK).input_tokens
    started = client.messages.count_tokens(model="plain", messages=prefill).input_tokens
    # the generation prompt, then the prefill's own tokens: one at least for each of its five words
    assert started - plain >= 5, (plain, started)
    going_on = client.messages.create(model="plain", max_tokens=6, messages=prefill, extra_body=GREEDY)
    assert going_on.stop_reason in ("end_turn", "max_tokens") and going_on.usage.output_tokens > 0
    assert going_on.usage.input_tokens + going_on.usage.cache_read_input_tokens == started
    # the same prefill again finds the question and the prefill in the cache, and says the same
    again = client.messages.create(model="plain", max_tokens=6, messages=prefill, extra_body=GREEDY)
    assert again.content == going_on.content and again.usage.cache_read_input_tokens > plain // 2
    headers = {"x-api-key": key, "content-type": "application/json"}
    for body, words in [
        ({"messages": [*ASK, {"role": "assistant", "content": "It is "}]}, "trailing whitespace"),
        (
            {"messages": [*ASK, _use({}), _result(), _use({})]},
            "text an answer starts with",
        ),
        (
            {"messages": prefill, "output_config": {"format": {"type": "json_schema", "schema": RECIPE}}},
            "prefilled answer",
        ),
    ]:
        body = {"model": "plain", "max_tokens": 3, **body}
        r = httpx.post(srv.url + "/v1/messages", content=json.dumps(body), headers=headers, timeout=30)
        assert r.status_code == 400, r.text
        assert words in r.json()["error"]["message"], r.json()


@pytest.mark.slow
def test_litellms_anthropic_route(served, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list at import
    import litellm

    srv, client, key = served
    route = {"model": "anthropic/plain", "api_base": srv.url, "api_key": key, "max_tokens": 12, "temperature": 0}
    sdk = client.messages.create(model="plain", max_tokens=12, messages=ASK, extra_body=GREEDY).content[0].text
    whole = litellm.completion(messages=ASK, **route)
    assert whole.choices[0].message.content == sdk and whole.usage.completion_tokens > 0
    streamed = litellm.completion(messages=ASK, stream=True, **route)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == sdk
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=[{"role": "user", "content": "lists " * 4000}], **route)


@pytest.mark.slow
def test_a_forced_call_cut_short_is_no_text(served):
    """A call the request forced, cut by max_tokens before it closed, comes back as nothing
    with stop_reason max_tokens, not as the call's raw markup in a text block."""
    _, client, _ = served
    ask = dict(model="plain", max_tokens=4, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"})
    cut = client.messages.create(**ask, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.content == [] and cut.usage.output_tokens == 4
    with client.messages.stream(**ask, extra_body=GREEDY) as s:
        streamed = s.get_final_message()
    assert streamed.stop_reason == "max_tokens" and streamed.content == []
