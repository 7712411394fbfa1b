"""Page sign-ins outlive the server process: a restart signs nobody out, while signing out, a
password change and the expiry still end them, after a restart as before it."""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.clients import signed_in
from tests.support.server import Server, page_server, stop_clean


def status(url: str, http: httpx.Client) -> int:
    """/config for this client's cookies: 200 signed in, 401 not."""
    return httpx.get(url + "/config", cookies=http.cookies, timeout=30).status_code


@pytest.fixture
def first(tiny_model_dir, tmp_path):
    srv = page_server(tiny_model_dir, tmp_path)
    yield srv
    if srv.proc.poll() is None:
        stop_clean(srv)


def restart(srv, tiny_model_dir) -> Server:
    stop_clean(srv)
    again = Server(tiny_model_dir, srv.db)
    again.db = srv.db
    return again


@pytest.mark.slow
def test_a_restart_keeps_sign_ins_and_sign_out_ends_them_for_good(first, tiny_model_dir):
    alice, bob = signed_in(first.url, "alice"), signed_in(first.url, "bob")
    assert status(first.url, alice) == status(first.url, bob) == 200
    token = next(v for k, v in alice.cookies.items() if k.startswith("access-token"))
    with sqlite3.connect(first.db) as db:  # what a reader of the database finds: no token
        assert token not in repr(db.execute("SELECT * FROM page_sessions").fetchall())
    srv = restart(first, tiny_model_dir)
    try:
        assert status(srv.url, alice) == 200  # signed in still, without signing in again
        assert status(srv.url, bob) == 200
        headers = {"Origin": srv.url}  # the page's own sign-out link
        r = httpx.get(srv.url + "/logout", cookies=alice.cookies, headers=headers, timeout=30, follow_redirects=False)
        assert r.status_code in (302, 307), r.text
        assert status(srv.url, alice) == 401
        assert status(srv.url, bob) == 200  # her sign-out is hers alone
    finally:
        srv = restart(srv, tiny_model_dir)
    try:
        assert status(srv.url, alice) == 401  # and it stays ended across a restart
        assert status(srv.url, bob) == 200
    finally:
        stop_clean(srv)


@pytest.mark.slow
def test_a_password_change_or_the_expiry_ends_a_kept_sign_in(first, tiny_model_dir):
    alice, bob = signed_in(first.url, "alice"), signed_in(first.url, "bob")
    stop_clean(first)
    with Store(first.db) as store:  # while no server runs, as the admin command would
        store.set_password("alice", "a new long password")
    with sqlite3.connect(first.db) as db:
        db.execute("UPDATE page_sessions SET expires = 0 WHERE user = (SELECT id FROM users WHERE name = 'bob')")
    srv = Server(tiny_model_dir, first.db)
    try:
        assert status(srv.url, alice) == 401
        assert status(srv.url, bob) == 401
    finally:
        stop_clean(srv)
