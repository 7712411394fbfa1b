"""A user's identity outlives nothing of theirs: the prefix cache and page sessions.

`users.id` is reused once the highest user is removed, so a user's namespace in the prefix
cache is named by a random cache key instead: the next user added (the same name or not, the
same id) gets none of a removed user's cached tokens, in memory and after a restart with the
disk tier, whose start adopts only the files of the store's users. `forget` drops a
namespace's nodes and files (a shared system prompt stays), `forget_below` a deleted
conversation's (what another conversation shares stays), the running server learns of a
removal by the admin command (another process) through the store, and a page cookie stops
working once its user's password changed or the user was removed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from radixchat.core.cache.disk.fileio import read_header
from radixchat.core.cache.forget import forget, forget_below
from radixchat.core.cache.radix import RadixCache
from radixchat.core.config import Settings
from radixchat.core.seam.requests import ChatRequest, Finished, owner_of
from radixchat.core.store import Store
from radixchat.webui.removals import RemovalWatch
from radixchat.webui.server import build_app
from tests.support.cheap import cheap_scrypt
from tests.support.clients import API
from tests.support.conversations import wait_disk_idle
from tests.support.databases import database_at
from tests.support.fake_engine import FakeEngine
from tests.support.segments import SimSeg

CHEAP = cheap_scrypt()
SYSTEM = "You are the help desk of a small bank. Answer in one short sentence, whatever they ask."
SECRET = "My PIN is 4711 and my account is 0815-2299-1234, please remember them for later."


# ---- the store ----------------------------------------------------------------------------


def test_a_reused_id_gets_a_new_cache_key_and_a_removal_is_noted(store):
    store.create_user("alice", "alice-password")
    bob = store.create_user("bob", "bob-password")
    store.remove_user("bob")
    carol = store.create_user("carol", "carol-password")
    assert carol.id == bob.id  # SQLite reuses the highest id: the reason for the key
    assert carol.cache_key != bob.cache_key and len(carol.cache_key) == 32 and int(carol.cache_key, 16) >= 0
    assert owner_of(carol.cache_key) != owner_of(bob.cache_key)
    # every way of finding a user brings the same key; it never shows in a repr (logs)
    _, secret = store.create_api_key(carol)
    found = [
        store.get_user("carol"),
        store.get_user_by_id(carol.id),
        store.authenticate("carol", "carol-password"),
        store.verify_api_key(secret),
        next(u for u in store.list_users() if u.name == "carol"),
    ]
    assert {u.cache_key for u in found} == {carol.cache_key}
    assert carol.cache_key not in repr(carol)
    assert store.removed_cache_keys() == [(1, bob.cache_key)] and store.removed_cache_keys(1) == []
    with pytest.raises(ValueError):
        owner_of("")  # a user read without their key is refused, never one shared namespace


def test_the_migration_keys_existing_users_and_a_password_change_ends_sessions(tmp_path):
    db = database_at(tmp_path / "old.db", 6, {"ann": 0.0, "ben": 0.0})
    with Store(db, scrypt=CHEAP) as store:
        ann, ben = store.get_user("ann"), store.get_user("ben")
        assert len({ann.cache_key, ben.cache_key}) == 2 and all(len(u.cache_key) == 32 for u in (ann, ben))
        key = store.session_key("ann")
        assert key and store.session_current("ann", key) and store.session_key("ben") != key
        store.set_password("ann", "a-new-password")
        assert not store.session_current("ann", key) and store.session_current("ann", store.session_key("ann"))
        assert store.session_key("nobody") is None and not store.session_current("nobody", key)


# ---- the cache ----------------------------------------------------------------------------


def disk_engine(model_dir, tmp: Path, cache_owners=None):
    from radixchat.core.engine.engine import Engine

    settings = Settings(
        model=str(model_dir),
        prefix_cache=True,
        max_batch=8,
        max_prefill_batch=4,
        max_tokens=8,
        cache_disk_bytes=1 << 30,
        cache_disk_writes="all",  # each owner's one question has files to forget
        db=tmp / "radixchat.db",
        warm_presets=False,
    )
    eng = Engine(settings)
    eng.cache_owners = cache_owners
    eng.start(timeout=120)
    assert wait_disk_idle(eng), "the disk tier did not open"
    return eng


def ask(eng, owner: str | None, text: str, system: str | None = None) -> Finished:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    final = eng.submit(ChatRequest(messages=msgs, owner=owner)).result()
    assert isinstance(final, Finished), final
    return final


def owners_on_disk(tmp: Path) -> list[str]:
    owners = []
    for p in sorted((tmp / "kv-cache").rglob("*.safetensors")):
        try:  # the tier's writer may delete a file between the listing and the read (a forget)
            owners.append((read_header(p).get("__metadata__") or {}).get("owner", ""))
        except FileNotFoundError:
            pass
    return owners


def test_a_removed_users_cache_is_never_served_to_the_next_user(tiny_model_dir, tmp_path):
    with Store(tmp_path / "radixchat.db", scrypt=CHEAP) as store:
        old = store.create_user("alice", "alice-password")
        eng = disk_engine(tiny_model_dir, tmp_path)
        try:
            ask(eng, owner_of(old.cache_key), SECRET)
            assert ask(eng, owner_of(old.cache_key), SECRET).usage.cached_tokens > 0  # the cache works
            store.remove_user("alice")
            new = store.create_user("alice", "another-password")  # the same name, the same id
            assert new.id == old.id
            assert ask(eng, owner_of(new.cache_key), SECRET).usage.cached_tokens == 0  # in memory
            assert wait_disk_idle(eng)
        finally:
            eng.stop()
        assert owner_of(old.cache_key) in owners_on_disk(tmp_path)
        store.remove_user("alice")
        zed = store.create_user("zed", "zed-password")  # another name, the same id again
        assert zed.id == old.id
        users = {owner_of(u.cache_key) for u in store.list_users()}
        eng = disk_engine(tiny_model_dir, tmp_path, cache_owners=users.__contains__)
        try:
            assert eng.stats().disk_cache.adopted == 0  # both alices' files: not adopted, deleted
            assert owners_on_disk(tmp_path) == []
            assert ask(eng, owner_of(zed.cache_key), SECRET).usage.cached_tokens == 0  # after a restart
        finally:
            eng.stop()


def test_forget_drops_a_namespace_in_memory_and_on_disk_and_keeps_the_shared_system(tiny_model_dir, tmp_path):
    alice, bob = owner_of("a" * 32), owner_of("b" * 32)
    eng = disk_engine(tiny_model_dir, tmp_path)
    try:
        shared = len(eng.loaded.tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}]))
        ask(eng, alice, SECRET, SYSTEM)  # one edge: the system message and her text
        ask(eng, bob, "What is a list?", SYSTEM)
        assert wait_disk_idle(eng) and alice in owners_on_disk(tmp_path) and bob in owners_on_disk(tmp_path)
        eng.forget(alice)
        deadline = time.time() + 30
        while alice in owners_on_disk(tmp_path) and time.time() < deadline:
            time.sleep(0.05)
        assert wait_disk_idle(eng)
        assert alice not in owners_on_disk(tmp_path) and bob in owners_on_disk(tmp_path)
        assert ask(eng, bob, "What is a list?", SYSTEM).usage.cached_tokens > shared  # bob's stays
        again = ask(eng, alice, SECRET, SYSTEM)
        assert again.usage.cached_tokens == shared  # the system message stays, her text went
        assert wait_disk_idle(eng) and alice not in owners_on_disk(tmp_path)  # nor is it cached again
        eng.prefix.tree.check()
        theirs = eng.scope.owns(alice)
        stack = list(eng.prefix.tree.root.children.values())
        while stack:
            node = stack.pop()
            assert not any(theirs(t) for t in node.key)
            stack.extend(node.children.values())
    finally:
        eng.stop()
    eng = disk_engine(tiny_model_dir, tmp_path)  # and a restart finds nothing of hers
    try:
        assert ask(eng, alice, SECRET, SYSTEM).usage.cached_tokens <= shared
    finally:
        eng.stop()


def test_forget_in_the_tree_alone_splits_a_shared_head_and_drops_locked_nodes():
    tag = 1 << 32
    t = RadixCache(10_000)

    def put(tokens):
        return t.insert(tokens, lambda s, e: SimSeg(tokens[s:e]))

    mine = [1, 2, 3] + [tag + 7, tag + 8]
    put(mine)  # one edge: the shared head (a system message) and the owner's tokens
    held = t.match([*mine, tag + 9]).node
    t.lock(held)  # a running request of theirs
    assert forget(t, lambda tok: tok >> 32 == 1) == 2
    t.check()
    assert t.peek(mine) == 3  # the head stays, split off
    put([1, 2, 3, 4, 5])  # someone else's below the same head
    t.unlock(held)  # the request ends: nothing of theirs comes back
    t.check()
    assert t.peek(mine) == 3 and t.peek([1, 2, 3, 4, 5]) == 5 and t.locks == 0


def test_forget_below_drops_one_conversation_and_keeps_what_others_share():
    tag, bob = 1 << 32, 2 << 32
    t = RadixCache(10_000)

    def put(tokens):
        return t.insert(tokens, lambda s, e: SimSeg(tokens[s:e]))

    system = [1, 2, 3]
    first = [*system, tag + 5, tag + 6, tag + 7]  # a conversation's first turn, keyed
    later = [*first, tag + 8, tag + 9]  # its second turn
    other = [*system, tag + 5, tag + 10]  # another of hers: the same start of a user turn
    bobs = [*system, bob + 5]
    for tokens in (later, other, bobs):
        put(tokens)
    held = t.match(later).node
    t.lock(held)  # its reply is running
    assert forget_below(t, [*system, tag + 5, tag + 99], 3) == 0  # not cached whole: nothing goes
    assert forget_below(t, first, 3) == 4
    t.check()
    assert t.peek(later) == 4 and t.peek(other) == 5 and t.peek(bobs) == 4
    t.unlock(held)
    t.check()
    assert t.locks == 0
    alone = [7, 8, 9, tag + 1, tag + 2]  # one edge: a system message and one conversation
    put(alone)
    assert forget_below(t, alone, 3) == 2
    t.check()
    assert t.peek(alone) == 3  # the system message stays, split off


def test_a_deleted_conversations_cache_goes_in_memory_and_on_disk(tiny_model_dir, tmp_path):
    alice, bob = owner_of("a" * 32), owner_of("b" * 32)
    other = "What is a list?"
    eng = disk_engine(tiny_model_dir, tmp_path)
    try:
        tok = eng.loaded.tokenizer
        shared = len(tok.apply_chat_template([{"role": "system", "content": SYSTEM}]))

        def prompt(text):
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
            return tok.apply_chat_template(msgs, add_generation_prompt=True)

        common = next(i for i, (a, b) in enumerate(zip(prompt(SECRET), prompt(other))) if a != b)
        ask(eng, alice, SECRET, SYSTEM)
        ask(eng, alice, other, SYSTEM)  # another conversation of hers
        ask(eng, bob, SECRET, SYSTEM)  # bob's, the same words
        assert ask(eng, alice, SECRET, SYSTEM).usage.cached_tokens > common  # cached, past the fork
        assert wait_disk_idle(eng)
        eng.forget_conversation(alice, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": SECRET}])
        assert shared <= ask(eng, alice, SECRET, SYSTEM).usage.cached_tokens <= common  # in memory
        assert ask(eng, alice, other, SYSTEM).usage.cached_tokens > common  # her other one stays
        assert ask(eng, bob, SECRET, SYSTEM).usage.cached_tokens > common  # bob's too
        # the rerun above cached it again: forget it again, and check the disk after a restart
        eng.forget_conversation(alice, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": SECRET}])
        ask(eng, bob, other, SYSTEM)  # a request after the command: the engine has done it
        assert wait_disk_idle(eng)
        eng.prefix.tree.check()
    finally:
        eng.stop()
    eng = disk_engine(tiny_model_dir, tmp_path)
    try:
        assert ask(eng, alice, SECRET, SYSTEM).usage.cached_tokens <= common
        assert ask(eng, alice, other, SYSTEM).usage.cached_tokens > common
    finally:
        eng.stop()


# ---- the server ---------------------------------------------------------------------------


def test_the_server_forgets_users_the_admin_command_removed(store):
    engine = FakeEngine()
    alice = store.create_user("alice", "alice-password")
    watch = RemovalWatch(store, engine, every_s=0.05)
    assert watch.poll() == 0
    store.remove_user("alice")  # as `radixchat users remove` does, in its own process
    watch.start()
    try:
        deadline = time.time() + 10
        while not engine.forgotten and time.time() < deadline:
            time.sleep(0.02)
    finally:
        watch.stop()
    assert engine.forgotten == [owner_of(alice.cache_key)]


def test_an_old_page_cookie_stops_working_after_a_password_change_and_a_removal(tmp_path):
    store = Store(tmp_path / "page.db", scrypt=CHEAP)
    store.create_user("alice", "alice-password")
    app = build_app(FakeEngine(), Settings(), store)

    def sign_in(http, password: str) -> dict:
        http.cookies.clear()
        assert http.post("/login", data={"username": "alice", "password": password}).status_code == 200
        return dict(http.cookies)

    def signed_in_as(http) -> str | None:
        assert http.get("/config").status_code in (200, 401)
        return http.get(f"{API}/user").json()

    try:
        with TestClient(app) as http:
            first = sign_in(http, "alice-password")
            assert signed_in_as(http) == "alice" and http.get("/config").status_code == 200
            store.set_password("alice", "a-new-password")
            assert signed_in_as(http) is None and http.get("/config").status_code == 401
            join = {"data": [], "fn_index": 0, "session_hash": "s1"}
            assert http.post(f"{API}/queue/join", json=join).status_code == 401
            http.cookies.clear()
            http.cookies.update(first)
            assert signed_in_as(http) is None  # gone for good, not only for this request

            second = sign_in(http, "a-new-password")
            assert signed_in_as(http) == "alice"
            store.remove_user("alice")
            store.create_user("alice", "alice-password")  # the same name again: not the same user
            http.cookies.clear()
            http.cookies.update(second)
            assert signed_in_as(http) is None and http.get("/config").status_code == 401
            sign_in(http, "alice-password")
            assert signed_in_as(http) == "alice"
    finally:
        store.close()
