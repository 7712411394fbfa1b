"""LangChain's `ChatAnthropic` against a real server of a small random model, speaking
/v1/messages through the `anthropic` SDK underneath: a reply invoked (its usage metadata) and
streamed (the same greedy text), a tool bound and forced on a model whose template has no
tool format (the generic one serves it; the call's args come back parsed), structured output by
`with_structured_output(method="json_schema")`, what LangChain
sends with its defaults (nothing refused), and a bad key raised as the SDK's exception."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.clients import ANTHROPIC_WEATHER as WEATHER
from tests.support.randmodel import build_random_model
from tests.support.server import Server

if TYPE_CHECKING:  # the SDKs are imported by the tests that use them: the fast tier collects
    # this module and runs none of it, and their import is ~4 s of each xdist worker's collection
    from langchain_anthropic import ChatAnthropic

ASK = "What is the weather in Oslo?"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("langchain")
    model = build_random_model(folder / "plain", context=2048)
    with Store(folder / "lc.db") as store:
        _, key = store.create_api_key(store.create_user("alice", "correct horse battery"), "tests")
    srv = Server(model, folder / "lc.db", "--max-tokens", "64", "--no-warm-presets")
    yield srv, key
    assert "Traceback" not in srv.stop()


def chat(srv, key, **kw) -> ChatAnthropic:
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(base_url=srv.url, api_key=key, model="plain", max_retries=0, **kw)


@pytest.mark.slow
def test_invoke_and_stream_give_the_same_greedy_text_with_usage(served):
    srv, key = served
    llm = chat(srv, key, max_tokens=12, temperature=0)
    whole = llm.invoke(ASK)
    assert isinstance(whole.content, str) and whole.content
    usage = whole.usage_metadata
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert whole.response_metadata["model"] == "plain"
    assert whole.response_metadata["stop_reason"] in ("end_turn", "max_tokens")
    chunks = list(llm.stream(ASK))
    assert len(chunks) > 1  # streamed, not one reply at the end
    assert "".join(c.text for c in chunks) == whole.content
    joined = chunks[0]
    for c in chunks[1:]:
        joined += c
    assert joined.usage_metadata["output_tokens"] == usage["output_tokens"]


@pytest.mark.slow
def test_what_langchain_sends_by_default_is_accepted(served, monkeypatch):
    """No max_tokens, temperature or anything else set: LangChain fills its own max_tokens
    (its fallback for a model it has no profile of, far above this model's context) and a
    newer anthropic-version header, and neither is refused."""
    srv, key = served
    sent: list[dict] = []

    def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    llm = chat(srv, key)
    # LangChain shares one cached httpx client per base_url: hooked for this test only
    monkeypatch.setattr(llm._client._client, "event_hooks", {"request": [record], "response": []})
    # sampled with the model's defaults: the reply may be empty (a first token that ends it),
    # but it is answered, and counted
    reply = llm.invoke(ASK)
    assert reply.response_metadata["stop_reason"] in ("end_turn", "max_tokens")
    assert reply.usage_metadata["output_tokens"] >= 1
    streamed = list(llm.stream(ASK))
    assert sum(c.usage_metadata["output_tokens"] for c in streamed if c.usage_metadata) >= 1
    assert [b["model"] for b in sent] == ["plain", "plain"] and sent[1]["stream"] is True
    assert all(b["max_tokens"] > 2048 for b in sent)  # more than the context: the reply ends at it


@pytest.mark.slow
def test_bind_tools_forced_gives_a_call_with_parsed_args(served):
    srv, key = served
    llm = chat(srv, key, max_tokens=60, temperature=0)
    for choice in ("get_weather", "any"):
        reply = llm.bind_tools([WEATHER], tool_choice=choice).invoke(ASK)
        [call] = reply.tool_calls
        assert call["name"] == "get_weather" and isinstance(call["args"], dict)
        assert call["args"]["city"] in ("Paris", "Oslo") and call["id"].startswith("toolu_")
        assert reply.response_metadata["stop_reason"] == "tool_use"
    # streamed, the input_json_delta pieces join into the same call
    joined = None
    for c in llm.bind_tools([WEATHER], tool_choice="get_weather").stream(ASK):
        joined = c if joined is None else joined + c
    assert [t["args"] for t in joined.tool_calls] == [call["args"]]


@pytest.mark.slow
def test_with_structured_output_json_schema_gives_a_parsed_dict(served):
    # langchain-anthropic's json_schema method sends output_config.format; the SDK's
    # transform_schema moves maxLength into a description, so no free text here, where a
    # random model's string would run past max_tokens
    srv, key = served
    dish = {
        "title": "dish",
        "description": "A dish",
        "type": "object",
        "additionalProperties": False,
        "required": ["vegan", "course"],
        "properties": {"vegan": {"type": "boolean"}, "course": {"enum": ["starter", "main", "dessert"]}},
    }
    llm = chat(srv, key, max_tokens=60, temperature=0).with_structured_output(dish, method="json_schema")
    value = llm.invoke("A recipe?")
    assert set(value) == {"vegan", "course"} and value["course"] in ("starter", "main", "dessert"), value


@pytest.mark.slow
def test_a_bad_key_raises_the_sdks_authentication_error(served):
    import anthropic
    from langchain_anthropic import ChatAnthropic

    srv, _ = served
    with pytest.raises(anthropic.AuthenticationError):
        chat(srv, "sk-wrong", max_tokens=3).invoke(ASK)
    with pytest.raises(anthropic.NotFoundError):
        ChatAnthropic(base_url=srv.url, api_key=served[1], model="gpt-9", max_retries=0, max_tokens=3).invoke(ASK)
