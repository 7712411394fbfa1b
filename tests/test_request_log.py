"""Seen, not silent: a served API request is one line on the server's log (route, user, model,
outcome, tokens, times), and a refused one too (path, status, reason, the field at fault,
the client's address, what was wrong)."""

from __future__ import annotations

import sqlite3
import time

import httpx
import pytest

from tests.support.clients import GOOD


@pytest.mark.slow
def test_each_request_and_each_refusal_is_a_line_on_the_log(keyed):
    server, key, _, _ = keyed
    auth = {"authorization": f"Bearer {key}"}
    chat = server.url + "/v1/chat/completions"
    assert httpx.post(chat, json=GOOD, headers=auth, timeout=60).status_code == 200
    assert httpx.post(chat, json={**GOOD, "temperature": -1}, headers=auth, timeout=60).status_code == 400
    assert httpx.post(chat, json=GOOD, headers={"authorization": "Bearer sk-nope"}, timeout=60).status_code == 401
    deadline = time.time() + 10
    while time.time() < deadline and server.output().count("radixchat: refused") < 2:
        time.sleep(0.1)
    lines = server.output().splitlines()
    served = [x for x in lines if x.startswith("radixchat: chat alice ")]
    assert len(served) == 1 and " prompt=" in served[0] and " generated=" in served[0] and "ttft=" in served[0]
    refused = [x for x in lines if x.startswith("radixchat: refused /v1/chat/completions")]
    assert any(" 400 invalid_value param=temperature from 127.0.0.1: " in x for x in refused), refused
    assert any(" 401 invalid_api_key from 127.0.0.1: " in x for x in refused), refused
    assert not any(key in x for x in lines)  # a key never reaches the log


def _rows(db, after_id: int) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        got = conn.execute(
            "SELECT r.*, u.name AS who FROM requests r LEFT JOIN users u ON u.id = r.user WHERE r.id > ? ORDER BY r.id",
            [after_id],
        )
        return [dict(r) for r in got]
    finally:
        conn.close()


def _last_id(db) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT coalesce(max(id), 0) FROM requests").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.slow
def test_every_answer_has_its_row_stored_before_the_client_reads_it(keyed):
    """Served and refused alike: the row is committed when the answer arrives (read at once,
    with no wait), with its route, status, reason and the field at fault."""
    server, key, _, db = keyed
    auth = {"authorization": f"Bearer {key}"}
    v1 = server.url + "/v1"
    start = _last_id(db)
    sent = [
        ("/chat/completions", GOOD, auth, 200),
        ("/chat/completions", {**GOOD, "stream": True}, auth, 200),
        ("/chat/completions", {**GOOD, "temperature": -1}, auth, 400),
        ("/chat/completions", {**GOOD, "seed": 2**70}, auth, 400),
        ("/chat/completions", {**GOOD, "model": "no-such-model"}, auth, 404),
        ("/chat/completions", GOOD, {"authorization": "Bearer sk-nope"}, 401),
        ("/messages", {"model": "default", "messages": [{"role": "user", "content": "hi"}]}, auth, 400),
        ("/embeddings", {"model": "default", "input": "hi"}, auth, 404),
    ]
    for i, (path, body, headers, status) in enumerate(sent):
        got = httpx.post(v1 + path, json=body, headers=headers, timeout=60)
        assert got.status_code == status, (path, got.text)
        rows = _rows(db, start)  # no flush, no wait: the answer came after the commit
        assert len(rows) == i + 1, (path, rows)
    served, streamed, temperature, seed, model, bad_key, messages, embeddings = rows
    assert served["route"] == "chat" and served["status"] == 200 and served["who"] == "alice"
    assert served["generated_tokens"] > 0 and served["reason"] is None
    assert streamed["status"] == 200 and streamed["generated_tokens"] > 0
    assert (temperature["status"], temperature["reason"], temperature["param"]) == (400, "invalid_value", "temperature")
    assert temperature["who"] == "alice" and temperature["route"] == "chat"
    assert (seed["reason"], seed["param"]) == ("invalid_value", "seed")
    assert (model["status"], model["param"], model["model"]) == (404, "model", "no-such-model")
    assert bad_key["status"] == 401 and bad_key["reason"] == "invalid_api_key" and bad_key["user"] is None
    assert (messages["route"], messages["param"], messages["who"]) == ("messages", "max_tokens", "alice")
    assert embeddings["status"] == 404 and embeddings["route"] == "/v1/embeddings"
    assert all(key not in str(r) for r in rows)  # a key is never stored
