"""Tool calling: the template families' formats parsed, a forced call through the API on a
random model whose template teaches the Hermes format (the grammar makes even random
weights call correctly), the round trip with the tool's answer, and the generic format on a
model whose template has none (its prompt, calls forced and named, the round trip)."""

from __future__ import annotations

import json

import httpx
import pytest

from radixchat.core.seam import tools as formats
from tests.support.clients import GOOD, client
from tests.support.server import Server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "days"],
            "properties": {
                "city": {"enum": ["Paris", "Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["zone"],
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
        },
    },
}


@pytest.mark.parametrize(
    "fam, text, content, calls",
    [
        (
            "hermes",
            'Let me look.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
            "Let me look.",
            [("get_time", {"zone": "UTC"})],
        ),
        (
            "hermes",
            '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call><tool_call>{"name": "b", "arguments": '
            '{"x": 1}}</tool_call>',
            "",
            [("a", {}), ("b", {"x": 1})],
        ),
        ("hermes", "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
        (
            "llama3",
            '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}',
            "",
            [("get_time", {"zone": "CET"})],
        ),
        ("llama3", "It is sunny.", "It is sunny.", []),
        (
            "mistral",
            '[TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": "UTC"}}]',
            "",
            [("get_time", {"zone": "UTC"})],
        ),
    ],
)
def test_each_family_parses_its_calls(fam, text, content, calls):
    got_content, got = formats.parse(fam, text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in got)


def test_families_are_read_off_the_templates():
    from tests.support.randmodel import TEMPLATE, TOOL_TEMPLATE

    assert formats.family(TOOL_TEMPLATE) == "hermes" and formats.family(TEMPLATE) is None
    assert formats.family("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]") == "mistral"
    assert formats.family("{% if tools %}<|python_tag|>{% endif %}<|eot_id|>") == "llama3"


def test_streaming_holds_back_what_may_become_a_call():
    s = formats.held_back
    assert s("hermes", "Hello <tool") == len("Hello ")
    assert s("hermes", "Hello <b>") == len("Hello <b>")
    assert s("hermes", "Hi <tool_call>{") == len("Hi ")
    assert s("llama3", "  {") == 0 and s("llama3", "Sure") == 4


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    from tests.support.randmodel import TOOL_TEMPLATE, build_random_model

    model = build_random_model(tmp_path_factory.mktemp("tools") / "m", template=TOOL_TEMPLATE, context=2048)
    srv = Server(model, tmp_path_factory.mktemp("tools-db") / "t.db", "--no-auth", "--max-tokens", "120")
    yield srv
    assert "Traceback" not in srv.stop()


def ask_weather(c, msgs, **extra):
    """The two tools, get_weather named, greedy."""
    return c.chat.completions.create(
        model="default",
        messages=msgs,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        **extra,
    )


def check_weather(call) -> dict:
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "days"} and args["city"] in ("Paris", "Oslo", "Lima") and 1 <= args["days"] <= 7
    return args


@pytest.mark.slow
def test_a_required_call_round_trip_through_the_official_client(tool_server):
    c = client(tool_server, "none")
    msgs = [{"role": "user", "content": "What is the weather in Oslo for three days?"}]
    out = ask_weather(c, msgs)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_weather(choice.message.tool_calls[0])
    # the same streamed: no text, one tool_calls delta, the same call
    chunks = list(ask_weather(c, msgs, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert not "".join(d.content or "" for d in deltas)
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [json.loads(tc.function.arguments) for tc in streamed] == [
        json.loads(choice.message.tool_calls[0].function.arguments)
    ]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    # "required" with two tools: one of them, valid either way
    req = (
        c.chat.completions.create(
            model="default", messages=msgs, tools=[WEATHER, TIME], tool_choice="required", temperature=1.0, seed=3
        )
        .choices[0]
        .message.tool_calls[0]
    )
    assert req.function.name in ("get_weather", "get_time") and json.loads(req.function.arguments)
    # the round trip: the call and the tool's answer go back into the conversation
    call = choice.message.tool_calls[0]
    follow = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "snow"}'},
    ]
    after = c.chat.completions.create(
        model="default", messages=follow, tools=[WEATHER, TIME], max_tokens=5, temperature=0
    )
    assert after.usage.prompt_tokens > out.usage.prompt_tokens + 10
    # as an agent sends it back: the SDK's whole dump of the reply (its "function_call": null
    # was refused, a 400 for every later turn)
    dumped = msgs + [choice.message.model_dump(), follow[-1]]
    again = c.chat.completions.create(
        model="default", messages=dumped, tools=[WEATHER, TIME], max_tokens=5, temperature=0
    )
    assert again.usage.prompt_tokens == after.usage.prompt_tokens


def _responses_tool(tool: dict) -> dict:
    """A chat completions tool in the Responses API's flat shape."""
    return {"type": "function", **tool["function"]}


@pytest.mark.slow
def test_responses_function_calls_whole_streamed_and_sent_back(tool_server):
    c = client(tool_server, "none")
    tools = [_responses_tool(WEATHER), _responses_tool(TIME)]
    ask = "What is the weather in Oslo for three days?"
    named = {"type": "function", "name": "get_weather"}
    out = c.responses.create(model="default", input=ask, tools=tools, tool_choice=named, temperature=0)
    [item] = out.output  # calls only: no message item
    assert out.status == "completed" and item.type == "function_call" and item.name == "get_weather", out
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    args = json.loads(item.arguments)
    assert set(args) == {"city", "days"} and args["city"] in ("Paris", "Oslo", "Lima")
    # streamed: the SDK's events, the same call
    with c.responses.stream(model="default", input=ask, tools=tools, tool_choice=named, temperature=0) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in kinds and "response.output_text.delta" not in kinds, kinds
    [streamed] = final.output
    assert json.loads(streamed.arguments) == args and streamed.name == "get_weather"
    # "required": one of the two
    req = c.responses.create(
        model="default", input=ask, tools=tools, tool_choice="required", temperature=1.0, extra_body={"seed": 3}
    )
    assert req.output[0].name in ("get_weather", "get_time") and json.loads(req.output[0].arguments)
    # the round trip as an agent sends it: the output items back, then the function's output
    follow = [
        {"role": "user", "content": ask},
        *[i.model_dump() for i in out.output],
        {"type": "function_call_output", "call_id": item.call_id, "output": '{"forecast": "snow"}'},
    ]
    after = c.responses.create(model="default", input=follow, tools=tools, max_output_tokens=5, temperature=0)
    assert after.usage.input_tokens > out.usage.input_tokens + 10
    assert after.status == ("incomplete" if after.usage.output_tokens == 5 else "completed")
    chat = c.chat.completions.create(  # the same conversation through chat completions: the same prompt
        model="default",
        messages=[
            {"role": "user", "content": ask},
            {"role": "assistant", "content": None, "tool_calls": [_as_chat_call(item)]},
            {"role": "tool", "tool_call_id": item.call_id, "content": '{"forecast": "snow"}'},
        ],
        tools=[WEATHER, TIME],
        max_tokens=5,
        temperature=0,
    )
    assert chat.usage.prompt_tokens == after.usage.input_tokens


def _as_chat_call(item) -> dict:
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}


@pytest.mark.slow
def test_a_model_without_a_tool_format_calls_tools_in_the_generic_one(tmp_path):
    from tests.support.randmodel import TEMPLATE, build_random_model

    model = build_random_model(tmp_path / "plain", template=TEMPLATE, context=2048)  # room for the tools
    srv = Server(model, tmp_path / "x.db", "--no-auth", "--max-tokens", "120")
    try:
        c = client(srv, "none")
        msgs = [{"role": "user", "content": "What is the weather in Oslo for three days?"}]
        forced = c.chat.completions.create(
            model="default", messages=msgs, tools=[WEATHER, TIME], tool_choice="required", temperature=0
        )
        choice = forced.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        assert call.function.name in ("get_weather", "get_time") and json.loads(call.function.arguments)
        named = ask_weather(c, msgs)
        check_weather(named.choices[0].message.tool_calls[0])
        # the tools are described in the system message: a longer prompt than without them
        plain = c.chat.completions.create(model="default", messages=msgs, max_tokens=1, temperature=0)
        assert forced.usage.prompt_tokens > plain.usage.prompt_tokens + 50
        # the round trip: the call and its result go back as turns the template can render
        follow = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "snow"}'},
        ]
        after = c.chat.completions.create(
            model="default", messages=follow, tools=[WEATHER, TIME], max_tokens=5, temperature=0
        )
        assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert after.usage.prompt_tokens > forced.usage.prompt_tokens + 10
        # tool_choice "none" keeps the tools away from the model
        r = httpx.post(
            srv.url + "/v1/chat/completions", json={**GOOD, "tools": [WEATHER], "tool_choice": "none"}, timeout=30
        )
        assert r.status_code == 200, r.text
    finally:
        assert "Traceback" not in srv.stop()


def test_the_generic_format_rewrites_calls_and_results_for_a_plain_template():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}
    out = formats.generic_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        ],
        [TIME],
    )
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n" + formats.GENERIC_HOW) and "- get_time" in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"name": "get_time", "arguments": {"zone": "UTC"}}
    assert out[3]["content"] == "Result of get_time: 12:00"
    assert all(set(m) == {"role", "content"} for m in out)
    assert formats.generic_messages([{"role": "user", "content": "hi"}], [TIME])[0]["role"] == "system"
    as_object = {**call, "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}  # as the API passes it
    again = formats.generic_messages([{"role": "assistant", "content": "", "tool_calls": [as_object]}], None)
    assert json.loads(again[0]["content"]) == {"name": "get_time", "arguments": {"zone": "UTC"}}
    fenced = '```json\n{"name": "get_time", "arguments": {"zone": "CET"}}\n```'
    assert formats.parse("generic", fenced)[1][0]["function"]["name"] == "get_time"
    assert formats.parse("generic", "It is noon.") == ("It is noon.", [])
    assert formats.held_back("generic", " {") == 0 and formats.held_back("generic", "It") == 2


@pytest.mark.slow
def test_a_required_call_cut_short_is_no_content(tool_server):
    """A forced call cut by max_tokens: finish_reason length, and neither content nor a call
    (the call's raw markup is not the answer)."""
    c = client(tool_server, "none")
    msgs = [{"role": "user", "content": "What is the weather in Oslo for three days?"}]
    whole = ask_weather(c, msgs, max_tokens=4).choices[0]
    assert whole.finish_reason == "length" and whole.message.content is None and not whole.message.tool_calls
    chunks = list(ask_weather(c, msgs, max_tokens=4, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    calls = [ch for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls]
    assert text == "" and calls == [] and chunks[-1].choices[0].finish_reason == "length"
