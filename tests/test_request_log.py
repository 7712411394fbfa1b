"""Seen, not silent: a served API request is one line on the server's log (route, user, model,
outcome, tokens, times), and a refused one too (path, status, reason, the field at fault,
the client's address, what was wrong)."""

from __future__ import annotations

import time

import httpx

from tests.support.clients import GOOD


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
