"""What a client can read or break at the server's edges, in-process on FakeEngine.

/metrics and /openapi.json by the client's address (this machine, --metrics-allow) and /health open but
saying nothing private; ids in replies random, kept responses found again through the
store; X-Forwarded-For believed only from --forwarded-allow-ips (uvicorn's own middleware,
as the CLI configures it); text that is not valid Unicode refused by the API and the page
in words; a chunked body over the limit a 413; the system prompt's help and docs/SECURITY.md
saying what a whole guess of a system message can confirm.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from radixchat.core.config import Settings
from radixchat.core.store import NotFound, Store
from radixchat.core.store import schema as store_schema
from radixchat.webui.server import build_app
from tests.support.api_app import api_app
from tests.support.fake_engine import FakeEngine

GOOD = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
SECURITY_DOC = Path(__file__).resolve().parents[1] / "docs" / "SECURITY.md"
HEALTH_FIELDS = {"status", "engine_alive", "model", "model_loaded", "models", "active_requests", "queue_depth"}


def from_address(app, addr: str) -> TestClient:
    return TestClient(app, client=(addr, 40000))


@pytest.fixture
def alice_key(store):
    user = store.create_user("alice", "alice-password")
    return store.create_api_key(user, "tests")[1]


@pytest.fixture
def http(store, alice_key):
    with TestClient(
        api_app(FakeEngine(), store, body_limit=True), headers={"Authorization": f"Bearer {alice_key}"}
    ) as client:
        yield client


# -- /metrics and /health -------------------------------------------------------------------


def test_metrics_answer_this_machine_only_unless_allowed():
    app = build_app(FakeEngine(), Settings(no_auth=True), None)
    for addr in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        assert from_address(app, addr).get("/metrics").status_code == 200, addr
    for addr in ("10.0.0.9", "192.168.1.20", "testclient"):
        r = from_address(app, addr).get("/metrics")
        assert r.status_code == 403, addr
        error = r.json()["error"]
        assert error["code"] == "forbidden" and "--metrics-allow" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        assert "radixchat:" not in r.text
    lan = build_app(FakeEngine(), Settings(no_auth=True, metrics_allow="10.0.0.0/8, 192.168.1.5"), None)
    assert [from_address(lan, a).get("/metrics").status_code for a in ("10.0.0.9", "192.168.1.5", "192.168.1.6")] == [
        200,
        200,
        403,
    ]
    anyone = build_app(FakeEngine(), Settings(no_auth=True, metrics_allow="any"), None)
    assert from_address(anyone, "203.0.113.7").get("/metrics").status_code == 200
    with pytest.raises(ValidationError, match="metrics_allow"):
        Settings(metrics_allow="10.0.0.0/8,prometheus.lan")


def test_health_is_open_and_says_only_how_busy_the_server_is():
    app = build_app(FakeEngine(), Settings(no_auth=True), None)
    here, there = (from_address(app, a).get("/health") for a in ("127.0.0.1", "203.0.113.7"))
    assert here.status_code == there.status_code == 200 and here.json() == there.json()
    assert set(there.json()) == HEALTH_FIELDS and there.json()["model"] == "fake-model"


# -- ids -------------------------------------------------------------------------------------


def test_every_id_a_client_sees_is_random_and_a_kept_response_reads_back(http, store):
    chats = [http.post(CHAT, json=GOOD).json()["id"] for _ in range(2)]
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", c) for c in chats) and chats[0] != chats[1]
    made = [http.post(RESPONSES, json={"model": "default", "input": f"Keep {i}."}).json() for i in range(2)]
    rids = [m["id"] for m in made]
    assert all(re.fullmatch(r"resp_[0-9a-f]{48}", r) for r in rids) and rids[0] != rids[1]
    assert [m["output"][0]["id"] for m in made] == ["msg_" + r.removeprefix("resp_") for r in rids]
    got = http.get(f"/v1/responses/{rids[1]}")
    assert got.status_code == 200, got.text
    assert got.json()["output"][0]["id"] == made[1]["output"][0]["id"]
    assert got.json()["output"][0]["content"][0]["text"] == "a fake reply"
    # streamed: the same kinds of ids, and the kept one reads back
    stream = http.post(RESPONSES, json={"model": "default", "input": "Stream.", "stream": True}).text
    streamed = re.search(r'"id": "(resp_[0-9a-f]{48})"', stream).group(1)
    assert set(re.findall(r'"item_id": "([^"]+)"', stream)) == {"msg_" + streamed.removeprefix("resp_")}
    assert http.get(f"/v1/responses/{streamed}").status_code == 200
    # going on from one: the follow-up lands in the same conversation
    follow = http.post(RESPONSES, json={"model": "default", "input": "And?", "previous_response_id": rids[0]})
    assert follow.status_code == 200 and re.fullmatch(r"resp_[0-9a-f]{48}", follow.json()["id"])
    alice = store.authenticate("alice", "alice-password")
    conv, _ = store.named_turn(alice, follow.json()["id"])
    assert [m.content for m in store.history(alice, conv)] == ["Keep 0.", "a fake reply", "And?", "a fake reply"]
    # not kept: random as well, and not found
    unkept = http.post(RESPONSES, json={"model": "default", "input": "Forget.", "store": False}).json()["id"]
    assert re.fullmatch(r"resp_[0-9a-f]{48}", unkept) and http.get(f"/v1/responses/{unkept}").status_code == 404


def test_a_response_id_is_its_users_alone(http, store):
    rid = http.post(RESPONSES, json={"model": "default", "input": "Mine."}).json()["id"]
    bob = store.create_user("bob", "bob-password")
    as_bob = {"Authorization": f"Bearer {store.create_api_key(bob, 'tests')[1]}"}
    unknown = "resp_" + "0" * 48
    answers = [http.get(f"/v1/responses/{r}", headers=as_bob) for r in (rid, unknown, "resp_1_1", "x" * 300)]
    assert [a.status_code for a in answers] == [404] * 4
    assert answers[0].json()["error"]["message"].replace(rid, unknown) == answers[1].json()["error"]["message"]
    with pytest.raises(NotFound):
        store.named_turn(bob, rid)


def test_ids_handed_out_before_random_ones_still_name_their_turns(tmp_path):
    """A database from before the response-id table: the ids made then (resp_<conversation>_
    <message>) are each user message's name after the migration."""
    path = tmp_path / "before.db"
    c = sqlite3.connect(path, isolation_level=None)
    before = next(i for i, m in enumerate(store_schema.MIGRATIONS) if "CREATE TABLE response_ids" in m)
    store_schema.migrate(c, target=before)
    c.execute("INSERT INTO users (name, password_hash, created) VALUES ('olga', 'x', 1.0)")
    c.execute("INSERT INTO conversations (owner, title, created, updated) VALUES (1, 'old', 1.0, 1.0)")
    for role, text in (("user", "Q"), ("assistant", "A"), ("user", "Q2")):
        c.execute("INSERT INTO messages (conversation, role, content, created) VALUES (1, ?, ?, 1.0)", [role, text])
    c.close()
    with Store(path) as store:
        assert store.named_turn(1, "resp_1_1") == (1, 1) and store.named_turn(1, "resp_1_3") == (1, 3)
        with pytest.raises(NotFound):
            store.named_turn(1, "resp_1_2")  # a reply was never a response's name


# -- proxy headers ---------------------------------------------------------------------------


def _seen_address(settings: Settings, peer: str, forwarded: str) -> str:
    """The client address an app sees behind uvicorn's middleware as the CLI configures it."""
    import uvicorn

    from radixchat.webui.cli.main import uvicorn_options

    async def echo(scope, receive, send):
        body = scope["client"][0].encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    config = uvicorn.Config(echo, **uvicorn_options(settings))
    config.load()

    async def ask():
        transport = httpx.ASGITransport(app=config.loaded_app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return (await client.get("/", headers={"X-Forwarded-For": forwarded})).text

    return asyncio.run(ask())


def test_forwarded_for_is_believed_only_from_the_named_proxies():
    assert _seen_address(Settings(), "127.0.0.1", "203.0.113.7") == "127.0.0.1"
    assert _seen_address(Settings(), "10.0.0.2", "203.0.113.7") == "10.0.0.2"
    proxied = Settings(forwarded_allow_ips="127.0.0.1, 10.0.0.0/24")
    assert _seen_address(proxied, "127.0.0.1", "203.0.113.7") == "203.0.113.7"
    assert _seen_address(proxied, "10.0.0.2", "203.0.113.8") == "203.0.113.8"
    assert _seen_address(proxied, "10.0.1.2", "203.0.113.9") == "10.0.1.2"
    assert _seen_address(Settings(forwarded_allow_ips="any"), "10.9.9.9", "203.0.113.7") == "203.0.113.7"
    with pytest.raises(ValidationError, match="forwarded_allow_ips"):
        Settings(forwarded_allow_ips="proxy.lan")


# -- text that is not Unicode, bodies over the limit ---------------------------------------


@pytest.mark.parametrize(
    "path, body, where",
    [
        (CHAT, {"model": "default", "messages": [{"role": "user", "content": "hi \ud800"}]}, "messages.0.content"),
        (CHAT, {**GOOD, "stop": ["\udfff"]}, "stop.0"),
        (CHAT, {**GOOD, "messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}, "text"),
        ("/v1/completions", {"model": "default", "prompt": "\ud83d"}, "prompt"),
        (RESPONSES, {"model": "default", "input": "ok", "instructions": "\ud800x"}, "instructions"),
    ],
)
def test_a_lone_surrogate_is_a_400_that_says_where(http, path, body, where):
    r = http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert where in message and "valid Unicode" in message
    assert "codec" not in message and "surrogates not allowed" not in message


def test_a_chunked_body_over_the_limit_is_a_413_in_openais_shape(http):
    limit = Settings().max_body_bytes

    def chunks():
        yield b'{"model": "default", "messages": [{"role": "user", "content": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}]}'

    r = http.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "body_too_large" and str(limit) in r.json()["error"]["message"]


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_on_the_messages_api_is_a_413_in_anthropics_shape(http, chunked):
    """Anthropic's SDK reads its own envelope: a body refused by its Content-Length came in
    OpenAI's (a chunked one did not)."""
    limit = Settings().max_body_bytes
    body = b'{"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": "' + b"x" * limit + b'"}]}'
    content = (body[i : i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = http.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "request_too_large", r.text
        assert str(limit) in r.json()["error"]["message"]
        content = (body[i : i + 65536] for i in range(0, len(body), 65536)) if chunked else body


def test_the_page_refuses_a_lone_surrogate_in_words(store):
    from radixchat.webui.page.logic.chat_page import ChatPage, PageError

    alice = store.create_user("alice", "alice-password")
    engine = FakeEngine()
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)

    async def send(text):
        return [x async for x in page.reply(alice, conv.id, text)]

    with pytest.raises(PageError) as info:
        asyncio.run(send("hello \ud800"))
    assert "not valid text" in info.value.message and "codec" not in info.value.message
    with pytest.raises(PageError, match="not valid text"):
        page.set_system_prompt(alice, conv.id, "be \udfff")
    assert engine.requests == [] and store.history(alice, conv.id) == []


# -- what a guess of a system message can confirm ------------------------------------------


def test_the_security_model_and_the_page_say_what_a_whole_system_message_guess_confirms():
    import gradio as gr

    from radixchat.webui.page.ui.chat_settings import SYSTEM_PROMPT_HELP, settings_panel
    from tests.support.fake_engine import INFO

    security = SECURITY_DOC.read_text()
    assert "confirm a guess of a whole system message" in " ".join(security.split())
    with gr.Blocks():
        panel = settings_panel({}, INFO, 16, [INFO.model_id])
    assert panel.system.info == SYSTEM_PROMPT_HELP and "whole" in SYSTEM_PROMPT_HELP


def test_the_openapi_map_is_for_this_machine_not_the_lan():
    app = build_app(FakeEngine(), Settings(no_auth=True, allow_open_lan=True), None)

    async def get(client):
        transport = httpx.ASGITransport(app=app, client=(client, 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await c.get("/openapi.json")

    here, lan = asyncio.run(get("127.0.0.1")), asyncio.run(get("192.168.1.20"))
    assert here.status_code == 200 and "/v1/chat/completions" in here.json()["paths"]
    assert lan.status_code == 403 and "this machine only" in lan.json()["error"]["message"]
