"""A client that leaves stops its work, streaming or not.

On a real server process: clients that hang up on non-streaming requests must not leave
them running (or queued) in the engine, holding batch slots and the user's share of
--max-user-requests; each such request is still recorded once, as cancelled. Raw sockets,
so closing a connection is exactly what the test says and nothing a client library
decides on its own.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import time

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.server import Server

pytestmark = pytest.mark.slow

# more than --max-batch: some are still queued when their client goes
CHATS, COMPLETIONS, STREAMS = 8, 4, 2
# the tiny model's own 512 would let a fast machine finish a reply before its client leaves
CONTEXT = 4096


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    db = tmp_path_factory.mktemp("gone") / "gone.db"
    with Store(db) as store:
        user = store.create_user("alice", "alice-password-long")
        key = store.create_api_key(user, "tests")[1]
    server = Server(
        tiny_model_dir, db, "--max-batch", "4", "--max-prefill-batch", "4", "--context-length", str(CONTEXT)
    )
    yield server, key, db
    out = server.stop()
    assert "Traceback" not in out, out


def send_raw(server: Server, key: str, path: str, body: dict) -> socket.socket:
    """Send one HTTP request and leave the connection open, its response unread."""
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(head.encode() + data)
    return s


def health(server: Server) -> dict:
    return httpx.get(server.url + "/health", timeout=10).json()


def in_flight(server: Server) -> int:
    h = health(server)
    return h["active_requests"] + h["queue_depth"]


def test_clients_that_leave_non_streaming_requests_stop_them(served):
    server, key, db = served
    cancelled_before = server.metric("radixchat:request_success_total", finished_reason="cancelled")
    # ignore_eos and a max_tokens beyond the context: each would run to the context's end,
    # seconds of work for the whole batch, if nothing stopped it
    long = {"model": "default", "max_tokens": 100_000, "ignore_eos": True, "temperature": 0}
    socks = [
        send_raw(
            server,
            key,
            "/v1/chat/completions",
            {**long, "messages": [{"role": "user", "content": f"tell me a long story {i}"}]},
        )
        for i in range(CHATS)
    ]
    socks += [
        send_raw(server, key, "/v1/completions", {**long, "prompt": f"def story_{i}():"}) for i in range(COMPLETIONS)
    ]
    socks += [
        send_raw(
            server,
            key,
            "/v1/chat/completions",
            {**long, "stream": True, "messages": [{"role": "user", "content": f"stream me a long story {i}"}]},
        )
        for i in range(STREAMS)
    ]
    try:
        deadline = time.time() + 60
        while time.time() < deadline and in_flight(server) < len(socks):
            time.sleep(0.05)
        assert in_flight(server) == len(socks), health(server)
        time.sleep(0.5)  # running a while, as a client that gives up would have seen
    finally:
        for s in socks:
            s.close()
    t_closed = time.time()

    deadline = t_closed + 3  # a step or two; the old code ran them all to their end
    while time.time() < deadline and in_flight(server) > 0:
        time.sleep(0.05)
    h = health(server)
    assert h["active_requests"] == 0 and h["queue_depth"] == 0, h
    assert server.metric("radixchat:prefix_cache_locks") == 0

    # each is recorded once (the store writes from a queue), as cancelled, well short of
    # the length it asked for
    def stored():
        with sqlite3.connect(db) as con:
            return con.execute("SELECT finish_reason, generated_tokens, error FROM requests").fetchall()

    deadline = time.time() + 10
    while time.time() < deadline and len(stored()) < len(socks):
        time.sleep(0.1)
    time.sleep(0.5)  # a second row for any of them would have come by now
    rows = stored()
    assert len(rows) == len(socks), rows
    assert all(reason == "cancelled" and error is None for reason, _, error in rows), rows
    assert all(generated < CONTEXT // 2 for _, generated, _ in rows), rows
    assert server.metric("radixchat:request_success_total", finished_reason="cancelled") == cancelled_before + len(
        socks
    )

    # and the server serves on
    r = httpx.post(
        server.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
        json={"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length"), r.text


def test_a_client_that_stays_gets_its_whole_reply(served):
    server, key, _ = served
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
        r = http.post(
            "/v1/chat/completions",
            json={
                "model": "default",
                "max_tokens": 40,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": "stay"}],
            },
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 40, r.text
        r = http.post(
            "/v1/completions", json={"model": "default", "max_tokens": 40, "ignore_eos": True, "prompt": "def stay():"}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 40, r.text
