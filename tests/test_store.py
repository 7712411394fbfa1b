"""The SQLite session store: users, keys, conversations, messages, metrics, on real files."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from radixchat.core.store import (
    MAX_ERROR_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_TITLE_CHARS,
    AlreadyExists,
    AuthFailed,
    Invalid,
    NotFound,
    RequestFigures,
    RequestRecord,
    Store,
    StoreError,
    auth,
)
from radixchat.core.store import schema as store_schema
from tests.support.cheap import cheap_scrypt
from tests.support.databases import database_at

CHEAP = cheap_scrypt()
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def alice(store):
    return store.create_user("alice", "alice-password")


@pytest.fixture
def bob(store):
    return store.create_user("bob", "bob-password")


def counts(store: Store) -> dict:
    t = store.totals()
    with sqlite3.connect(store.path) as c:
        t["api_keys"] = c.execute("SELECT count(*) FROM api_keys").fetchone()[0]
        t["revoked"] = c.execute("SELECT count(*) FROM api_keys WHERE revoked IS NOT NULL").fetchone()[0]
    return t


# ---- users and passwords ----


def test_default_password_hash_is_a_slow_kdf():
    assert auth.DEFAULT_SCRYPT.n * auth.DEFAULT_SCRYPT.r * 128 >= 16 << 20  # >= 16 MiB of memory
    assert auth.DEFAULT_SCRYPT.n * auth.DEFAULT_SCRYPT.p >= 2**16


def test_password_hashes_are_salted_and_carry_their_cost():
    a, b = auth.hash_password("hunter22", CHEAP), auth.hash_password("hunter22", CHEAP)
    assert a != b and a.startswith("scrypt$256$8$1$") and "hunter22" not in a
    assert auth.verify_password("hunter22", a) and auth.verify_password("hunter22", b)
    assert not auth.verify_password("hunter23", a)
    for broken in ("", "scrypt$", "md5$1$2$3$4$5", a.replace("scrypt$256", "scrypt$255"), "scrypt$x$8$1$a$b"):
        assert not auth.verify_password("hunter22", broken)


def test_users_create_and_authenticate(store, alice):
    assert store.authenticate("alice", "alice-password") == alice
    assert store.get_user("alice") == alice == store.get_user_by_id(alice.id)
    with pytest.raises(AuthFailed) as wrong:
        store.authenticate("alice", "alice-passwort")
    with pytest.raises(AuthFailed) as unknown:
        store.authenticate("mallory", "alice-password")
    assert str(wrong.value) == str(unknown.value) == "wrong user name or password"
    with pytest.raises(AlreadyExists, match="already exists"):
        store.create_user("ALICE", "another-password")  # names are case-insensitive
    store.set_password("alice", "new-password")
    store.authenticate("alice", "new-password")
    with pytest.raises(AuthFailed):
        store.authenticate("alice", "alice-password")
    assert [u.name for u in store.list_users()] == ["alice"]


def test_an_account_cannot_take_a_front_ends_end_user_name(store):
    """`a/b` names front end `a`'s end user `b`: an account of that name (with a password)
    took over what the front end said of `b` once `a` became a front end."""
    with pytest.raises(Invalid, match="'/' is kept for a front end's end users"):
        store.create_user("webui/dave", "dave-password")
    front = store.create_user("webui", "webui-password")
    assert store.end_user(front, "dave").name == "webui/dave"  # the front end's own requests make them


def test_a_keys_label_is_one_line(store, alice):
    with pytest.raises(Invalid, match="one line"):
        store.create_api_key(alice, "multi\nline")
    assert store.create_api_key(alice, "laptop – ünïcode")[0].label == "laptop – ünïcode"


def test_remove_user_takes_their_data_and_keeps_metrics(store, alice, bob):
    conv = store.create_conversation(alice, "mine")
    store.append_reply(alice, conv.id, "hi", RequestRecord(prompt_tokens=3, generated_tokens=1))
    store.create_api_key(alice)
    store.create_conversation(bob, "bob's")
    assert store.remove_user("alice") == 1
    t = counts(store)
    assert (t["users"], t["conversations"], t["messages"], t["api_keys"], t["requests"]) == (1, 1, 0, 0, 1)
    with pytest.raises(NotFound, match="user 'alice' not found"):
        store.remove_user("alice")


# ---- API keys ----


def test_api_keys_create_verify_revoke(store, alice):
    key, secret = store.create_api_key(alice, "laptop")
    assert secret.startswith("rc-") and len(secret) > 40 and key.visible == secret[:10]
    assert store.verify_api_key(secret) == alice
    store.flush()
    [listed] = store.list_api_keys(alice)
    assert listed.last_used is not None and listed.revoked is None and listed.label == "laptop"
    with sqlite3.connect(store.path) as c:  # only the hash is stored
        assert (
            c.execute("SELECT count(*) FROM api_keys WHERE key_hash = ?", [auth.api_key_hash(secret)]).fetchone()[0]
            == 1
        )
        dump = "\n".join(c.iterdump())
    assert secret not in dump and secret[10:] not in dump

    revoked = store.revoke_api_key(key.visible)
    assert revoked.revoked is not None
    with pytest.raises(AuthFailed, match="revoked"):
        store.verify_api_key(secret)
    assert store.revoke_api_key(secret).revoked == revoked.revoked  # again: no change
    for bad in ("", "rc-", "sk-" + secret[3:], secret[:-1], secret + "x", None):
        with pytest.raises(AuthFailed):
            store.verify_api_key(bad)


def test_revoke_only_own_keys_with_user(store, alice, bob):
    _key, secret = store.create_api_key(alice)
    with pytest.raises(NotFound):
        store.revoke_api_key(secret, user=bob)
    assert store.verify_api_key(secret) == alice
    with pytest.raises(Invalid, match="not an API key"):
        store.revoke_api_key("alice")


def test_a_user_holds_a_bounded_number_of_live_keys(store, alice, bob):
    """Keys were free to mint (40 in 2.3 s from the page), and what counts by key (the refusal
    throttle) counted a user that many times over."""
    from radixchat.core.store.accounts import MAX_LIVE_KEYS

    keys = [store.create_api_key(alice)[0] for _ in range(MAX_LIVE_KEYS)]
    with pytest.raises(Invalid, match=f"at most {MAX_LIVE_KEYS} API keys: revoke one first"):
        store.create_api_key(alice)
    store.create_api_key(bob)  # everyone has their own
    store.revoke_api_key(keys[0].visible)
    store.create_api_key(alice)  # a revoked key frees its place
    assert len([k for k in store.list_api_keys(alice) if k.revoked is None]) == MAX_LIVE_KEYS


# ---- conversations and messages ----


def test_conversations_list_rename_archive_search(store, alice):
    a = store.create_conversation(alice, "Python lists")
    b = store.create_conversation(alice, "100% _sure_")
    c = store.create_conversation(alice)
    assert c.title == "New chat"
    store.append_message(alice, a.id, "user", "bump")  # a is now the most recently updated
    assert [x.id for x in store.list_conversations(alice)] == [a.id, c.id, b.id]
    assert store.rename_conversation(alice, c.id, "  Rust\n  borrow  ").title == "Rust borrow"
    assert store.archive_conversation(alice, b.id).archived is not None
    assert [x.id for x in store.list_conversations(alice)] == [a.id, c.id]
    assert [x.id for x in store.list_conversations(alice, archived=True)] == [b.id]
    assert len(store.list_conversations(alice, archived=None)) == 3
    assert [x.id for x in store.list_conversations(alice, archived=None, search="PYTHON")] == [a.id]
    assert [x.id for x in store.list_conversations(alice, archived=None, search="%")] == [b.id]
    assert [x.id for x in store.list_conversations(alice, archived=None, search="_s")] == [b.id]
    assert store.list_conversations(alice, search="zzz") == []
    assert store.restore_conversation(alice, b.id).archived is None
    assert len(store.list_conversations(alice)) == 3
    store.delete_conversation(alice, b.id)
    with pytest.raises(NotFound):
        store.get_conversation(alice, b.id)


def test_history_reply_and_exports(store, alice):
    conv = store.create_conversation(alice, "Lists", system_prompt="Be brief.")
    q = store.append_message(alice, conv.id, "user", "What is a list?\n\n# not a heading")
    reply = store.append_reply(
        alice,
        conv.id,
        "An ordered sequence.",
        RequestRecord(
            model="tiny", prompt_tokens=12, cached_tokens=4, generated_tokens=5, ttft_ms=20.0, finish_reason="stop"
        ),
    )
    assert reply.request is not None and reply.role == "assistant"
    assert [m.id for m in store.history(alice, conv.id)] == [q.id, reply.id]
    assert store.prompt_messages(alice, conv.id) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a list?\n\n# not a heading"},
        {"role": "assistant", "content": "An ordered sequence."},
    ]
    with sqlite3.connect(store.path) as c:
        assert c.execute(
            "SELECT user, conversation, generated_tokens FROM requests WHERE id = ?", [reply.request]
        ).fetchone() == (alice.id, conv.id, 5)

    doc = json.loads(store.export_conversation(alice, conv.id, "json"))
    assert doc["title"] == "Lists" and doc["owner"] == "alice" and doc["system_prompt"] == "Be brief."
    assert [(m["role"], m["content"]) for m in doc["messages"]] == [
        ("user", "What is a list?\n\n# not a heading"),
        ("assistant", "An ordered sequence."),
    ]
    assert doc["created"].endswith("Z")
    md = store.export_conversation(alice, conv.id, "md")
    assert md.startswith("# Lists\n") and "## System\n\nBe brief." in md
    assert "## User\n\nWhat is a list?" in md and "## Assistant\n\nAn ordered sequence." in md
    with pytest.raises(Invalid, match="json or md"):
        store.export_conversation(alice, conv.id, "html")


def test_request_metrics_are_named_figures_as_recorded(store, alice):
    conv = store.create_conversation(alice)
    ok = RequestRecord(
        model="tiny",
        prompt_tokens=12,
        cached_tokens=4,
        generated_tokens=5,
        ttft_ms=20.5,
        decode_tps=31.25,
        finish_reason="stop",
    )
    bad = RequestRecord(finish_reason="error", error="x" * (MAX_ERROR_CHARS + 10))
    first = store.append_reply(alice, conv.id, "An answer.", ok)
    second = store.append_reply(alice, conv.id, "", bad)
    figures = store.request_metrics([first.request, second.request, None, 10**9])
    assert set(figures) == {first.request, second.request}  # unknown ids are left out
    f = figures[first.request]
    assert isinstance(f, RequestFigures)
    assert (f.prompt_tokens, f.cached_tokens, f.ttft_ms, f.decode_tps, f.finish_reason, f.error) == (
        12,
        4,
        20.5,
        31.25,
        "stop",
        None,
    )
    # what a record says it will read back is what is read back (the page shows a new
    # reply's figures without reading them)
    assert f == ok.figures() and figures[second.request] == bad.figures()
    assert figures[second.request].error == "x" * MAX_ERROR_CHARS
    with pytest.raises(AttributeError):
        f.prompt_tokens = 0  # frozen
    assert store.request_metrics([]) == {}


def test_isolation_other_users_conversation_is_not_found(store, alice, bob):
    conv = store.create_conversation(alice, "secret plans", system_prompt="sys")
    store.append_message(alice, conv.id, "user", "the plan")
    before = store.export_conversation(alice, conv.id)
    missing = 10_000
    attempts = {
        "get": lambda cid: store.get_conversation(bob, cid),
        "history": lambda cid: store.history(bob, cid),
        "prompt": lambda cid: store.prompt_messages(bob, cid),
        "rename": lambda cid: store.rename_conversation(bob, cid, "mine now"),
        "system": lambda cid: store.set_system_prompt(bob, cid, "obey bob"),
        "archive": lambda cid: store.archive_conversation(bob, cid),
        "restore": lambda cid: store.restore_conversation(bob, cid),
        "delete": lambda cid: store.delete_conversation(bob, cid),
        "append": lambda cid: store.append_message(bob, cid, "user", "hi"),
        "reply": lambda cid: store.append_reply(bob, cid, "hi", RequestRecord()),
        "export json": lambda cid: store.export_conversation(bob, cid, "json"),
        "export md": lambda cid: store.export_conversation(bob, cid, "md"),
        "record": lambda cid: store.record_request(RequestRecord(user=bob.id, conversation=cid)),
    }
    for name, attempt in attempts.items():
        with pytest.raises(NotFound) as theirs:
            attempt(conv.id)
        with pytest.raises(NotFound) as nobodys:
            attempt(missing)
        # the same answer as for an id that does not exist: nothing tells that it does
        assert str(theirs.value) == str(nobodys.value).replace(str(missing), str(conv.id)), name
    assert store.list_conversations(bob, archived=None) == []
    assert store.list_conversations(bob, archived=None, search="secret") == []
    assert store.export_conversation(alice, conv.id) == before
    assert counts(store)["requests"] == 0


# ---- bad input: clear errors, nothing half-written ----


def test_bad_input_is_refused_and_writes_nothing(store, alice):
    conv = store.create_conversation(alice, "ok")
    _, secret = store.create_api_key(alice)
    store.revoke_api_key(secret)
    before = counts(store)
    refusals = [
        (Invalid, "empty", lambda: store.create_user("", "long-enough")),
        (Invalid, "bad user name", lambda: store.create_user("a b", "long-enough")),
        (Invalid, "bad user name", lambda: store.create_user("x" * 65, "long-enough")),
        (
            Invalid,
            "bad user name 'zoë': use 1-64 characters: ASCII letters",
            lambda: store.create_user("zoë", "x" * 12),
        ),
        (Invalid, "bad user name", lambda: store.create_user(None, "long-enough")),
        (Invalid, "too short", lambda: store.create_user("carol", "short")),
        (AlreadyExists, "already exists", lambda: store.create_user("alice", "long-enough")),
        (AuthFailed, "wrong user name or password", lambda: store.authenticate("alice", "nope-nope")),
        (AuthFailed, "wrong user name or password", lambda: store.authenticate("", "")),
        (AuthFailed, "revoked", lambda: store.verify_api_key(secret)),
        (
            Invalid,
            "too long: 100,001 characters, the limit is 100,000",
            lambda: store.append_message(alice, conv.id, "user", "x" * (MAX_MESSAGE_CHARS + 1)),
        ),
        (
            Invalid,
            "too long",
            lambda: store.append_reply(
                alice, conv.id, "x" * (MAX_MESSAGE_CHARS + 1), RequestRecord(generated_tokens=1)
            ),
        ),
        (Invalid, "user message is empty", lambda: store.append_message(alice, conv.id, "user", "  \n")),
        (Invalid, "role must be one of", lambda: store.append_message(alice, conv.id, "tool", "x")),
        (Invalid, "must be text", lambda: store.append_message(alice, conv.id, "user", b"bytes")),
        (Invalid, "title is empty", lambda: store.rename_conversation(alice, conv.id, " ")),
        (Invalid, "title is too long", lambda: store.rename_conversation(alice, conv.id, "t" * (MAX_TITLE_CHARS + 1))),
        (Invalid, "title is too long", lambda: store.create_conversation(alice, "t" * 201)),
        (NotFound, "user 9999 not found", lambda: store.create_conversation(9999, "ghost")),
        (NotFound, "user 'nobody' not found", lambda: store.remove_user("nobody")),
        (
            NotFound,
            "request 12345 not found",
            lambda: store.append_message(alice, conv.id, "assistant", "x", request=12345),
        ),
        (Invalid, "prompt_tokens", lambda: RequestRecord(prompt_tokens=-1)),
        (Invalid, "ttft_ms", lambda: RequestRecord(ttft_ms=float("nan"))),
        (Invalid, "bucket_s", lambda: store.stats(window_s=60, bucket_s=0)),
    ]
    for exc, text, call in refusals:
        with pytest.raises(exc) as e:
            call()
        assert text in str(e.value) and "\n" not in str(e.value)
        assert counts(store) == before, text
    assert store.get_conversation(alice, conv.id).title == "ok"
    # the limit itself is allowed
    store.append_message(alice, conv.id, "user", "x" * MAX_MESSAGE_CHARS)


def test_reply_and_its_metrics_are_written_together_or_not_at_all(store, alice, monkeypatch):
    conv = store.create_conversation(alice)
    before = counts(store)

    def fail(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store, "_insert_message", fail)
    with pytest.raises(RuntimeError):
        store.append_reply(alice, conv.id, "reply", RequestRecord(generated_tokens=3))
    assert counts(store) == before  # the request row inserted first was rolled back
    monkeypatch.undo()
    store.append_reply(alice, conv.id, "reply", RequestRecord(generated_tokens=3))
    assert counts(store)["requests"] == before["requests"] + 1


# ---- metrics ----


def test_stats_buckets_percentiles_and_cache_ratio(store, alice):
    t0 = 1_800_000_000.0  # a minute boundary
    for i, ttft in enumerate([10, 20, 30, 40, 100]):
        store.record_request(
            RequestRecord(
                user=alice.id,
                created=t0 + i,
                ttft_ms=ttft,
                prompt_tokens=100,
                cached_tokens=50,
                generated_tokens=10,
                decode_tps=20.0,
                finish_reason="stop",
            )
        )
    store.record_request(RequestRecord(created=t0 + 125, prompt_tokens=10, error="boom", finish_reason="error"))
    buckets = store.stats(window_s=180, bucket_s=60, now=t0 + 170)
    assert [b.start for b in buckets] == [t0 - 60, t0, t0 + 60, t0 + 120]
    empty, first, gap, last = buckets
    assert (empty.requests, empty.ttft_p50_ms, empty.cache_hit_ratio) == (0, None, None)
    assert first.requests == 5 and first.errors == 0
    assert first.ttft_p50_ms == 30 and first.ttft_p95_ms == pytest.approx(88.0)
    assert first.cache_hit_ratio == 0.5 and first.generated_tokens == 50 and first.decode_tps == 20.0
    assert gap.requests == 0
    assert (last.requests, last.errors, last.ttft_p50_ms, last.cache_hit_ratio) == (1, 1, None, 0.0)
    t = store.totals()
    assert (t["requests"], t["errors"], t["users"], t["prompt_tokens"], t["cached_tokens"]) == (6, 1, 1, 510, 250)


def test_record_from_usage_duck_types_the_engine_usage():
    class Usage:  # core.seam.requests.Usage without importing the engine side
        prompt_tokens, cached_tokens, generated_tokens = 9, 4, 3
        queue_ms, ttft_ms, total_ms, decode_tps = 1.0, 2.0, 3.0, 4.0

    r = RequestRecord.from_usage(Usage(), model="m", finish_reason="length")
    assert (r.prompt_tokens, r.cached_tokens, r.ttft_ms, r.model, r.finish_reason) == (9, 4, 2.0, "m", "length")


def test_async_record_returns_while_another_writer_holds_the_lock(store, alice):
    locked, release = threading.Event(), threading.Event()

    def hold_write_lock():
        c = sqlite3.connect(store.path, isolation_level=None)
        c.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(30)
        c.execute("COMMIT")
        c.close()

    holder = threading.Thread(target=hold_write_lock)
    holder.start()
    assert locked.wait(10)
    for i in range(50):  # the engine thread's call: must come back although nobody can write
        store.record_request_async(RequestRecord(user=alice.id, generated_tokens=i))
    assert not release.is_set() and holder.is_alive()
    release.set()
    holder.join()
    assert store.flush(30)
    assert store.totals()["requests"] == 50 and store.async_errors == 0 == store.dropped


def test_async_record_of_a_deleted_conversation_keeps_the_metrics(store, alice):
    conv = store.create_conversation(alice)
    store.delete_conversation(alice, conv.id)
    store.record_request_async(RequestRecord(user=alice.id, conversation=conv.id, generated_tokens=7))
    assert store.flush()
    assert store.totals()["generated_tokens"] == 7 and store.async_errors == 0


# ---- threads ----


def test_16_threads_x_200_mixed_operations(tmp_path):
    store = Store(tmp_path / "busy.db", scrypt=CHEAP)
    n_threads, n_ops = 16, 200
    users = [store.create_user(f"user{t}", "password-123") for t in range(n_threads)]
    keys = [store.create_api_key(u)[1] for u in users]
    errors, written = [], [None] * n_threads
    start = threading.Barrier(n_threads)

    def work(t):
        me = users[t]
        mine = {"messages": [], "convs": [], "requests": 0}
        try:
            start.wait()
            conv = store.create_conversation(me, f"thread {t}")
            mine["convs"].append(conv.id)
            for i in range(n_ops):
                op = i % 8
                if op in (0, 1):
                    mine["messages"].append(store.append_message(me, conv.id, "user", f"t{t} m{i}").id)
                elif op == 2:
                    m = store.append_reply(me, conv.id, f"t{t} r{i}", RequestRecord(generated_tokens=1))
                    mine["messages"].append(m.id)
                    mine["requests"] += 1
                elif op == 3:
                    store.record_request_async(RequestRecord(user=me.id, conversation=conv.id))
                    mine["requests"] += 1
                elif op == 4:
                    assert [m.id for m in store.history(me, conv.id)] == mine["messages"]
                elif op == 5:
                    assert {c.id for c in store.list_conversations(me)} == set(mine["convs"])
                elif op == 6:
                    conv = store.create_conversation(me, f"thread {t} #{i}")
                    mine["convs"].append(conv.id)
                    mine["messages"] = []
                else:
                    assert store.verify_api_key(keys[t]) == me
                    store.rename_conversation(me, conv.id, f"renamed {i}")
        except Exception as e:
            errors.append(f"thread {t}: {type(e).__name__}: {e}")
        written[t] = mine

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert store.flush(60)
    store.close()

    reopened = Store(tmp_path / "busy.db", scrypt=CHEAP)
    for u, mine in zip(users, written):
        convs = reopened.list_conversations(u)
        assert {c.id for c in convs} == set(mine["convs"])
        assert [m.id for m in reopened.history(u, mine["convs"][-1])] == mine["messages"]
    t = reopened.totals()
    assert t["requests"] == sum(m["requests"] for m in written)
    assert t["conversations"] == sum(len(m["convs"]) for m in written)
    assert reopened.async_errors == 0 and reopened.dropped == 0
    reopened.close()


# ---- schema and migrations ----


def old_database(path, version: int, message: str) -> None:
    """A database file at schema `version` holding olga, her 'old chat' and its one message."""
    c = sqlite3.connect(path, isolation_level=None)
    assert store_schema.migrate(c, target=version) == (0, version)
    c.execute(
        "INSERT INTO users (name, password_hash, created) VALUES ('olga', ?, 1.0)",
        [auth.hash_password("olga-password", CHEAP)],
    )
    c.execute("INSERT INTO conversations (owner, title, created, updated) VALUES (1, 'old chat', 1.0, 1.0)")
    c.execute("INSERT INTO messages (conversation, role, content, created) VALUES (1, 'user', ?, 1.0)", [message])
    c.close()


def test_old_schema_migrates_forward_keeping_rows(tmp_path):
    path = tmp_path / "old.db"
    old_database(path, 1, "hello")

    store = Store(path, scrypt=CHEAP)
    assert store.migrated_from == 1
    olga = store.authenticate("olga", "olga-password")
    assert [m.content for m in store.history(olga, 1)] == ["hello"]
    reply = store.append_reply(olga, 1, "hi olga", RequestRecord(generated_tokens=2))  # v2 tables
    store.create_api_key(olga)
    store.close()

    def schema():
        with sqlite3.connect(path) as c:
            return (
                c.execute("PRAGMA user_version").fetchone()[0],
                c.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall(),
            )

    once = schema()
    again = Store(path, scrypt=CHEAP)
    assert again.migrated_from == store_schema.LATEST and once[0] == store_schema.LATEST
    assert [m.request for m in again.history(olga, 1)] == [None, reply.request]
    again.close()
    assert schema() == once
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_many_openers_of_a_new_file_migrate_it_once(tmp_path):
    path, stores, errors = tmp_path / "new.db", [], []

    def open_it():
        try:
            stores.append(Store(path, scrypt=CHEAP))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=open_it) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and sorted(s.migrated_from for s in stores) == [0] + [store_schema.LATEST] * 5
    for s in stores:
        s.close()


def test_newer_schema_or_not_a_database_is_refused(tmp_path):
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as c:
        c.execute(f"PRAGMA user_version = {store_schema.LATEST + 1}")
    with pytest.raises(StoreError, match="newer than this radixchat"):
        Store(newer, scrypt=CHEAP)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        Store(junk, scrypt=CHEAP)


def test_new_file_is_private_and_closed_store_refuses(tmp_path):
    store = Store(tmp_path / "private" / "chat.db", scrypt=CHEAP)
    assert (os.stat(store.path).st_mode & 0o777) == 0o600
    assert (os.stat(store.path.parent).st_mode & 0o777) == 0o700
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.list_users()
    store.record_request_async(RequestRecord())  # never raises, for the engine thread
    assert store.dropped == 1


@pytest.mark.slow
def test_store_imports_neither_mlx_nor_http():
    code = (
        "import sys, radixchat.core.store, radixchat.webui.cli.admin; "
        "bad = [m for m in ('mlx', 'mlx_lm', 'fastapi', 'starlette', 'uvicorn', 'gradio', 'httpx') "
        "if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_writers_take_turns(store, alice):
    """A thread writing in a loop must not starve another writer (SQLite's busy handler alone
    let one get 20x the commits of the other)."""
    busy = store.create_conversation(alice, "busy")
    calm = store.create_conversation(alice, "calm")
    stop = threading.Event()
    loud = []

    def hammer():
        while not stop.is_set():
            loud.append(store.append_message(alice, busy.id, "user", "x").id)

    t = threading.Thread(target=hammer)
    t.start()
    while len(loud) < 5:
        threading.Event().wait(0.001)
    before = len(loud)
    for i in range(20):
        store.append_message(alice, calm.id, "user", f"calm {i}")
    during = len(loud) - before
    stop.set()
    t.join()
    assert during <= 20 * 3, f"the looping writer made {during} commits while the other made 20"


def test_opening_waits_for_another_connection_that_is_writing_a_new_file(tmp_path):
    """SQLite refuses the switch to WAL at once, without its busy handler, while another
    connection holds a write lock on a file still in rollback mode (several servers or
    threads creating one file together): the store waits for it like any other write."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE other_opener (x)")
    threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
    s = Store(path, scrypt=CHEAP, timeout_s=10)
    try:
        assert s.migrated_from == 0
    finally:
        s.close()
        holder.close()


# ---- full-text search ----


def test_search_finds_a_word_inside_a_message_and_in_a_title(store, alice):
    trip = store.create_conversation(alice, "Trip planning")
    store.append_message(alice, trip.id, "user", "Should we visit the aquarium in Lisbon next spring?")
    other = store.create_conversation(alice, "Groceries")
    store.append_message(alice, other.id, "user", "milk and eggs")
    [hit] = store.search_conversations(alice, "aquarium")
    assert hit.conversation.id == trip.id and "aquarium" in hit.snippet
    assert [h.conversation.id for h in store.search_conversations(alice, "GROCERIES")] == [other.id]
    assert [h.conversation.id for h in store.search_conversations(alice, "lisbon spring")] == [trip.id]
    assert [h.conversation.id for h in store.search_conversations(alice, "aquar")] == [trip.id]  # as typed so far
    assert store.search_conversations(alice, "lisbon eggs") == []  # every word must occur
    # archived ones too, and a rename is indexed at once
    store.archive_conversation(alice, trip.id)
    assert [h.conversation.id for h in store.search_conversations(alice, "aquarium")] == [trip.id]
    store.rename_conversation(alice, other.id, "Shopping")
    assert store.search_conversations(alice, "groceries") == []
    assert [h.conversation.id for h in store.search_conversations(alice, "shopping")] == [other.id]
    for empty in ("", "   ", "\n"):
        assert store.search_conversations(alice, empty) == []


def test_search_ranks_better_matches_first(store, alice):
    once = store.create_conversation(alice, "Long chat")
    store.append_message(
        alice,
        once.id,
        "user",
        "A long message about many things: " + "filler words " * 60 + "and one mention of kayak at the end.",
    )
    often = store.create_conversation(alice, "Short chat")
    store.append_message(alice, often.id, "user", "kayak kayak: which kayak should I buy?")
    titled = store.create_conversation(alice, "Kayak")
    store.append_message(alice, titled.id, "user", "paddles")
    hits = store.search_conversations(alice, "kayak")
    assert [h.conversation.id for h in hits] == [titled.id, often.id, once.id]
    assert "kayak" in hits[2].snippet and len(hits[2].snippet) < 200  # a short piece, not the message
    assert len(store.search_conversations(alice, "kayak", limit=2)) == 2


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '""',
        "*",
        "AND",
        "OR NOT",
        "-",
        "a -b",
        ":",
        "title:x",
        "content:kayak",
        "NEAR(a b)",
        "(",
        ")",
        "^kayak",
        "kayak*",
        '"kayak',
        "{content}: kayak",
        "+",
        "'",
        "\\",
        "%_",
        "\x00",
        "kayak AND",
        "AND kayak OR",
    ],
)
def test_search_takes_fts_syntax_as_text_and_never_raises(store, alice, query):
    conv = store.create_conversation(alice, "Boats")
    store.append_message(alice, conv.id, "user", "a kayak AND a canoe, not NEAR the title")
    hits = store.search_conversations(alice, query)
    assert all(h.conversation.id == conv.id for h in hits)
    if query in ("^kayak", "kayak*", '"kayak', "kayak AND"):  # its words are all in the message
        assert [h.conversation.id for h in hits] == [conv.id]
    if query in ("content:kayak", "{content}: kayak", "AND kayak OR"):  # no column filter, no operator
        assert hits == []


def test_search_never_returns_another_users_conversations(store, alice, bob):
    mine = store.create_conversation(alice, "Alice's notes")
    store.append_message(alice, mine.id, "user", "the zeppelin plan, alice's version")
    theirs = store.create_conversation(bob, "Bob's notes")
    store.append_message(bob, theirs.id, "user", "the zeppelin plan, bob's version")
    store.append_reply(bob, theirs.id, "zeppelin zeppelin zeppelin", RequestRecord())
    bobs_titled = store.create_conversation(bob, "zeppelin")
    assert [h.conversation.id for h in store.search_conversations(alice, "zeppelin")] == [mine.id]
    assert {h.conversation.id for h in store.search_conversations(bob, "zeppelin")} == {theirs.id, bobs_titled.id}
    assert all("bob" not in h.snippet for h in store.search_conversations(alice, "zeppelin plan version"))
    assert store.search_conversations(alice, "bob") == []


def test_deleting_a_conversation_removes_it_from_the_index(store, alice, bob):
    conv = store.create_conversation(alice, "Walrus facts")
    store.append_message(alice, conv.id, "user", "walrus tusks")
    store.append_reply(alice, conv.id, "a walrus uses its tusks", RequestRecord())
    gone_with_user = store.create_conversation(bob, "walrus too")
    store.append_message(bob, gone_with_user.id, "user", "walrus")
    store.delete_conversation(alice, conv.id)
    assert store.search_conversations(alice, "walrus") == []
    store.remove_user("bob")
    with sqlite3.connect(store.path) as c:  # the index itself, not only the join, holds nothing
        assert c.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'walrus'").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM titles_fts WHERE titles_fts MATCH 'walrus'").fetchone() == (0,)
        assert c.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)") is not None


def test_a_database_from_before_search_gets_the_index_on_open(tmp_path):
    path = tmp_path / "v2.db"
    old_database(path, 2, "the old narwhal story")
    store = Store(path, scrypt=CHEAP)
    assert store.migrated_from == 2
    olga = store.authenticate("olga", "olga-password")
    [hit] = store.search_conversations(olga, "narwhal")
    assert hit.conversation.id == 1 and "narwhal" in hit.snippet
    assert [h.conversation.id for h in store.search_conversations(olga, "old chat")] == [1]
    store.append_message(olga, 1, "user", "a new orca story")
    assert [h.conversation.id for h in store.search_conversations(olga, "orca")] == [1]
    store.close()


def test_share_owner_only_same_token_until_revoked(store, alice, bob):
    conv = store.create_conversation(alice, "plans")
    store.append_message(alice, conv.id, "user", "hello <b>bob</b>")
    with pytest.raises(NotFound):
        store.share_conversation(bob, conv.id)
    token = store.share_conversation(alice, conv.id)
    assert len(token) >= 32 and store.share_conversation(alice, conv.id) == token
    assert store.share_token(alice, conv.id) == token
    title, msgs = store.shared_conversation(token)
    assert title == "plans" and [m.content for m in msgs] == ["hello <b>bob</b>"]
    with pytest.raises(NotFound):
        store.revoke_share(bob, conv.id)
    with pytest.raises(NotFound):
        store.share_token(bob, conv.id)
    assert store.shared_conversation(token)[0] == "plans"  # bob's attempt changed nothing
    assert store.revoke_share(alice, conv.id) is True
    assert store.share_token(alice, conv.id) is None
    for wrong in (token, "", "x" * 32, token[:-1], None):
        with pytest.raises(NotFound):
            store.shared_conversation(wrong)
    again = store.share_conversation(alice, conv.id)
    assert again != token and store.shared_conversation(again)[0] == "plans"
    store.delete_conversation(alice, conv.id)
    with pytest.raises(NotFound):
        store.shared_conversation(again)


# ---- the page's sidebar: delete with undo, a fresh chat, the open conversation ----


def test_delete_hides_at_once_undo_brings_back_and_later_it_is_gone(store, alice, bob):
    conv = store.create_conversation(alice, "Walrus plans")
    store.append_message(alice, conv.id, "user", "walrus tusks")
    token = store.share_conversation(alice, conv.id)
    with pytest.raises(NotFound):
        store.mark_deleted(bob, conv.id)  # not his to delete
    assert store.mark_deleted(alice, conv.id).title == "Walrus plans"
    # gone from every read, its owner's too: list, search, history, its link, export
    assert store.list_conversations(alice, archived=None) == []
    assert store.search_conversations(alice, "walrus") == []
    for read in (
        lambda: store.history(alice, conv.id),
        lambda: store.shared_conversation(token),
        lambda: store.export_conversation(alice, conv.id),
        lambda: store.get_conversation(alice, conv.id),
        lambda: store.append_message(alice, conv.id, "user", "more"),
    ):
        with pytest.raises(NotFound):
            read()
    with pytest.raises(NotFound):
        store.undelete_conversation(bob, conv.id)  # only its owner brings it back
    back = store.undelete_conversation(alice, conv.id)
    assert back.id == conv.id and [m.content for m in store.history(alice, conv.id)] == ["walrus tusks"]
    assert store.shared_conversation(token)[0] == "Walrus plans"
    with pytest.raises(NotFound):
        store.undelete_conversation(alice, conv.id)  # nothing to undo now

    # past the undo window it can't come back, and the next delete removes it for good
    store.mark_deleted(alice, conv.id)
    with sqlite3.connect(store.path) as c:
        c.execute("UPDATE conversations SET deleted = deleted - 3600 WHERE id = ?", [conv.id])
    with pytest.raises(NotFound):
        store.undelete_conversation(alice, conv.id)
    other = store.create_conversation(bob, "bob's")
    store.mark_deleted(bob, other.id)
    with sqlite3.connect(store.path) as c:
        assert c.execute("SELECT id FROM conversations").fetchall() == [(other.id,)]
        assert c.execute("SELECT count(*) FROM messages").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'walrus'").fetchone() == (0,)
    assert store.purge_deleted(older_than_s=0) == 1


def test_fresh_conversation_reuses_an_empty_untitled_one(store, alice, bob):
    first = store.fresh_conversation(alice, "Be brief.")
    assert first.system_prompt == "Be brief." and first.title == "New chat"
    again = store.fresh_conversation(alice)  # still empty: the same one, now without a prompt
    assert again.id == first.id and again.system_prompt == ""
    assert store.fresh_conversation(alice, exclude=[first.id]).id != first.id  # unless it is taken
    store.append_message(alice, first.id, "user", "hello")
    named = store.create_conversation(alice, "Empty but named")
    took = store.fresh_conversation(alice)
    assert took.id not in (first.id, named.id)
    assert store.fresh_conversation(bob).owner == bob.id  # never another user's empty one
    with pytest.raises(Invalid):
        store.fresh_conversation(alice, "x" * 20_001)


def test_the_open_conversation_is_remembered_per_user(store, alice, bob):
    assert store.open_conversation(alice) is None
    a = store.create_conversation(alice, "a")
    store.set_open_conversation(alice, a.id)
    assert store.open_conversation(alice).id == a.id and store.open_conversation(bob) is None
    with pytest.raises(NotFound):
        store.set_open_conversation(bob, a.id)  # not his
    store.mark_deleted(alice, a.id)
    assert store.open_conversation(alice) is None
    store.undelete_conversation(alice, a.id)
    assert store.open_conversation(alice).id == a.id
    store.delete_conversation(alice, a.id)
    assert store.open_conversation(alice) is None
    store.set_open_conversation(alice, None)


def test_a_v4_database_migrates_to_v5_keeping_its_chats(tmp_path):
    path = tmp_path / "v4.db"
    old_database(path, 4, "the old narwhal story")
    store = Store(path, scrypt=CHEAP)
    assert store.migrated_from == 4 and store_schema.LATEST >= 5
    olga = store.authenticate("olga", "olga-password")
    assert [c.title for c in store.list_conversations(olga)] == ["old chat"]
    assert store.open_conversation(olga) is None
    store.set_open_conversation(olga, 1)
    assert store.open_conversation(olga).id == 1
    store.mark_deleted(olga, 1)
    assert store.search_conversations(olga, "narwhal") == []
    store.undelete_conversation(olga, 1)
    assert [h.conversation.id for h in store.search_conversations(olga, "narwhal")] == [1]
    store.close()
    with sqlite3.connect(path) as c:
        assert {r[1] for r in c.execute("PRAGMA table_info(conversations)")} >= {"deleted", "archived"}
        assert "open_conversation" in {r[1] for r in c.execute("PRAGMA table_info(users)")}


# ---- branches: edit a message, answer again, show another version (schema V6) ----


def texts(messages) -> list[str]:
    return [m.content for m in messages]


def test_a_v5_database_migrates_to_branches_with_regenerated_answers_as_versions(tmp_path):
    """A V5 file as the old schema wrote it: olga's chat with an answer regenerated (two replies
    in a row, the newer one shown) and a turn after it; and a second chat that starts with two
    replies (as the API may have stored them)."""
    path = tmp_path / "v5.db"
    old_database(path, 5, "What is a list?")
    with sqlite3.connect(path, isolation_level=None) as c:
        c.execute("INSERT INTO conversations (owner, title, created, updated) VALUES (1, 'replies', 1.0, 1.0)")
        for conv, role, text in [
            (1, "assistant", "A box."),
            (1, "assistant", "A sequence."),
            (1, "user", "And a dict?"),
            (1, "assistant", "A mapping."),
            (2, "assistant", "hello"),
            (2, "assistant", "hi"),
        ]:
            c.execute(
                "INSERT INTO messages (conversation, role, content, created) VALUES (?, ?, ?, 2.0)", [conv, role, text]
            )
    store = Store(path, scrypt=CHEAP)
    assert store.migrated_from == 5 and store_schema.LATEST >= 6
    olga = store.authenticate("olga", "olga-password")
    # the branch the page showed: the newest reply to the first message, then what followed it
    assert texts(store.history(olga, 1)) == ["What is a list?", "A sequence.", "And a dict?", "A mapping."]
    branch = store.branch(olga, 1)
    assert [len(branch.versions[m.id]) for m in branch.messages] == [1, 2, 1, 1]
    assert [m.parent for m in branch.messages] == [None, 1, 3, 4]
    # the older reply is a version of the answer, with nothing after it
    shown = store.show_version(olga, 1, 2)
    assert texts(shown.messages) == ["What is a list?", "A box."]
    assert store.prompt_messages(olga, 1)[-1] == {"role": "assistant", "content": "A box."}
    assert texts(store.show_version(olga, 1, 3).messages)[-1] == "A mapping."  # back, with its turns
    assert texts(store.history(olga, 2)) == ["hi"] and store.branch(olga, 2).versions[7] == (6, 7)
    # new messages go on from the branch in view
    store.append_message(olga, 1, "user", "Thanks")
    assert store.history(olga, 1)[-1].parent == 5
    store.close()
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT leaf FROM conversations ORDER BY id").fetchall() == [(8,), (7,)]
        assert "parent" in {r[1] for r in c.execute("PRAGMA table_info(messages)")}


def test_edit_and_answer_again_branch_and_each_version_comes_back(store, alice):
    conv = store.create_conversation(alice, "sets", system_prompt="Be brief.")
    q1 = store.append_message(alice, conv.id, "user", "What is a set?")
    a1 = store.append_reply(alice, conv.id, "Unique items.", RequestRecord())
    q2 = store.append_message(alice, conv.id, "user", "Ordered?")
    a2 = store.append_reply(alice, conv.id, "No.", RequestRecord())
    # edit the first question: a new version without the old one's turns
    e1 = store.edit_message(alice, conv.id, q1.id, "What is a frozenset?")
    assert e1.parent is None and texts(store.history(alice, conv.id)) == ["What is a frozenset?"]
    f1 = store.append_reply(alice, conv.id, "An immutable set.", RequestRecord(), parent=e1.id)
    # answer the edited question twice more: three versions of that answer, the newest shown
    f2 = store.append_reply(alice, conv.id, "A set you can't change.", RequestRecord(), parent=e1.id)
    f3 = store.append_reply(alice, conv.id, "Hashable set.", RequestRecord(), parent=e1.id)
    branch = store.branch(alice, conv.id)
    assert [m.id for m in branch.messages] == [e1.id, f3.id]
    assert branch.versions == {e1.id: (q1.id, e1.id), f3.id: (f1.id, f2.id, f3.id)}
    assert store.prompt_messages(alice, conv.id)[1:] == [
        {"role": "user", "content": "What is a frozenset?"},
        {"role": "assistant", "content": "Hashable set."},
    ]
    # browse the answers: what is shown is what the model sees next
    assert texts(store.show_version(alice, conv.id, f1.id).messages) == ["What is a frozenset?", "An immutable set."]
    assert store.prompt_messages(alice, conv.id)[-1]["content"] == "An immutable set."
    nxt = store.append_message(alice, conv.id, "user", "Why immutable?")
    assert nxt.parent == f1.id
    # the first version of the question comes back with its own turns, as they were
    shown = store.show_version(alice, conv.id, q1.id)
    assert [m.id for m in shown.messages] == [q1.id, a1.id, q2.id, a2.id]
    assert shown.versions[q1.id] == (q1.id, e1.id) and shown.versions[a1.id] == (a1.id,)
    # and the edited one with the branch last written through it (its newest message)
    assert [m.id for m in store.show_version(alice, conv.id, e1.id).messages] == [e1.id, f1.id, nxt.id]
    # a version deep in the tree: an edit of the second question of the first branch
    store.show_version(alice, conv.id, q1.id)
    e2 = store.edit_message(alice, conv.id, q2.id, "Sorted?")
    assert [m.id for m in store.history(alice, conv.id)] == [q1.id, a1.id, e2.id]
    assert store.branch(alice, conv.id).versions[e2.id] == (q2.id, e2.id)
    # Branch.grow (what the page builds without reading back) agrees with the store
    before = store.branch(alice, conv.id)
    reply = store.append_reply(alice, conv.id, "No.", RequestRecord(), parent=e2.id)
    assert before.grow(reply) == store.branch(alice, conv.id)
    again = store.append_reply(alice, conv.id, "Not sorted.", RequestRecord(), parent=e2.id)
    assert before.grow(reply).grow(again) == store.branch(alice, conv.id)


def test_exports_and_shared_links_follow_the_branch_in_view(store, alice):
    conv = store.create_conversation(alice, "pets")
    q = store.append_message(alice, conv.id, "user", "Cats-1111 or dogs?")
    store.append_reply(alice, conv.id, "Cats.", RequestRecord())
    edited = store.edit_message(alice, conv.id, q.id, "Dogs-2222 or cats?")
    store.append_reply(alice, conv.id, "Dogs.", RequestRecord(), parent=edited.id)
    token = store.share_conversation(alice, conv.id)

    def everywhere() -> list[str]:
        doc = json.loads(store.export_conversation(alice, conv.id, "json"))
        md = store.export_conversation(alice, conv.id, "md")
        shared = texts(store.shared_conversation(token)[1])
        assert [m["content"] for m in doc["messages"]] == shared
        assert all(t in md for t in shared)
        return shared + [md]

    now = everywhere()
    assert now[:2] == ["Dogs-2222 or cats?", "Dogs."] and "Cats" not in now[2]
    store.show_version(alice, conv.id, q.id)
    now = everywhere()
    assert now[:2] == ["Cats-1111 or dogs?", "Cats."] and "Dogs" not in now[2]
    # search still finds the words of every branch
    assert [h.conversation.id for h in store.search_conversations(alice, "Dogs-2222")] == [conv.id]


def test_another_users_messages_are_not_found_for_any_branch_call(store, alice, bob):
    mine = store.create_conversation(alice, "mine")
    q = store.append_message(alice, mine.id, "user", "alice's secret question")
    a = store.append_reply(alice, mine.id, "alice's answer", RequestRecord())
    theirs = store.create_conversation(bob, "theirs")
    b = store.append_message(bob, theirs.id, "user", "bob's question")
    before = texts(store.history(alice, mine.id))
    # bob on alice's conversation
    for call in (
        lambda: store.show_version(bob, mine.id, q.id),
        lambda: store.branch(bob, mine.id),
        lambda: store.edit_message(bob, mine.id, q.id, "mine now"),
        lambda: store.append_reply(bob, mine.id, "x", RequestRecord(), parent=q.id),
    ):
        with pytest.raises(NotFound):
            call()
    # bob naming alice's messages in his own conversation: the same "not found"
    for call in (
        lambda: store.show_version(bob, theirs.id, a.id),
        lambda: store.edit_message(bob, theirs.id, q.id, "grafted"),
        lambda: store.append_message(bob, theirs.id, "user", "grafted", after=a.id),
        lambda: store.append_reply(bob, theirs.id, "x", RequestRecord(), parent=q.id),
    ):
        with pytest.raises(NotFound) as e:
            call()
        assert "secret" not in str(e.value)
    # and alice naming a message of her other conversation, or nonsense
    other = store.create_conversation(alice, "other")
    for bad in (b.id, 10**9, "x", None, -1):
        with pytest.raises(NotFound):
            store.show_version(alice, other.id, bad)
    with pytest.raises(Invalid, match="only a message of the user"):
        store.edit_message(alice, mine.id, a.id, "rewrite the answer")
    with pytest.raises(Invalid):
        store.edit_message(alice, mine.id, q.id, "   ")
    assert texts(store.history(alice, mine.id)) == before
    assert texts(store.history(bob, theirs.id)) == ["bob's question"]
    assert store.totals()["messages"] == 3


# ---- a conversation's model (schema V9) ----


def test_a_conversation_keeps_the_model_it_chats_with(store, alice, bob):
    plain = store.create_conversation(alice, "first model's")
    assert plain.model is None  # the server's first model
    picked = store.create_conversation(alice, "Lists", model="second-random")
    store.append_message(alice, picked.id, "user", "what is a walrus list?")
    assert store.get_conversation(alice, picked.id).model == "second-random"
    assert store.set_conversation_model(alice, plain.id, "  third  ").model == "third"
    assert store.set_conversation_model(alice, plain.id, None).model is None
    # every read of a conversation carries it: the list, a search, an export
    assert {c.id: c.model for c in store.list_conversations(alice)} == {plain.id: None, picked.id: "second-random"}
    assert [h.conversation.model for h in store.search_conversations(alice, "walrus")] == ["second-random"]
    assert json.loads(store.export_conversation(alice, picked.id, "json"))["model"] == "second-random"
    with pytest.raises(NotFound):
        store.set_conversation_model(bob, picked.id, "third")  # not his: as if it were not there
    for bad in ("", "   ", "x" * 257, 7):
        with pytest.raises(Invalid):
            store.set_conversation_model(alice, picked.id, bad)
    assert store.get_conversation(alice, picked.id).model == "second-random"
    # a new chat takes the model picked for it, also when it reuses an empty one
    fresh = store.fresh_conversation(alice, model="second-random")
    assert fresh.model == "second-random" and store.get_conversation(alice, fresh.id).model == "second-random"
    again = store.fresh_conversation(alice)
    assert again.id == fresh.id and again.model is None


def test_a_v8_database_migrates_to_v9_with_every_chat_on_the_first_model(tmp_path):
    path = tmp_path / "v8.db"
    old_database(path, 8, "the old narwhal story")
    store = Store(path, scrypt=CHEAP)
    assert store.migrated_from == 8 and store_schema.LATEST >= 9
    olga = store.authenticate("olga", "olga-password")
    assert [(c.title, c.model) for c in store.list_conversations(olga)] == [("old chat", None)]
    assert store.set_conversation_model(olga, 1, "second-random").model == "second-random"
    assert texts(store.history(olga, 1)) == ["the old narwhal story"]
    store.close()


def test_a_users_browser_key_is_never_another_users_not_even_one_of_the_same_name(store):
    first = store.browser_key(store.create_user("erin", "erin-password").name)
    other = store.browser_key(store.create_user("fay", "fay-password").name)
    store.remove_user("erin")
    again = store.browser_key(store.create_user("erin", "erin-password").name)
    assert len({first, other, again}) == 3 and all(len(k) == 32 for k in (first, other, again))
    assert store.browser_key("erin") == again and store.browser_key("nobody") is None


def test_a_v13_database_gives_each_user_a_browser_key(tmp_path):
    path = database_at(tmp_path / "v13.db", 13, {"amy": 1.0, "zed": 1.0})
    store = Store(path, scrypt=CHEAP)
    try:
        assert store.migrated_from == 13
        keys = [store.browser_key("amy"), store.browser_key("zed")]
        assert all(k and len(k) == 32 for k in keys) and keys[0] != keys[1]
    finally:
        store.close()
