"""The page's own routes answer a page session only to the sign-in that opened it.

On a real server two users sign in. alice starts a reply through Gradio's queue; bob, who
learnt her session_hash and event_id, can neither read her stream, nor cancel her reply, nor
end her session, nor save it as a deep link, and a client that never signed in cannot cancel
it either; her reply completes. Uploads are refused before their body is read, and no file
under Gradio's upload folder is served. With --no-auth (in process) one browser cannot cancel
another's reply. The small client of Gradio's queue protocol (sse_v3) these tests speak is
`PageClient` in tests/support/clients.py.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from radixchat.core.config import Settings
from radixchat.core.store import Store
from radixchat.webui.auth.gate import PageGate, Refused, SessionOwners
from radixchat.webui.server import build_app
from tests.support.clients import API, PageClient, signed_in
from tests.support.server import CHEAP, PASSWORDS, Server

DONE = "prompt tokens from cache"  # the figures line under a finished answer


def status_of_stream(http: httpx.Client, method: str, path: str, **kw) -> int:
    """The status of a request whose answer may be an endless stream (read no further)."""
    with http.stream(method, path, timeout=10, **kw) as r:
        return r.status_code


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("page-routes")
    with Store(root / "page.db", scrypt=CHEAP) as store:
        for name, password in PASSWORDS.items():
            store.create_user(name, password)
    uploads = root / "gradio-uploads"
    srv = Server(tiny_model_dir, root / "page.db", env={"GRADIO_TEMP_DIR": str(uploads)})
    srv.uploads = uploads
    yield srv
    out = srv.stop()
    assert "Traceback" not in out, out


@pytest.mark.slow
def test_another_user_cannot_read_stop_or_end_a_page_session(server):
    alice_http, bob_http = signed_in(server.url, "alice"), signed_in(server.url, "bob")
    stranger = httpx.Client(base_url=server.url, timeout=30)
    alice, bob = PageClient(alice_http), PageClient(bob_http)
    r, event = alice.join("respond", ["Alpaca-1171 what is a list?", None, 0, 64, None])
    assert r.status_code == 200 and event, r.text

    # bob knows her session_hash and event_id
    assert status_of_stream(bob_http, "GET", f"{API}/queue/data", params={"session_hash": alice.session}) == 403
    assert status_of_stream(bob_http, "GET", f"{API}/heartbeat/{alice.session}") == 403
    r = bob_http.post(f"{API}/cancel", json=alice.cancel_body(event))
    assert r.status_code == 403 and "another" in r.json()["detail"]
    r = bob_http.post(
        f"{API}/queue/join", json={"data": [], "fn_index": alice.fns["respond"]["id"], "session_hash": alice.session}
    )
    assert r.status_code == 403
    assert bob_http.get(f"{API}/deep_link", params={"session_hash": alice.session}).status_code == 404
    # nor may a client that never signed in
    assert stranger.post(f"{API}/cancel", json=alice.cancel_body(event)).status_code in (401, 403, 404)
    assert status_of_stream(stranger, "GET", f"{API}/heartbeat/{alice.session}") in (401, 403, 404)

    # her reply is whole: streamed, finished, not stopped
    msgs = alice.messages(event)
    assert msgs[-1]["msg"] == "process_completed" and msgs[-1]["success"], msgs[-1]
    text = json.dumps(msgs)
    assert DONE in text and "stopped" not in text
    assert server.metric("radixchat:request_success_total", finished_reason="cancelled") == 0

    # bob's own session works as ever
    r, his = bob.join("respond", ["Bison-3391 what is a dict?", None, 0, 8, None])
    assert r.status_code == 200
    assert bob.messages(his)[-1]["success"]


@pytest.mark.slow
def test_uploads_and_files_are_refused(server):
    alice_http, bob_http = signed_in(server.url, "alice"), signed_in(server.url, "bob")
    r = alice_http.post(f"{API}/upload", files={"files": ("notes.txt", b"alice's notes")})
    assert r.status_code in (403, 404), r.text
    assert alice_http.post(f"{API}/process_recording", files={"files": ("a.wav", b"RIFF")}).status_code in (403, 404)

    # refused before the body is read: a 50 MB upload announced, never sent, is answered at once
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        cookie = "; ".join(f"{k}={v}" for k, v in alice_http.cookies.items())
        s.sendall(
            (
                f"POST {API}/upload HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n"
                "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 50000000\r\n\r\n"
            ).encode()
        )
        t0 = time.monotonic()
        head = s.recv(4096)
    assert head.split(b"\r\n")[0].split()[1] in (b"403", b"404") and time.monotonic() - t0 < 3, head

    # a file in Gradio's upload folder (one alice uploaded before uploads were off) is nobody's to fetch
    secret = server.uploads / "0123abcd" / "alice-notes.txt"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("alice's private notes")
    for http in (bob_http, alice_http):
        for path in (f"{API}/file={secret}", f"{API}/file/{secret}"):
            r = http.get(path)
            assert r.status_code in (403, 404) and "private notes" not in r.text, (path, r.status_code)
    # the page's own assets still load
    assert bob_http.get("/theme.css").status_code == 200
    assert bob_http.get("/").status_code == 200


@pytest.mark.slow
def test_gradios_traffic_monitoring_is_off(server):
    """Gradio's /monitoring/summary showed any signed-in user every page handler's calls
    (an admin's account actions among them); the server's own /metrics answers loopback only."""
    bob_http = signed_in(server.url, "bob")
    summary = bob_http.get("/monitoring/summary")
    assert summary.status_code in (403, 404), summary.text
    for path in ("/monitoring", "/monitoring/0123"):
        assert bob_http.get(path).status_code in (403, 404), path


def test_no_auth_one_browser_cannot_cancel_anothers_reply(engine, tmp_path, tiny_model_dir):
    store = Store(tmp_path / "na.db", scrypt=CHEAP)
    app = build_app(engine, Settings(model=str(tiny_model_dir), no_auth=True), store)
    try:
        with TestClient(app) as http:
            assert http.get("/").status_code == 200
            mine = dict(http.cookies)  # this browser's id
            page = PageClient(http)
            r, event = page.join("respond", ["Anchor-2283 what does a tuple hold?", None, 0, 24, None])
            assert r.status_code == 200

            http.cookies.clear()  # another browser, no cookie yet
            assert http.post(f"{API}/cancel", json=page.cancel_body(event)).status_code == 403
            http.get("/")  # its own id
            assert "radixchat_browser" in http.cookies and dict(http.cookies) != mine
            assert http.post(f"{API}/cancel", json=page.cancel_body(event)).status_code == 403
            assert http.get(f"{API}/queue/data", params={"session_hash": page.session}).status_code == 403
            assert "radixchat_browser" in mine

            http.cookies.clear()
            http.cookies.update(mine)
            msgs = page.messages(event)
            assert msgs[-1]["success"] and DONE in json.dumps(msgs)
    finally:
        store.close()


class FakeSide:
    def __init__(self, users=None, events=None):
        self.users, self.events = users or {}, events or {}

    def user(self, cookies):
        return self.users.get(cookies.get("who"))

    def event_session(self, event_id):
        return self.events.get(event_id)


def test_gate_table_and_rules_without_a_server():
    owners = SessionOwners(per_owner=2, total=3)
    owners.claim("s1", "alice")
    owners.claim("s1", "alice")
    with pytest.raises(Refused) as e:
        owners.claim("s1", "bob")
    assert e.value.status == 403
    with pytest.raises(Refused) as e:
        owners.check("nobody's", "alice")
    assert e.value.status == 404
    owners.claim("s2", "alice")
    owners.claim("s3", "alice")  # alice's third: her oldest (s1) goes, nobody else's
    owners.claim("b1", "bob")
    with pytest.raises(Refused):
        owners.check("s1", "alice")
    owners.check("s2", "alice")
    owners.claim("b2", "bob")  # four in all: the least recently used (s3) goes
    assert len(owners) == 3
    with pytest.raises(Refused):
        owners.check("s3", "alice")
    owners.check("b1", "bob")

    # /cancel names an event with the session: both must be the caller's
    calls = []

    async def app(scope, receive, send):
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    side = FakeSide(users={"a": "alice", "b": "bob"}, events={"ev-a": "sa", "ev-b": "sb"})
    gate = PageGate(app, side=side, no_auth=False, max_body=1 << 16)
    http = TestClient(gate)  # no lifespan: the fake app has none
    http.cookies.set("who", "a")
    assert http.post(f"{API}/queue/join", json={"session_hash": "sa", "data": []}).status_code == 200
    http.cookies.set("who", "b")
    assert http.post(f"{API}/queue/join", json={"session_hash": "sb", "data": []}).status_code == 200
    assert http.post(f"{API}/cancel", json={"session_hash": "sb", "fn_index": 0, "event_id": "ev-a"}).status_code == 403
    assert http.post(f"{API}/cancel", json={"session_hash": "sb", "fn_index": 0, "event_id": "ev-b"}).status_code == 200
    assert (
        http.post(f"{API}/cancel", json={"session_hash": ["sb"], "fn_index": 0, "event_id": "ev-b"}).status_code == 422
    )
    assert http.get(f"{API}/queue/data?session_hash=sb&session_hash=sa").status_code == 422
    assert http.post(f"{API}/queue/join", content=b"x" * (1 << 17)).status_code == 413
    for refused in (
        "upload",
        "file=/etc/passwd",
        "queue/join/",
        "stream/ev-a",
        "call/respond/ev-a",
        "component_server",
        "deep_link?session_hash=sa",
        "startup-events",
        "heartbeat/",
    ):
        assert http.get(f"{API}/{refused}").status_code == 404, refused
    assert http.get("/?deep_link=abc").status_code == http.get("/config?deep%5Flink=abc").status_code == 404
    assert http.get("/config").status_code == 200
    assert calls.count(f"{API}/cancel") == 1
