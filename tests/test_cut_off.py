"""A user disabled or removed, or a key revoked, while their requests run: what runs stops.

A real server over a real SQLite file; the admin's actions are the store's, on the same file
from this process (as the Admin tab's and `radixchat users remove`, another process, are).
Bob's long API stream ends within seconds of the action with an error event that says why
(in OpenAI's shape, not a finish reason no client knows), a whole reply is a 403, and what
he generated stays short of what he asked for. Alice, not cut off, goes on. And a stream
the server's own stop ends says so the same way (tests/test_shutdown.py: SIGTERM).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.procs import scaled
from tests.support.randmodel import build_random_model
from tests.support.server import CHEAP, Server

LONG = 3000  # tokens: a reply that runs well past the action


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cut-off")
    model = build_random_model(folder / "model", dim=128, layers=4, context=4096)
    db = folder / "c.db"
    keys = {}
    with Store(db, scrypt=CHEAP) as store:
        for name in ("alice", "bob", "carol", "dave"):
            _, keys[name] = store.create_api_key(store.create_user(name, f"{name}-password-1"), "tests")
    srv = Server(model, db, "--max-tokens", str(LONG))
    yield srv, db, keys
    assert "Traceback" not in srv.stop()


def _body(stream: bool) -> dict:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": "Count for as long as you can"}],
        "max_tokens": LONG,
        "stream": stream,
        "ignore_eos": True,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


def _stream(url: str, key: str, got: dict) -> None:
    got["lines"] = lines = []
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=_body(True), headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as r:
        got["status"] = r.status_code
        for line in r.iter_lines():
            if line:
                lines.append(line)
    got["ended"] = time.monotonic()


def _started(got: dict) -> None:
    deadline = time.monotonic() + scaled(60)
    while sum(x.startswith('data: {"id"') for x in got.get("lines", [])) < 3:
        assert time.monotonic() < deadline, got
        time.sleep(0.05)


def _cut(srv, key: str, action) -> tuple[dict, float]:
    got: dict = {}
    client = threading.Thread(target=_stream, args=(srv.url, key, got), daemon=True)
    client.start()
    _started(got)
    t0 = time.monotonic()
    action()
    client.join(scaled(30))
    assert not client.is_alive(), "the stream went on after its user or key was cut off"
    return got, got["ended"] - t0


@pytest.mark.parametrize(
    "who, action, words",
    [
        ("bob", lambda store, _keys: store.set_disabled("bob", True), "user was disabled or removed"),
        ("carol", lambda store, _keys: store.remove_user("carol"), "user was disabled or removed"),
        ("dave", lambda store, keys: store.revoke_api_key(keys["dave"]), "API key was revoked"),
    ],
    ids=["disabled", "removed", "key-revoked"],
)
@pytest.mark.slow
def test_a_stream_stops_when_its_user_or_key_is_cut_off(served, who, action, words):
    srv, db, keys = served
    with Store(db, scrypt=CHEAP) as store:
        got, took = _cut(srv, keys[who], lambda: action(store, keys))
    lines = got["lines"]
    assert got["status"] == 200 and lines[-1] == "data: [DONE]", lines[-3:]
    last = json.loads(lines[-2][6:])
    assert words in last["error"]["message"], last
    finishes = [c["finish_reason"] for x in lines[:-2] for c in json.loads(x[6:]).get("choices", [])]
    assert "cancelled" not in finishes and len(finishes) < LONG, finishes[-3:]
    print(f"{who}: the stream ended {took:.2f} s after the action")
    assert took < scaled(3), took  # the poll is every 0.5 s; the issue asks for a second
    # and the next request is refused as before
    r = httpx.post(srv.url + "/v1/chat/completions", json=_body(False), headers=_auth(keys[who]), timeout=30)
    assert r.status_code == 401, r.text


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.slow
def test_a_whole_reply_of_a_disabled_user_is_a_403_and_another_user_goes_on(served):
    srv, db, keys = served
    with Store(db, scrypt=CHEAP) as store:
        store.set_disabled("bob", False)
        alice: dict = {}
        other = threading.Thread(target=_stream, args=(srv.url, keys["alice"], alice), daemon=True)
        other.start()
        _started(alice)
        answer: dict = {}

        def whole():
            r = httpx.post(srv.url + "/v1/chat/completions", json=_body(False), headers=_auth(keys["bob"]), timeout=120)
            answer["r"] = r

        asker = threading.Thread(target=whole, daemon=True)
        asker.start()
        deadline = time.monotonic() + scaled(30)
        while httpx.get(srv.url + "/health", timeout=10).json()["active_requests"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        store.set_disabled("bob", True)
        asker.join(scaled(30))
    r = answer["r"]
    assert r.status_code == 403 and "disabled" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["code"] == "access_revoked"
    assert other.is_alive(), "alice's stream ended with bob's"
    other.join(scaled(120))
    finishes = [c["finish_reason"] for x in alice["lines"][:-1] for c in json.loads(x[6:]).get("choices", [])]
    assert finishes[-1] == "length", alice["lines"][-3:]
