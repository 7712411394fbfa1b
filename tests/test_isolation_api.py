"""Strangers on one server, through the real HTTP API: one user's bad parameters, probes and
floods cost the others nothing."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.randmodel import build_random_model
from tests.support.server import Server

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are the help desk of a small bank. Answer in one short sentence and never repeat "
    "account numbers, PINs or passwords back to the customer, whatever they ask."
)
SECRET = "My PIN is 4711 and my account is 0815-2299-1234, please remember them for later."
INTERNALS = ("Traceback", "incompatible function arguments", "mlx", 'File "', "Error:", "key()")


@pytest.fixture(scope="module")
def strangers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("iso")
    db = folder / "iso.db"
    # a context long enough that mallory's streams outlast the start of all twelve (on the
    # tiny model, 400 tokens took ~1 s, and on a loaded machine the first ones ended before
    # the last one had started)
    model = build_random_model(folder / "model", context=4096)
    keys = {}
    with Store(db) as store:
        for name in ("alice", "bob", "carol", "mallory"):
            user = store.create_user(name, f"{name}-password-long")
            keys[name] = store.create_api_key(user, "tests")[1]
    server = Server(model, db, "--max-user-requests", "12", "--max-batch", "16")
    yield server, keys
    server.stop()


def post(server, key, body, timeout=60):
    return httpx.post(
        server.url + "/v1/chat/completions", json=body, timeout=timeout, headers={"Authorization": f"Bearer {key}"}
    )


def chat_body(user_text, system=SYSTEM, **kw):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user_text}]
    return {"model": "default", "messages": msgs, "max_tokens": 4, "temperature": 0, **kw}


BAD = [  # (changes to a good body, expected status)
    ({"seed": -5, "temperature": 1.0}, 200),
    ({"seed": 2**63 + 5, "temperature": 1.0}, 200),
    ({"seed": 2**64, "temperature": 1.0}, 400),
    ({"seed": -(2**63) - 1, "temperature": 1.0}, 400),
    ({"top_k": 400, "temperature": 1.0}, 200),  # the tiny model's whole vocabulary
    ({"top_k": 401, "temperature": 1.0}, 400),
    ({"top_k": 10**6, "temperature": 1.0}, 400),
    ({"top_k": -1}, 400),
    ({"top_p": 0}, 400),
    ({"temperature": 1e300}, 400),
    ({"max_tokens": 10**12}, 200),
    ({"max_tokens": 0}, 400),
    ({"stop": ["x" * 5000]}, 400),
    ({"stop": ""}, 400),
    ({"n": 17}, 400),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]}]}, 400),
    ({"messages": [{"role": "tool", "content": "hi"}]}, 400),
    ({"messages": []}, 400),
]


def test_bad_parameters_fail_alone_while_eight_streams_run(strangers):
    server, keys = strangers
    results, errors = {}, []

    def victim(i):
        try:
            body = chat_body(f"Tell me about savings account number {i}", max_tokens=40, ignore_eos=True, stream=True)
            with httpx.stream(
                "POST",
                server.url + "/v1/chat/completions",
                json=body,
                timeout=120,
                headers={"Authorization": f"Bearer {keys['alice']}"},
            ) as r:
                lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
            results[i] = (r.status_code, lines)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=victim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    seen = []
    for changes, want in BAD * 2:
        r = post(server, keys["mallory"], {**chat_body("probe"), **changes})
        seen.append((changes, r.status_code))
        assert r.status_code == want, (changes, r.status_code, r.text)
        assert not any(s in r.text for s in INTERNALS), r.text
        if r.status_code != 200:
            err = r.json()["error"]
            assert err["message"] and err["type"], err
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 8
    for status, lines in results.values():
        assert status == 200 and lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert not any("error" in c for c in chunks), chunks[-1]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_probe_learns_nothing_of_anothers_prompt_through_cached_tokens(strangers):
    server, keys = strangers
    assert post(server, keys["alice"], chat_body(SECRET)).status_code == 200

    def cached(who, text):
        r = post(server, keys[who], chat_body(text))
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    right = cached("bob", SECRET)
    wrong = cached("carol", SECRET.replace("4711", "9358"))  # neither prober sent anything before
    assert right == wrong > 0  # both get the system prompt they sent too, nothing more
    assert cached("alice", SECRET) > right  # alice's own conversation is reused


def test_one_users_flood_is_refused_for_that_user_only(strangers):
    server, keys = strangers
    streams, stop = [], threading.Event()

    def hold():
        body = chat_body("a long story please", max_tokens=3500, ignore_eos=True, stream=True)
        with httpx.stream(
            "POST",
            server.url + "/v1/chat/completions",
            json=body,
            timeout=120,
            headers={"Authorization": f"Bearer {keys['mallory']}"},
        ) as r:
            streams.append(r.status_code)
            for _ in r.iter_lines():
                if stop.is_set():
                    break

    threads = [threading.Thread(target=hold) for _ in range(12)]
    for t in threads:
        t.start()
    try:
        end = time.time() + 60
        while time.time() < end and len(streams) < 12:
            time.sleep(0.05)
        refused = post(server, keys["mallory"], chat_body("one more"))
        assert refused.status_code == 429 and refused.headers.get("retry-after")
        assert refused.json()["error"]["code"] == "user_limit"
        served = post(server, keys["bob"], chat_body("I am not mallory"))
        assert served.status_code == 200, served.text
    finally:
        stop.set()
        for t in threads:
            t.join(60)
