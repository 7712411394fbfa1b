"""A user's own request limit, set by an admin in the store, is what the engine holds that user
to through the API (in place of --max-user-requests); another user keeps the server's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.cheap import cheap_scrypt
from tests.support.server import Server, stop_clean


@pytest.fixture(scope="module")
def limited(tiny_model_dir, tmp_path_factory):
    db = tmp_path_factory.mktemp("limit") / "limit.db"
    keys = {}
    with Store(db, scrypt=cheap_scrypt()) as store:
        for name in ("alice", "bob"):
            keys[name] = store.create_api_key(store.create_user(name, f"{name}-password-long"), "t")[1]
        store.set_request_limit("bob", 1)
    srv = Server(tiny_model_dir, db, "--max-user-requests", "4")
    yield srv, keys, db
    stop_clean(srv)


def at_once(srv, key: str, n: int) -> list[int]:
    """The statuses of `n` requests sent together with `key`, each long enough that they overlap."""
    body = {"model": "default", "max_tokens": 300, "messages": [{"role": "user", "content": "Tell me"}]}
    headers = {"authorization": f"Bearer {key}"}
    with ThreadPoolExecutor(n) as pool:
        sent = [
            pool.submit(httpx.post, srv.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
            for _ in range(n)
        ]
        answers = [f.result() for f in sent]
    for r in answers:
        assert r.status_code in (200, 429), r.text
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "user_limit", r.text
    return sorted(r.status_code for r in answers)


@pytest.mark.slow
def test_a_users_own_limit_holds_them_and_only_them(limited):
    srv, keys, db = limited
    assert at_once(srv, keys["bob"], 4).count(429) >= 1  # one at a time is bob's limit
    assert at_once(srv, keys["alice"], 3) == [200, 200, 200]  # the server's limit of 4 is alice's
    with Store(db, scrypt=cheap_scrypt()) as store:  # the admin lifts it: the next requests read it
        store.set_request_limit("bob", None)
    assert at_once(srv, keys["bob"], 3) == [200, 200, 200]
