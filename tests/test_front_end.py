"""A trusted front end's users (Open WebUI in front of radixchat): a key marked `front_end`
may name the request's end user in a header, who is then a radixchat user of their own
(FRONT/USER: their own cache namespace, limits and rows); any other key's headers name
nobody, so an ordinary user cannot pose as someone else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from radixchat.core.config import Settings
from radixchat.core.seam.requests import owner_of
from radixchat.core.store import Invalid, NotFound
from radixchat.webui.server import build_app
from tests.support.fake_engine import FakeEngine

CHAT = "/v1/chat/completions"
GOOD = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_a_front_ends_end_users_are_users_of_their_own(store):
    webui, bob = store.create_user("openwebui", "front-end-password"), store.create_user("bob", "bob-password")
    _, front = store.create_api_key(webui, "Open WebUI", front_end=True)
    _, plain = store.create_api_key(bob, "laptop")
    engine = FakeEngine()
    with TestClient(build_app(engine, Settings(), store)) as client:

        def ask(key, **headers):
            return client.post(CHAT, json=GOOD, headers={"authorization": f"Bearer {key}", **headers})

        assert ask(front, **{"x-openwebui-user-id": "u-1"}).status_code == 200
        assert ask(front, **{"x-radixchat-user": "carol"}).status_code == 200
        assert ask(front).status_code == 200  # no header: the front end itself
        assert ask(plain, **{"x-radixchat-user": "openwebui"}).status_code == 200  # ignored: bob is bob
        bad = ask(front, **{"x-radixchat-user": "../alice"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-radixchat-user"
        bad = ask(front, **{"x-openwebui-user-id": "u 1/.."})  # named as the header it came in
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-openwebui-user-id", bad.text
        assert bad.json()["error"]["message"].startswith("x-openwebui-user-id: bad end user name")
    u1, carol = store.get_user("openwebui/u-1"), store.get_user("openwebui/carol")
    owners = [r.owner for r in engine.requests]
    assert owners == [owner_of(k) for k in (u1.cache_key, carol.cache_key, webui.cache_key, bob.cache_key)]
    assert len(set(owners)) == 4
    # their rows are their own, not the front end's
    assert store.flush()
    assert [store.usage(user=u).requests for u in (u1, carol, webui)] == [1, 1, 1]
    with pytest.raises(Invalid):
        store.end_user(u1, "dave")  # an end user vouches for nobody
    with pytest.raises(NotFound):
        store.get_user("bob/u-1")
    assert [k.front_end for k in store.list_api_keys(webui)] == [True]
    assert [k.front_end for k in store.list_api_keys(bob)] == [False]


@pytest.mark.slow
def test_the_admin_command_makes_a_front_end_key(tmp_path):
    db = str(tmp_path / "admin.db")
    cmd = [str(Path(sys.executable).with_name("radixchat"))]
    (tmp_path / "pw").write_text("a-long-password\n")
    add = subprocess.run(
        [*cmd, "users", "add", "openwebui", "--db", db, "--password-file", str(tmp_path / "pw")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert add.returncode == 0, add.stderr
    made = subprocess.run(
        [*cmd, "keys", "create", "openwebui", "--front-end", "--db", db], capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0 and made.stdout.strip(), made.stderr
    listed = subprocess.run([*cmd, "keys", "list", "--db", db], capture_output=True, text=True, timeout=60)
    assert "front end" in listed.stdout, listed.stdout
