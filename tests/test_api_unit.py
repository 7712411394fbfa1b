"""The web layer's API on FakeEngine, in-process: no server process, no model, no MLX.

The routers run on an app built here (or by build_app, without the page) and are driven
through Starlette's TestClient or httpx's ASGITransport: request-shape refusals, keys,
unknown paths, replies whole and streamed from the fake's reply, the counts /health and
/metrics read from the fake's stats, and the generation core's cancelling of what a client
no longer waits for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sqlite3
from pathlib import Path

import httpx
import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from radixchat.core.config import Settings
from radixchat.core.seam.requests import ChatRequest, QueueFull, Sampling, owner_of
from radixchat.webui.api import generation
from radixchat.webui.api.chat import ChatFrames
from radixchat.webui.api.metrics import Metrics
from radixchat.webui.api.shapes import fields
from radixchat.webui.api.shapes.schema import ChatCompletionRequest, CompletionRequest
from radixchat.webui.server import build_app
from tests.support.api_app import api_app
from tests.support.fake_engine import INFO, FakeEngine
from tests.support.metrics import metric_value

GOOD = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
API_DOC = Path(__file__).resolve().parents[1] / "docs" / "API.md"


@pytest.fixture
def engine():
    return FakeEngine()


@pytest.fixture
def alice(store):
    user = store.create_user("alice", "alice-password")
    return user, store.create_api_key(user, "tests")[1]


@pytest.fixture
def http(engine, store, alice):
    """A client of the API with alice's key."""
    with TestClient(api_app(engine, store), headers={"Authorization": f"Bearer {alice[1]}"}) as client:
        yield client


def sse(text: str) -> list[dict | str]:
    """The data of each server-sent event, parsed ("[DONE]" as it is)."""
    assert text.endswith("\n\n"), text[-40:]
    out = []
    for block in text.strip("\n").split("\n\n"):
        data = next(line[6:] for line in block.split("\n") if line.startswith("data: "))
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


# -- replies from the fake, through the seam ---------------------------------------------


def test_a_chat_completion_is_the_fakes_reply_under_the_keys_user(http, engine, alice):
    r = http.post(CHAT, json=GOOD)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "fake-model"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "a fake reply", "tool_calls": None}
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == 3
    (req,) = engine.requests
    assert (
        isinstance(req, ChatRequest) and req.owner == owner_of(alice[0].cache_key) and req.messages[-1].content == "hi"
    )


def test_a_streamed_chat_completion_frames_the_reply_as_openais_chunks(http):
    r = http.post(CHAT, json={**GOOD, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert text == "a fake reply" and finishes == ["stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all("usage" not in c for c in chunks[:-1])  # only the last chunk carries usage


def test_n_choices_are_n_requests_with_seeds_one_apart(http, engine):
    r = http.post(CHAT, json={**GOOD, "n": 3, "seed": 7, "max_tokens": 2})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2] and {c["message"]["content"] for c in choices} == {"a fake"}
    assert {c["finish_reason"] for c in choices} == {"length"} and r.json()["usage"]["completion_tokens"] == 6
    assert [q.sampling.seed for q in engine.requests] == [7, 8, 9]


def test_completions_whole_and_streamed_start_with_the_echoed_prompt(http):
    body = {"model": "fake-model", "prompt": "say: ", "echo": True}
    whole = http.post(COMPLETIONS, json=body)
    assert whole.status_code == 200 and whole.json()["choices"][0]["text"] == "say: a fake reply"
    events = sse(http.post(COMPLETIONS, json={**body, "stream": True}).text)
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["text"] == "say: "
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "say: a fake reply"


def test_models_list_and_card_answer_for_the_id_and_the_aliases(http):
    listed = http.get("/v1/models").json()
    assert [m["id"] for m in listed["data"]] == ["fake-model"]
    for name in ("fake-model", "default", "default_model"):
        assert http.get(f"/v1/models/{name}").json() == listed["data"][0]


# -- refusals, before anything reaches the engine -----------------------------------------

REFUSED = [
    # (path, body, status, code, param, words in the message)
    (CHAT, {**GOOD, "frobnicate": 1}, 400, "invalid_value", "frobnicate", "frobnicate: unknown field"),
    (
        COMPLETIONS,
        {"model": "default", "prompt": "a", "messages": []},
        400,
        "invalid_value",
        "messages",
        "messages: unknown",
    ),
    (RESPONSES, {"model": "default", "input": "a", "colour": "red"}, 400, "invalid_value", "colour", "colour: unknown"),
    (CHAT, {**GOOD, "n": 0}, 400, "invalid_value", "n", "greater than or equal to 1"),
    (CHAT, {**GOOD, "n": 17}, 400, "invalid_value", "n", "less than or equal to 16"),
    (CHAT, {**GOOD, "response_format": {"type": "xml"}}, 400, "invalid_value", "response_format.type", "json_schema"),
    (
        CHAT,
        {**GOOD, "response_format": {"type": "json_schema"}},
        400,
        "invalid_value",
        "response_format.json_schema",
        "json_schema",
    ),
    (CHAT, {**GOOD, "presence_penalty": 3}, 400, "invalid_value", "presence_penalty", "less than or equal to 2"),
    (
        CHAT,
        {**GOOD, "functions": [{"name": "f"}]},
        400,
        "invalid_value",
        "functions",
        "function calling is not supported",
    ),
    (COMPLETIONS, {"model": "default", "prompt": "a", "best_of": 2}, 400, "invalid_value", "best_of", "best_of"),
    (CHAT, {**GOOD, "model": "gpt-4o"}, 404, "model_not_found", "model", "model 'gpt-4o' not found"),
    (
        CHAT,
        {**GOOD, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
        400,
        "invalid_value",
        "messages.0.content",
        "text only",
    ),
    (  # named where it is in the body, not by the union's branch ("content.str")
        CHAT,
        {**GOOD, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        400,
        "invalid_value",
        "messages.0.content.0.text",
        "valid string",
    ),
    (CHAT, {**GOOD, "stop": 5}, 400, "invalid_value", "stop", "valid string"),
]


@pytest.mark.parametrize("path, body, status, code, param, words", REFUSED)
def test_request_shapes_are_refused_by_name(http, engine, path, body, status, code, param, words):
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["code"] == code and err["param"] == param, err
    assert err["type"] == "invalid_request_error" and engine.requests == []


def test_off_values_and_informational_fields_are_accepted(http):
    quiet = {"presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": False, "user": "u", "metadata": {"a": "b"}}
    quiet |= {"response_format": {"type": "text"}, "functions": [], "store": False, "audio": None}
    assert http.post(CHAT, json={**GOOD, **quiet}).status_code == 200


def test_the_engines_refusal_keeps_openais_status_and_gets_its_row(store, alice):
    user, key = alice
    app = api_app(FakeEngine(refuse=QueueFull(9)), store)
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:
        r = client.post(CHAT, json=GOOD)
    err = r.json()["error"]
    assert r.status_code == 429 and r.headers["Retry-After"] == "2", r.text
    assert (err["type"], err["code"]) == ("requests", "queue_full")  # what clients map to a rate limit
    assert (
        metric_value(app.state.metrics.render().decode(), "radixchat:request_refused_total", reason="queue_full") == 1
    )
    assert store.flush()
    with sqlite3.connect(store.path) as con:
        rows = con.execute("SELECT user, error FROM requests").fetchall()
    assert rows == [(user.id, "429: server busy: 9 requests already queued, retry shortly")]


def test_a_prompt_over_the_context_is_openais_400(http):
    r = http.post(CHAT, json={**GOOD, "messages": [{"role": "user", "content": "x" * 600}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


# -- keys, paths and routers ---------------------------------------------------------------


@pytest.mark.parametrize(
    "headers, code, words",
    [
        ({}, "missing_api_key", "Authorization: Bearer"),
        ({"Authorization": "Basic YWxpY2U6eA=="}, "missing_api_key", "Bearer"),
        ({"Authorization": "Bearer rc-not-a-key"}, "invalid_api_key", "invalid or revoked"),
        ({"x-api-key": "rc-not-a-key"}, "invalid_api_key", "invalid or revoked"),
    ],
)
def test_a_missing_or_invalid_key_is_401(engine, store, headers, code, words):
    with TestClient(api_app(engine, store)) as client:
        for method, path, body in (("GET", "/v1/models", None), ("POST", CHAT, GOOD)):
            r = client.request(method, path, json=body, headers=headers)
            err = r.json()["error"]
            assert r.status_code == 401 and err["code"] == code and words in err["message"], r.text
            assert err["type"] == "authentication_error"
    assert engine.requests == []


def test_x_api_key_and_bearer_name_the_same_user(engine, store, alice):
    user, key = alice
    with TestClient(api_app(engine, store)) as client:
        assert client.post(CHAT, json=GOOD, headers={"x-api-key": key}).status_code == 200
        assert client.post(CHAT, json=GOOD, headers={"authorization": f"bearer {key}"}).status_code == 200
    assert [q.owner for q in engine.requests] == [owner_of(user.cache_key)] * 2


def test_no_auth_takes_no_key_and_has_no_owner(engine):
    with TestClient(api_app(engine, no_auth=True)) as client:
        assert client.post(CHAT, json=GOOD).status_code == 200
    assert engine.requests[0].owner is None


def test_unknown_v1_paths_are_openais_404(http):
    for method, path in (("GET", "/v1/nothing-here"), ("POST", "/v1/chat/complete")):  # (a known one: 405)
        r = http.request(method, path)
        assert r.status_code == 404 and r.json()["error"] == {
            "message": f"unknown route {path}",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    r = http.post("/v1/embeddings", json={"model": "default", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_served", r.text
    assert "/v1/embeddings is not served" in r.json()["error"]["message"]


def test_a_router_included_after_the_openai_ones_still_answers(engine):
    extra = APIRouter(prefix="/v1")

    @extra.get("/extra/{name}")
    def extra_route(name: str):
        return {"extra": name}

    app = build_app(engine, Settings(no_auth=True), None, routers=[extra])
    with TestClient(app) as client:
        # a catch-all for /v1 included before it would answer this path with a 404
        assert client.get("/v1/extra/x").json() == {"extra": "x"}
        assert client.get("/v1/models").status_code == 200
        assert client.get("/v1/extra").json()["error"]["code"] == "not_found"  # the catch-all is still there


# -- /health and /metrics read the fake's stats --------------------------------------------


def test_health_and_metrics_agree_on_running_and_waiting(engine):
    async def scenario():
        app = build_app(engine, Settings(no_auth=True), None)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            engine.hold = True
            asks = [asyncio.create_task(client.post(CHAT, json=GOOD)) for _ in range(2)]
            while engine.stats().waiting < 2:
                await asyncio.sleep(0.01)
            held = [(await client.get("/health")).json(), (await client.get("/metrics")).text]
            engine.release()
            replies = await asyncio.gather(*asks)
            done = [(await client.get("/health")).json(), (await client.get("/metrics")).text]
        return held, replies, done

    held, replies, done = asyncio.run(scenario())
    assert [r.status_code for r in replies] == [200, 200]
    for (health, metrics), (running, waiting) in ((held, (0, 2)), (done, (0, 0))):
        assert (health["active_requests"], health["queue_depth"]) == (running, waiting)
        assert metric_value(metrics, "radixchat:num_requests_running") == running
        assert metric_value(metrics, "radixchat:num_requests_waiting") == waiting
        assert health["status"] == "ok" and health["model"] == "fake-model"
    ended = metric_value(done[1], "radixchat:request_success_total", finished_reason="stop")
    assert ended == 2


# -- the generation core: what the client no longer waits for is cancelled ----------------


class _Gone:
    """A request whose client has already hung up."""

    async def receive(self):
        return {"type": "http.disconnect"}


def _ledger(engine) -> generation.Ledger:
    return generation.Ledger(Metrics(engine), None, "fake-model", None)


def test_a_whole_reply_whose_client_left_is_cancelled_in_the_engine(engine):
    async def scenario():
        engine.hold = True
        handle = await engine.asubmit(ChatRequest(messages=[{"role": "user", "content": "hi"}]))
        finals, gone = await asyncio.wait_for(generation.wait_for_ends(_Gone(), [handle], _ledger(engine)), 5)
        return handle, finals, gone

    handle, (final,), gone = asyncio.run(scenario())
    assert gone and engine.cancelled == [handle.id] and final.finish_reason == "cancelled"
    assert engine.stats().inflight == 0


def test_a_stream_closed_early_cancels_the_choices_not_yet_ended(engine):
    async def scenario():
        engine.hold = True
        first = await engine.asubmit(ChatRequest(messages=[{"role": "user", "content": "a"}]))
        second = await engine.asubmit(ChatRequest(messages=[{"role": "user", "content": "b"}]))
        body = generation.stream(
            [first, second], ChatFrames("fake-model", 2, False, None), _ledger(engine)
        ).body_iterator
        opening = [await anext(body), await anext(body)]
        await body.aclose()  # what Starlette does when the client goes away
        return first, second, opening

    first, second, opening = asyncio.run(scenario())
    assert [sse(o)[0]["choices"][0]["index"] for o in opening] == [0, 1]
    assert sorted(engine.cancelled) == sorted([first.id, second.id]) and engine.stats().inflight == 0


def test_submit_choices_is_all_or_nothing():
    """A choice the engine refuses cancels those already submitted."""

    class RefusesSecond(FakeEngine):
        async def asubmit(self, request):
            self.refuse = QueueFull(1) if self.requests else None
            return await super().asubmit(request)

    engine = RefusesSecond()
    engine.hold = True
    ledger = generation.Ledger(Metrics(engine), None, "fake-model", None)
    build = lambda sampling: engine.asubmit(ChatRequest(messages=[{"role": "user", "content": "a"}], sampling=sampling))  # noqa: E731
    with pytest.raises(Exception) as info:
        asyncio.run(generation.submit_choices(ledger, 3, Sampling().model_dump(), build))
    assert getattr(info.value, "status", None) == 429 and len(engine.requests) == 1
    assert engine.cancelled == ["fake-1"] and engine.stats().inflight == 0


# -- the Responses API's kept responses ---------------------------------------------------


def test_a_kept_response_reads_back_and_is_another_users_404(http, store, engine):
    made = http.post(RESPONSES, json={"model": "default", "input": "Keep this."}).json()
    assert re.fullmatch(r"resp_[0-9a-f]{48}", made["id"])
    got = http.get(f"/v1/responses/{made['id']}")
    assert got.status_code == 200, got.text
    assert got.json()["status"] == "completed" and got.json()["output"][0]["content"][0]["text"] == "a fake reply"
    bob = store.create_user("bob", "bob-password")
    as_bob = {"Authorization": f"Bearer {store.create_api_key(bob, 'tests')[1]}"}
    unknown = "resp_" + "0" * 48
    answers = [http.get(f"/v1/responses/{rid}", headers=as_bob) for rid in (made["id"], unknown)]
    assert [a.status_code for a in answers] == [404, 404]
    # the same words for both: nothing says the first one exists
    theirs, nothing = (a.json()["error"] for a in answers)
    assert theirs["message"].replace(made["id"], unknown) == nothing["message"] and theirs["code"] == "not_found"


# -- the request-fields table --------------------------------------------------------------


def test_the_field_tables_match_the_request_models_and_the_api_doc():
    """Every field a table lets through is one its request model reads; docs/API.md's table
    names every chat and completions field."""
    for table, model in ((fields.CHAT, ChatCompletionRequest), (fields.COMPLETIONS, CompletionRequest)):
        passed = {name for name, use in table.items() if use == fields.USED}
        assert passed <= set(model.model_fields), passed - set(model.model_fields)
    text = API_DOC.read_text()
    table = text[text.index("| field | chat | completions | here |") :].split("\n\n")[0]
    named = set(re.findall(r"`([a-z_]+)", table))
    assert set(fields.CHAT) | set(fields.COMPLETIONS) <= named, (set(fields.CHAT) | set(fields.COMPLETIONS)) - named
    assert fields.CHAT["presence_penalty"] == fields.CHAT["frequency_penalty"] == fields.USED


def test_a_model_info_with_a_tool_format_turns_calls_into_tool_calls(store, alice):
    call = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    engine = FakeEngine(call, info=dataclasses.replace(INFO, tool_format="hermes"))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with TestClient(api_app(engine, store), headers={"Authorization": f"Bearer {alice[1]}"}) as client:
        whole = client.post(CHAT, json={**GOOD, "tools": tools}).json()["choices"][0]
        streamed = sse(client.post(CHAT, json={**GOOD, "tools": tools, "stream": True}).text)
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    assert [c["function"] for c in whole["message"]["tool_calls"]] == [{"name": "f", "arguments": '{"a": 1}'}]
    deltas = [e["choices"][0] for e in streamed[:-1]]
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == ["tool_calls"]
    assert not any(d["delta"]["content"] for d in deltas)  # the call's text is never shown


class Hangs:
    """A request whose client hangs up after `after` seconds (or never: None)."""

    def __init__(self, after: float | None):
        self.after = after

    async def receive(self):
        if self.after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.after)
        return {"type": "http.disconnect"}


def test_work_for_a_client_that_hung_up_is_cancelled():
    """What a route awaits for a whole answer (a token count's templating) stops when its client
    goes: it ran on for 12 s after 244 abandoned counts."""
    stopped = []

    async def slow():
        try:
            await asyncio.sleep(10)
            return 1
        except asyncio.CancelledError:
            stopped.append(True)
            raise

    async def quick():
        return 7

    async def run():
        t0 = asyncio.get_running_loop().time()
        gone = await generation.unless_gone(Hangs(0.05), slow())
        took = asyncio.get_running_loop().time() - t0
        await asyncio.sleep(0)  # the cancelled work's handler runs
        return gone, took, await generation.unless_gone(Hangs(None), quick())

    (result, gone), took, kept = asyncio.run(run())
    assert result is None and gone and took < 1.0 and stopped == [True]
    assert kept == (7, False)


# a forced call's parameters that require an object of their own kind: no call can finish
ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


def test_a_forced_call_no_finite_json_can_finish_is_refused_on_every_api(store, alice):
    """Its grammar would write `{"a":{"a":...` until the constraint engine ran out of depth,
    mid-reply: a streamed client had its 200 and then a server error."""
    engine = FakeEngine(info=dataclasses.replace(INFO, tool_format="hermes"))
    fn = {"name": "f", "parameters": ENDLESS}
    bodies = {
        CHAT: {**GOOD, "tools": [{"type": "function", "function": fn}], "tool_choice": "required"},
        RESPONSES: {
            "model": "default",
            "input": "hi",
            "tools": [{"type": "function", **fn}],
            "tool_choice": "required",
        },
        "/v1/messages": {
            **GOOD,
            "max_tokens": 8,
            "tools": [{"name": "f", "input_schema": ENDLESS}],
            "tool_choice": {"type": "any"},
        },
    }
    with TestClient(api_app(engine, store), headers={"Authorization": f"Bearer {alice[1]}"}) as client:
        answers = {path: client.post(path, json={**body, "stream": True}) for path, body in bodies.items()}
    assert engine.requests == []
    for path, r in answers.items():
        assert r.status_code == 400, (path, r.text)
        assert "no call of these tools can be written" in r.text, (path, r.text)
    err = answers[CHAT].json()["error"]
    assert err["param"] == "tools" and err["code"] == "invalid_schema", err
    assert answers["/v1/messages"].json()["error"]["type"] == "invalid_request_error"


def test_a_reply_its_own_grammar_failed_mid_stream_is_the_clients_error_on_every_api(store, alice):
    """The 200 went with the first chunk; the error that ends the stream says whose fault it
    was (it said server_error, which the SDKs raise as the server's)."""
    from radixchat.core.seam.requests import GRAMMAR_LIMIT

    bodies = {
        CHAT: {**GOOD, "stream": True},
        RESPONSES: {"model": "default", "input": "hi", "stream": True},
        "/v1/messages": {**GOOD, "max_tokens": 8, "stream": True},
    }
    for message, theirs in ((GRAMMAR_LIMIT, True), ("the engine stopped", False)):
        engine = FakeEngine(fail=message)
        with TestClient(api_app(engine, store), headers={"Authorization": f"Bearer {alice[1]}"}) as client:
            texts = {path: client.post(path, json=body).text for path, body in bodies.items()}
        chat = [e for e in sse(texts[CHAT]) if isinstance(e, dict) and "error" in e]
        assert chat and chat[0]["error"]["type"] == ("invalid_request_error" if theirs else "server_error"), chat
        assert chat[0]["error"]["message"] == message
        failed = [e for e in events(texts[RESPONSES]) if e.get("type") == "response.failed"]
        assert failed[0]["response"]["error"]["code"] == ("invalid_prompt" if theirs else "server_error"), failed
        errors = [e for e in events(texts["/v1/messages"]) if e.get("type") == "error"]
        assert errors[0]["error"]["type"] == ("invalid_request_error" if theirs else "api_error"), errors


def events(text: str) -> list[dict]:
    """Every JSON event's data in a named-event stream (the Responses and Messages APIs')."""
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_a_route_asked_with_another_method_says_which_it_takes(engine):
    """A GET of /v1/chat/completions was a 404 "unknown route": the route exists."""
    with TestClient(api_app(engine, no_auth=True)) as client:
        got = client.get(CHAT)
        posted = client.post("/v1/models")
        anthropic = client.get("/v1/messages")
        unknown = client.get("/v1/nothing")
    assert got.status_code == 405 and got.headers["allow"] == "POST", got.text
    assert (
        got.json()["error"]["code"] == "method_not_allowed" and "takes POST, not GET" in got.json()["error"]["message"]
    )
    assert posted.status_code == 405 and posted.headers["allow"] == "GET", posted.text
    assert anthropic.status_code == 405 and anthropic.json()["error"]["type"] == "invalid_request_error"
    assert unknown.status_code == 404


@pytest.mark.parametrize(
    "body",
    [b'{"model": "default", "messages": "\xff\xfe"}', b'{"model": "default", "metadata": ' + b"[" * 100_000],
    ids=["not_utf8", "too_deep"],
)
def test_a_body_json_cannot_read_at_all_is_refused_in_words(engine, body):
    """Bytes that are not UTF-8, or nesting past Python's recursion, got FastAPI's "There was
    an error parsing the body" with no code (counted on /metrics as reason "400")."""
    with TestClient(api_app(engine, no_auth=True)) as client:
        r = client.post(CHAT, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_value" and err["message"].startswith("the request body is not valid JSON"), err


def test_a_messages_client_without_a_key_is_told_the_header_it_sends(engine, store):
    with TestClient(api_app(engine, store)) as client:
        anthropic = client.post("/v1/messages", json={**GOOD, "max_tokens": 8})
        openai_ = client.post(CHAT, json=GOOD)
    assert anthropic.status_code == openai_.status_code == 401
    assert "x-api-key" in anthropic.json()["error"]["message"]
    assert "Authorization: Bearer" in openai_.json()["error"]["message"]


def test_an_engines_refusal_names_the_field_each_api_sends(store, alice):
    """The engine's check starts with the field ("response_format: ..."): that is the param,
    and on the Messages API it is Anthropic's name for the field (it said "response_format",
    which Anthropic's clients never send, and the param was null)."""
    from radixchat.core.seam.requests import RequestError

    refusal = RequestError("response_format: not a usable JSON schema: no", code="invalid_schema")
    with TestClient(api_app(FakeEngine(refuse=refusal), store), headers={"x-api-key": alice[1]}) as client:
        chat = client.post(CHAT, json=GOOD).json()["error"]
        anthropic = client.post("/v1/messages", json={**GOOD, "max_tokens": 8}).json()["error"]
    assert chat["param"] == "response_format" and chat["code"] == "invalid_schema", chat
    assert anthropic["message"] == "output_config.format: not a usable JSON schema: no", anthropic


def test_an_assistant_message_as_the_openai_sdk_dumps_it_is_taken(http):
    """`message.model_dump()` holds `"function_call": null` (and, from `parse`, `parsed`): an
    agent that sends its SDK's reply back got a 400 at every later turn. A legacy call that is
    set is still refused."""
    dumped = {
        "role": "assistant",
        "content": '{"a": 1}',
        "function_call": None,
        "tool_calls": None,
        "refusal": None,
        "annotations": [],
        "audio": None,
        "parsed": {"a": 1},
    }
    turns = [{"role": "user", "content": "hi"}, dumped, {"role": "user", "content": "and?"}]
    assert http.post(CHAT, json={**GOOD, "messages": turns}).status_code == 200
    legacy = {**dumped, "function_call": {"name": "f", "arguments": "{}"}}
    r = http.post(CHAT, json={**GOOD, "messages": [turns[0], legacy, turns[2]]})
    assert r.status_code == 400 and "legacy function-calling" in r.json()["error"]["message"], r.text


def test_a_refusal_says_what_is_wrong_and_where(store, alice):
    """A Messages request forcing a tool it does not list was told no call could be written;
    a chat ending with the assistant's message said "None: Value error, ..." with no param."""
    engine = FakeEngine(info=dataclasses.replace(INFO, tool_format="hermes"))
    with TestClient(api_app(engine, store), headers={"x-api-key": alice[1]}) as client:
        forced = client.post(
            "/v1/messages",
            json={
                **GOOD,
                "max_tokens": 8,
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "nope"},
            },
        )
        last = client.post(CHAT, json={**GOOD, "messages": [*GOOD["messages"], {"role": "assistant", "content": "x"}]})
    assert forced.status_code == 400 and "names a tool that is not in tools" in forced.text, forced.text
    err = last.json()["error"]
    assert last.status_code == 400 and err["param"] == "messages", err
    assert err["message"].startswith("messages: the last message must come from the user"), err


def test_a_response_says_back_the_tools_and_settings_it_was_asked_with(store, alice):
    """It said `tools: []` and `tool_choice: "none"` whatever the request sent."""
    call = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    engine = FakeEngine(call, info=dataclasses.replace(INFO, tool_format="hermes"))
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    body = {"model": "default", "input": "hi", "tools": [tool], "tool_choice": "required", "temperature": 0.3}
    with TestClient(api_app(engine, store), headers={"Authorization": f"Bearer {alice[1]}"}) as client:
        whole = client.post(RESPONSES, json=body).json()
        streamed = events(client.post(RESPONSES, json={**body, "stream": True}).text)
        plain = client.post(RESPONSES, json={"model": "default", "input": "hi"}).json()
    done = next(e["response"] for e in streamed if e.get("type") == "response.completed")
    for r in (whole, done):
        assert r["tools"] == [tool] and r["tool_choice"] == "required" and r["temperature"] == 0.3, r
    assert plain["tools"] == [] and plain["tool_choice"] == "auto" and plain["temperature"] is None
