"""The session store: users, API keys, conversations, messages and request metrics in SQLite.

`Store(path)` is safe to share between threads; SQLite connections are not, so each thread
gets its own connection (WAL mode, so readers never wait for the writer) and every
read-then-write runs in `BEGIN IMMEDIATE`, which takes the write lock before reading, so two
threads can't both decide from the same stale read. Writers of one process take turns in
arrival order before that. Commits are `synchronous=FULL`: a returned write survives a
killed process and a power cut.

Metrics from the engine thread go through `record_request_async`, which only puts the
record on a queue; one writer thread commits queued records in batches. `flush()` waits
for what was queued before it (tests, shutdown). Queued records are not acknowledged
writes: a crash may lose them, never a row that a synchronous call returned.

Isolation: every read or change of a conversation or message takes the requesting user,
and a conversation of someone else is `NotFound`, exactly like one that does not exist.
A deleted conversation (`mark_deleted`, the page's "Delete" with its undo) is `NotFound` to
every read too, its owner's included, until `undelete_conversation` brings it back within
`DELETED_KEPT_S`; past that `purge_deleted` (run on each delete and on open) removes it.
Search (`search_conversations`) reads FTS5 indexes of titles and messages that triggers keep
in step (core.store.schema); it joins them to conversations and filters on the owner in SQL.
It indexes every message, of every branch. A conversation's messages are a tree (an edited
message or another answer is a sibling, `edit_message`, `append_reply(parent=)`); every read of
messages (history, prompt, exports, a shared link) follows the branch in view, and
`show_version` changes which one that is. The SQL of branches is core.store.branches.

Not here: the schema and migrations (core.store.schema), hashing (core.store.auth), export and
dashboard formatting (core.store.report), sessions, cookies and HTTP (webui). No MLX.
"""

from __future__ import annotations

import atexit
import collections
import logging
import queue
import re
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from radixchat.core.store import auth, branches
from radixchat.core.store import report as store_report
from radixchat.core.store import schema as store_schema
from radixchat.core.store.report import StatsBucket
from radixchat.core.store.types import (
    DEFAULT_TITLE,
    MAX_LABEL_CHARS,
    MAX_LIST,
    MAX_MESSAGE_CHARS,
    MAX_PASSWORD_CHARS,
    MAX_SYSTEM_PROMPT_CHARS,
    MAX_TITLE_CHARS,
    ROLES,
    AlreadyExists,
    ApiKey,
    AuthFailed,
    Branch,
    Conversation,
    Invalid,
    Message,
    NotFound,
    RequestFigures,
    RequestRecord,
    SearchHit,
    StoreError,
    User,
    as_id,
    check_name,
    check_password,
    check_text,
    clean_title,
    is_valid_name,
    user_id,
)

log = logging.getLogger("radixchat.store")

ASYNC_QUEUE_MAX = 10_000  # past this, metrics are dropped (and counted) rather than block the engine
_ASYNC_BATCH = 256
_TOUCH_EVERY_S = 60.0  # how stale a key's last_used may get: saves a write per API call
DELETED_KEPT_S = 60.0  # how long a deleted conversation can be brought back (the page's undo)


MAX_SEARCH_CHARS = 1_000
MAX_SEARCH_WORDS = 16
SNIPPET_TOKENS = 12  # about how many words of the matching text a search hit shows
# the words of a query as FTS5's unicode61 tokenizer sees them: letters and digits
_WORD = re.compile(r"[^\W_]+")


def fts_query(text: str) -> str:
    """A user's search as an FTS5 query of its words, each a quoted prefix ("word"*): every
    word must occur, and nothing typed is read as FTS5 syntax. "" when it has no words."""
    words = _WORD.findall(text)[:MAX_SEARCH_WORDS]
    return " ".join(f'"{w}"*' for w in words)


class _Touch:
    """Queued note that an API key was just used."""

    __slots__ = ("key_id", "when")

    def __init__(self, key_id: int, when: float):
        self.key_id, self.when = key_id, when


_STOP = object()


class _FairLock:
    """A first-come-first-served lock for this process's writers. Without it, threads wait
    for SQLite's write lock in its busy handler, which sleeps and retries: a thread that
    writes in a loop takes the lock again and again while the others sleep (measured: one
    writer got 20x the commits of another). Ownership is handed to the oldest waiter."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiters: collections.deque[threading.Event] = collections.deque()
        self._held = False

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            turn = threading.Event()
            self._waiters.append(turn)
        if turn.wait(timeout):
            return True
        with self._mutex:
            if turn.is_set():  # handed over just as the wait timed out
                return True
            self._waiters.remove(turn)
            return False

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().set()  # still held: now by the oldest waiter
            else:
                self._held = False


class _Connection(sqlite3.Connection):
    """Only so that connections can be weakly referenced: `close()` finds every thread's."""


class Store:
    def __init__(
        self,
        path: str | Path,
        *,
        scrypt: auth.ScryptCost = auth.DEFAULT_SCRYPT,
        timeout_s: float = 30.0,
        synchronous: str = "FULL",
    ):
        """Open (creating, or migrating forward) the database at `path`.

        `scrypt` is the password-hash cost for new hashes; tests pass a cheap one.
        `timeout_s` is how long a write waits for another writer's lock before failing.
        """
        self.path = Path(path).expanduser()
        self._scrypt = scrypt
        self._timeout_s = timeout_s
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}")
        self._synchronous = synchronous
        self._local = threading.local()
        self._conns: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._closed = False
        self._stopping = False  # set first by close(): no new async work from then on
        self._queue: queue.Queue = queue.Queue(ASYNC_QUEUE_MAX)
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._write_turn = _FairLock()
        self.dropped = 0  # async records refused because the queue was full or the store closed
        self.async_errors = 0  # async records that failed to write

        new = not self.path.exists()
        if new:
            # the folder and file hold password hashes: owner-only, like ssh keys
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.path.touch(mode=0o600)
        conn = self._db().conn
        try:
            found = store_schema.version(conn)
            if found > store_schema.LATEST:
                raise StoreError(
                    f"{self.path} has schema version {found}, newer than this radixchat "
                    f"knows ({store_schema.LATEST}); upgrade radixchat"
                )
            self.migrated_from, _ = store_schema.migrate(conn, timeout_s=self._timeout_s)
            self.purge_deleted()  # what was deleted while no server ran is gone for good
        except (sqlite3.Error, StoreError) as e:
            self.close()
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"cannot open {self.path}: {e}") from e

    # ---- connections and transactions ----

    def _db(self) -> Database:
        if self._closed:
            raise StoreError("the store is closed")
        db = getattr(self._local, "db", None)
        if db is None:
            try:
                # check_same_thread=False only so close() may close it from another thread;
                # the thread-local is what keeps each connection to one thread.
                conn = sqlite3.connect(
                    self.path,
                    timeout=self._timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                    factory=_Connection,
                )
                conn.execute("PRAGMA foreign_keys=ON")
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
            except sqlite3.Error as e:
                raise StoreError(f"cannot open {self.path}: {e}") from e
            self._conns.add(conn)
            db = self._local.db = Database(conn, execute_plugins=False)
        return db

    @contextmanager
    def _tx(self, write: bool) -> Iterator[Database]:
        """One transaction on this thread's connection. Writes take the lock up front: first
        this process's turn (fair between its threads), then SQLite's (against other processes)."""
        db = self._db()
        conn = db.conn
        if write and not self._write_turn.acquire(self._timeout_s):
            raise StoreError(f"database busy: no turn to write within {self._timeout_s:g} s")
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield db
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise StoreError(f"database error: {e}") from e
        finally:
            if write:
                self._write_turn.release()

    def close(self) -> None:
        """Write what is queued, stop the writer and close every connection. Idempotent."""
        if self._closed:
            return
        with self._writer_lock:  # after this, _enqueue drops (and counts) instead of queueing
            self._stopping = True
        if self._writer is not None:
            self._queue.put(_STOP)
            self._writer.join(timeout=self._timeout_s)
            atexit.unregister(self.close)
        self._closed = True
        for conn in list(self._conns):
            conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- users ----

    def create_user(self, name: str, password: str) -> User:
        check_name(name)
        check_password(password)
        taken = "SELECT 1 FROM users WHERE name = ?"
        with self._tx(write=False) as db:  # a quick refusal, before the slow hash
            if db.execute(taken, [name]).fetchone():
                raise AlreadyExists(f"user {name!r} already exists")
        hashed = auth.hash_password(password, self._scrypt)  # slow: not while holding the lock
        now = time.time()
        with self._tx(write=True) as db:
            if db.execute(taken, [name]).fetchone():  # again: someone may have been quicker
                raise AlreadyExists(f"user {name!r} already exists")
            uid = db["users"].insert({"name": name, "password_hash": hashed, "created": now}).last_pk
        return User(uid, name, now)

    def authenticate(self, name: str, password: str) -> User:
        """The user if the password is right; otherwise AuthFailed, the same for an unknown
        name as for a wrong password, and taking as long."""
        row = None
        if is_valid_name(name):
            with self._tx(write=False) as db:
                row = db.execute("SELECT id, name, created, password_hash FROM users WHERE name = ?", [name]).fetchone()
        if not isinstance(password, str) or len(password) > MAX_PASSWORD_CHARS:
            password = ""
        if row is None:
            auth.burn_password_check(password, self._scrypt)
        elif auth.verify_password(password, row[3]):
            return User(*row[:3])
        raise AuthFailed("wrong user name or password")

    def set_password(self, name: str, password: str) -> None:
        check_password(password)
        hashed = auth.hash_password(password, self._scrypt)
        with self._tx(write=True) as db:
            if not db.execute("UPDATE users SET password_hash = ? WHERE name = ?", [hashed, name]).rowcount:
                raise NotFound(f"user {name!r} not found")

    def get_user(self, name: str) -> User:
        with self._tx(write=False) as db:
            row = db.execute("SELECT id, name, created FROM users WHERE name = ?", [name]).fetchone()
        if row is None:
            raise NotFound(f"user {name!r} not found")
        return User(*row)

    def get_user_by_id(self, user_id: int) -> User:
        with self._tx(write=False) as db:
            row = db.execute("SELECT id, name, created FROM users WHERE id = ?", [as_id(user_id, "user")]).fetchone()
        if row is None:
            raise NotFound(f"user {user_id!r} not found")
        return User(*row)

    def list_users(self) -> list[User]:
        with self._tx(write=False) as db:
            return [User(*r) for r in db.execute("SELECT id, name, created FROM users ORDER BY name")]

    def remove_user(self, name: str) -> int:
        """Delete a user with their conversations, messages and keys; their request metrics
        stay, unlinked. Returns how many conversations went with them."""
        with self._tx(write=True) as db:
            row = db.execute("SELECT id FROM users WHERE name = ?", [name]).fetchone()
            if row is None:
                raise NotFound(f"user {name!r} not found")
            n = db.execute("SELECT count(*) FROM conversations WHERE owner = ?", row).fetchone()[0]
            db.execute("DELETE FROM users WHERE id = ?", row)
        return n

    # ---- API keys ----

    def create_api_key(self, user: User | int, label: str = "") -> tuple[ApiKey, str]:
        """A new key for `user`: (its record, the key). The key is returned only this once."""
        uid = user_id(user)
        label = check_text(label, "label", MAX_LABEL_CHARS, allow_empty=True).strip()
        key = auth.new_api_key()
        now = time.time()
        with self._tx(write=True) as db:
            owner = db.execute("SELECT name FROM users WHERE id = ?", [uid]).fetchone()
            if owner is None:
                raise NotFound(f"user {uid} not found")
            kid = (
                db["api_keys"]
                .insert(
                    {
                        "owner": uid,
                        "key_hash": auth.api_key_hash(key),
                        "visible": auth.api_key_visible(key),
                        "label": label,
                        "created": now,
                    }
                )
                .last_pk
            )
        return ApiKey(kid, uid, owner[0], auth.api_key_visible(key), label, now, None, None), key

    _KEY_COLUMNS = (
        "SELECT k.id, k.owner, u.name, k.visible, k.label, k.created, k.last_used, k.revoked "
        "FROM api_keys k JOIN users u ON u.id = k.owner"
    )

    def list_api_keys(self, user: User | int | None = None) -> list[ApiKey]:
        """One user's keys, or everyone's with user=None (for the admin command)."""
        with self._tx(write=False) as db:
            if user is None:
                rows = db.execute(self._KEY_COLUMNS + " ORDER BY u.name, k.id")
            else:
                rows = db.execute(self._KEY_COLUMNS + " WHERE k.owner = ? ORDER BY k.id", [user_id(user)])
            return [ApiKey(*r) for r in rows]

    def revoke_api_key(self, key: str, *, user: User | int | None = None) -> ApiKey:
        """Revoke by the whole key or by its visible start (as listed). With `user`, only that
        user's keys are candidates. Revoking a revoked key changes nothing."""
        if not isinstance(key, str) or not auth.looks_like_api_key(key):
            raise Invalid(
                f"{key!r} is not an API key or the start of one (keys begin with "
                f"{auth.KEY_PREFIX!r} and are listed by their first {auth.KEY_VISIBLE_CHARS} characters)"
            )
        if len(key) > auth.KEY_VISIBLE_CHARS:
            where, arg = "k.key_hash = ?", auth.api_key_hash(key)
        else:
            where, arg = "k.visible = ?", key
        args = [arg]
        if user is not None:
            where += " AND k.owner = ?"
            args.append(user_id(user))
        with self._tx(write=True) as db:
            rows = db.execute(f"{self._KEY_COLUMNS} WHERE {where}", args).fetchall()
            if not rows:
                raise NotFound(f"API key {auth.api_key_visible(key)}... not found")
            if len(rows) > 1:
                raise Invalid(f"{len(rows)} keys start with {key!r}; give the whole key")
            k = ApiKey(*rows[0])
            if k.revoked is None:
                k = replace(k, revoked=time.time())
                db.execute("UPDATE api_keys SET revoked = ? WHERE id = ?", [k.revoked, k.id])
        return k

    def verify_api_key(self, key: str) -> User:
        """The key's owner, or AuthFailed. Notes the use (at most once a minute per key)
        through the writer thread, so checking a key never waits for the write lock."""
        if not isinstance(key, str) or not auth.looks_like_api_key(key) or len(key) > 200:
            raise AuthFailed("invalid API key")
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT k.id, k.revoked, k.last_used, u.id, u.name, u.created "
                "FROM api_keys k JOIN users u ON u.id = k.owner WHERE k.key_hash = ?",
                [auth.api_key_hash(key)],
            ).fetchone()
        if row is None:
            raise AuthFailed("invalid API key")
        kid, revoked, last_used, *owner = row
        if revoked is not None:
            raise AuthFailed(f"API key {auth.api_key_visible(key)}... was revoked")
        now = time.time()
        if last_used is None or now - last_used > _TOUCH_EVERY_S:
            self._enqueue(_Touch(kid, now))
        return User(*owner)

    # ---- conversations ----

    _CONV_COLUMNS = "SELECT id, owner, title, system_prompt, created, updated, archived FROM conversations"

    def _conv(self, db: Database, uid: int, conv_id: Any) -> Conversation:
        """The conversation if `uid` owns it; otherwise NotFound, with no hint that it exists."""
        cid = as_id(conv_id, "conversation")
        row = db.execute(self._CONV_COLUMNS + " WHERE id = ? AND owner = ? AND deleted IS NULL", [cid, uid]).fetchone()
        if row is None:
            raise NotFound(f"conversation {cid} not found")
        return Conversation(*row)

    def create_conversation(self, user: User | int, title: str | None = None, system_prompt: str = "") -> Conversation:
        uid = user_id(user)
        title = DEFAULT_TITLE if title is None else clean_title(title)
        check_text(system_prompt, "system prompt", MAX_SYSTEM_PROMPT_CHARS, allow_empty=True)
        now = time.time()
        with self._tx(write=True) as db:
            if db.execute("SELECT 1 FROM users WHERE id = ?", [uid]).fetchone() is None:
                raise NotFound(f"user {uid} not found")
            cid = (
                db["conversations"]
                .insert({"owner": uid, "title": title, "system_prompt": system_prompt, "created": now, "updated": now})
                .last_pk
            )
        return Conversation(cid, uid, title, system_prompt, now, now, None)

    def get_conversation(self, user: User | int, conv_id: int) -> Conversation:
        with self._tx(write=False) as db:
            return self._conv(db, user_id(user), conv_id)

    def list_conversations(
        self,
        user: User | int,
        *,
        archived: bool | None = False,
        search: str | None = None,
        limit: int = 200,
        offset: int = 0,
    ) -> list[Conversation]:
        """Most recently updated first. archived: False = active only, True = archived only,
        None = both. `search` matches anywhere in the title, ignoring ASCII case."""
        sql, args = self._CONV_COLUMNS + " WHERE owner = ? AND deleted IS NULL", [user_id(user)]
        if archived is not None:
            sql += " AND archived IS NOT NULL" if archived else " AND archived IS NULL"
        if search:
            check_text(search, "search", MAX_TITLE_CHARS)
            sql += " AND title LIKE ? ESCAPE '\\'"
            args.append("%" + re.sub(r"([\\%_])", r"\\\1", search) + "%")
        sql += " ORDER BY updated DESC, id DESC LIMIT ? OFFSET ?"
        args += [max(0, min(int(limit), MAX_LIST)), max(0, int(offset))]
        with self._tx(write=False) as db:
            return [Conversation(*r) for r in db.execute(sql, args)]

    def search_conversations(self, user: User | int, query: str, limit: int = 50) -> list[SearchHit]:
        """The user's conversations, open and archived, whose title, or one of whose messages,
        holds every word of `query` (a word also as the start of a longer one; case and accents
        aside),
        best match first, each with a short snippet of the text that matched. The query is
        words only: FTS5's syntax (quotes, *, AND, -, column:) is taken as text. An empty
        query, or one without words, finds nothing. The owner filter is in the SQL."""
        check_text(query or "", "search", MAX_SEARCH_CHARS, allow_empty=True)
        match = fts_query(query or "")
        if not match:
            return []
        uid = user_id(user)
        # both indexes, each joined to its conversation and filtered by owner; per conversation
        # its best hit (bm25: lower is better; a title hit counts double) and that hit's snippet
        sql = f"""
            WITH hits AS (
                SELECT c.id AS conv, 2 * bm25(titles_fts) AS score,
                       snippet(titles_fts, 0, '', '', '…', {SNIPPET_TOKENS}) AS snip
                FROM titles_fts JOIN conversations c ON c.id = titles_fts.rowid
                WHERE titles_fts MATCH :q AND c.owner = :uid
                UNION ALL
                SELECT c.id, bm25(messages_fts), snippet(messages_fts, 0, '', '', '…', {SNIPPET_TOKENS})
                FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
                JOIN conversations c ON c.id = m.conversation
                WHERE messages_fts MATCH :q AND c.owner = :uid),
            best AS (SELECT conv, min(score) AS score, snip FROM hits GROUP BY conv)
            SELECT c.id, c.owner, c.title, c.system_prompt, c.created, c.updated, c.archived, best.snip
            FROM best JOIN conversations c ON c.id = best.conv AND c.owner = :uid AND c.deleted IS NULL
            ORDER BY best.score, c.updated DESC, c.id DESC LIMIT :limit"""
        args = {"q": match, "uid": uid, "limit": max(0, min(int(limit), MAX_LIST))}
        with self._tx(write=False) as db:
            return [SearchHit(Conversation(*r[:7]), " ".join(r[7].split())) for r in db.execute(sql, args)]

    def _update_conv(self, user: User | int, conv_id: int, sets: str, args: list) -> Conversation:
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            db.execute(f"UPDATE conversations SET {sets} WHERE id = ?", [*args, conv.id])
            return self._conv(db, uid, conv.id)

    def rename_conversation(self, user: User | int, conv_id: int, title: str) -> Conversation:
        return self._update_conv(user, conv_id, "title = ?", [clean_title(title)])

    def set_system_prompt(self, user: User | int, conv_id: int, system_prompt: str) -> Conversation:
        check_text(system_prompt, "system prompt", MAX_SYSTEM_PROMPT_CHARS, allow_empty=True)
        return self._update_conv(user, conv_id, "system_prompt = ?", [system_prompt])

    def archive_conversation(self, user: User | int, conv_id: int) -> Conversation:
        # COALESCE: archiving twice keeps the first time
        return self._update_conv(user, conv_id, "archived = COALESCE(archived, ?)", [time.time()])

    def restore_conversation(self, user: User | int, conv_id: int) -> Conversation:
        return self._update_conv(user, conv_id, "archived = NULL", [])

    def delete_conversation(self, user: User | int, conv_id: int) -> None:
        """Deletes it and its messages; its request metrics stay, unlinked."""
        with self._tx(write=True) as db:
            conv = self._conv(db, user_id(user), conv_id)
            db.execute("DELETE FROM conversations WHERE id = ?", [conv.id])

    def mark_deleted(self, user: User | int, conv_id: int) -> Conversation:
        """Delete with undo: the conversation is NotFound to every read from now on, and
        `undelete_conversation` can bring it back for DELETED_KEPT_S; owner only. Removes for
        good what was deleted longer ago than that (anyone's). Returns it as it was."""
        now = time.time()
        with self._tx(write=True) as db:
            conv = self._conv(db, user_id(user), conv_id)
            db.execute("UPDATE conversations SET deleted = ? WHERE id = ?", [now, conv.id])
            self._purge(db, now - DELETED_KEPT_S)
        return conv

    def undelete_conversation(self, user: User | int, conv_id: int) -> Conversation:
        """Undo `mark_deleted`, by its owner, while it is kept; NotFound otherwise (also for
        a conversation that was never deleted: there is nothing to undo)."""
        uid, cid = user_id(user), as_id(conv_id, "conversation")
        with self._tx(write=True) as db:
            if not db.execute(
                "UPDATE conversations SET deleted = NULL WHERE id = ? AND owner = ? "
                "AND deleted IS NOT NULL AND deleted >= ?",
                [cid, uid, time.time() - DELETED_KEPT_S],
            ).rowcount:
                raise NotFound(f"conversation {cid} not found")
            return self._conv(db, uid, cid)

    def purge_deleted(self, older_than_s: float = DELETED_KEPT_S) -> int:
        """Delete for good (messages and links with them) conversations deleted longer than
        `older_than_s` ago; how many went."""
        with self._tx(write=True) as db:
            return self._purge(db, time.time() - older_than_s)

    @staticmethod
    def _purge(db: Database, before: float) -> int:
        return db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL AND deleted < ?", [before]).rowcount

    def fresh_conversation(
        self, user: User | int, system_prompt: str = "", exclude: Iterable[int] = ()
    ) -> Conversation:
        """A conversation to start a new chat in, with `system_prompt`: the user's newest one
        that is still untitled and empty (not one in `exclude`), else a new one. In one
        transaction, so two callers never both take the same one unless both may."""
        uid = user_id(user)
        check_text(system_prompt, "system prompt", MAX_SYSTEM_PROMPT_CHARS, allow_empty=True)
        skip = sorted({int(i) for i in exclude})[:500]
        now = time.time()
        with self._tx(write=True) as db:
            row = db.execute(
                "SELECT id FROM conversations c WHERE owner = ? AND deleted IS NULL AND title = ? "
                "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation = c.id)"
                + (f" AND id NOT IN ({','.join('?' * len(skip))})" if skip else "")
                + " ORDER BY updated DESC, id DESC LIMIT 1",
                [uid, DEFAULT_TITLE, *skip],
            ).fetchone()
            if row is None:
                if db.execute("SELECT 1 FROM users WHERE id = ?", [uid]).fetchone() is None:
                    raise NotFound(f"user {uid} not found")
                cid = (
                    db["conversations"]
                    .insert(
                        {
                            "owner": uid,
                            "title": DEFAULT_TITLE,
                            "system_prompt": system_prompt,
                            "created": now,
                            "updated": now,
                        }
                    )
                    .last_pk
                )
            else:
                cid = row[0]
                db.execute(
                    "UPDATE conversations SET system_prompt = ?, updated = ?, archived = NULL WHERE id = ?",
                    [system_prompt, now, cid],
                )
            return self._conv(db, uid, cid)

    def set_open_conversation(self, user: User | int, conv_id: int | None) -> None:
        """Note the conversation the user has open (None: none), for `open_conversation`."""
        uid = user_id(user)
        with self._tx(write=True) as db:
            cid = None if conv_id is None else self._conv(db, uid, conv_id).id
            db.execute("UPDATE users SET open_conversation = ? WHERE id = ?", [cid, uid])

    def open_conversation(self, user: User | int) -> Conversation | None:
        """The conversation the user last had open, if it is still there (not deleted)."""
        uid = user_id(user)
        with self._tx(write=False) as db:
            row = db.execute("SELECT open_conversation FROM users WHERE id = ?", [uid]).fetchone()
            if row is None or row[0] is None:
                return None
            try:
                return self._conv(db, uid, row[0])
            except NotFound:
                return None

    # ---- read-only links (the page's "Share") ----

    def share_conversation(self, user: User | int, conv_id: int) -> str:
        """The token of the conversation's read-only link, made now if it has none; the owner
        only (another user's conversation is NotFound). Sharing again gives the same token
        until `revoke_share`. Unguessable (secrets.token_urlsafe(24), 192 bits) and kept as
        is rather than hashed: the owner must be able to see the same link again, and the file
        that would hold the token already holds the conversation it opens."""
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            row = db.execute("SELECT token FROM shares WHERE conversation = ?", [conv.id]).fetchone()
            if row is not None:
                return row[0]
            token = secrets.token_urlsafe(24)
            db.execute(
                "INSERT INTO shares (conversation, token, created) VALUES (?, ?, ?)", [conv.id, token, time.time()]
            )
            return token

    def share_token(self, user: User | int, conv_id: int) -> str | None:
        """The conversation's live token, or None when it is not shared; owner only."""
        with self._tx(write=False) as db:
            conv = self._conv(db, user_id(user), conv_id)
            row = db.execute("SELECT token FROM shares WHERE conversation = ?", [conv.id]).fetchone()
            return row[0] if row else None

    def revoke_share(self, user: User | int, conv_id: int) -> bool:
        """Ends the conversation's link (its token is then NotFound); owner only. True if it
        was shared. Sharing afterwards makes a new token."""
        with self._tx(write=True) as db:
            conv = self._conv(db, user_id(user), conv_id)
            return db.execute("DELETE FROM shares WHERE conversation = ?", [conv.id]).rowcount > 0

    def shared_conversation(self, token: str) -> tuple[str, list[Message]]:
        """(title, messages) of the conversation that `token` opens, for any reader; NotFound,
        the same for each, for a wrong or revoked token and for a conversation since deleted."""
        if not isinstance(token, str) or not token or len(token) > 200:
            raise NotFound("shared conversation not found")
        with self._tx(write=False) as db:
            row = db.execute(
                "SELECT c.id, c.title FROM shares s JOIN conversations c ON c.id = s.conversation "
                "WHERE s.token = ? AND c.deleted IS NULL",
                [token],
            ).fetchone()
            if row is None:
                raise NotFound("shared conversation not found")
            return row[1], branches.path(db, row[0])  # the branch in view, as its owner sees it

    # ---- messages ----
    # A conversation is a tree of messages, of which one branch is in view (core.store.branches):
    # appending goes on from its last message, editing or answering again adds a sibling, and
    # each of these makes the new message the branch's end. Reads follow the branch in view.

    def _insert_message(
        self,
        db: Database,
        conv: Conversation,
        role: str,
        content: str,
        request: int | None,
        now: float,
        parent: int | None,
    ) -> Message:
        mid = (
            db["messages"]
            .insert(
                {
                    "conversation": conv.id,
                    "role": role,
                    "content": content,
                    "created": now,
                    "request": request,
                    "parent": parent,
                }
            )
            .last_pk
        )
        db.execute("UPDATE conversations SET updated = ?, leaf = ? WHERE id = ?", [now, mid, conv.id])
        return Message(mid, conv.id, role, content, now, request, parent)

    @staticmethod
    def _check_message(role: str, content: str) -> None:
        if role not in ROLES:
            raise Invalid(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        # a reply may be empty (stopped at once); what a person sends may not
        check_text(content, f"{role} message", MAX_MESSAGE_CHARS, allow_empty=role == "assistant")

    def append_message(
        self,
        user: User | int,
        conv_id: int,
        role: str,
        content: str,
        *,
        request: int | None = None,
        after: int | None = None,
    ) -> Message:
        """Add a message at the end of the branch in view, or after the message `after` of this
        conversation (the end of the branch its caller read: what it follows must not change
        meanwhile), and mark the conversation updated. Committed on return."""
        self._check_message(role, content)
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            if (
                request is not None
                and db.execute("SELECT 1 FROM requests WHERE id = ?", [as_id(request, "request")]).fetchone() is None
            ):
                raise NotFound(f"request {request!r} not found")
            return self._insert_message(
                db, conv, role, content, request, time.time(), branches.follows(db, conv.id, after)
            )

    def append_reply(
        self, user: User | int, conv_id: int, content: str, record: RequestRecord, *, parent: int | None = None
    ) -> Message:
        """The assistant's reply and its request metrics, in one transaction: both or neither.
        It answers `parent` (a message of this conversation; None: the end of the branch in
        view); another answer to the same message is a new version of the answer, shown from
        now on."""
        self._check_message("assistant", content)
        uid = user_id(user)
        record = replace(record, user=uid, conversation=as_id(conv_id, "conversation"))
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            after = branches.follows(db, conv.id, parent)
            rid = self._insert_request(db, record)
            return self._insert_message(db, conv, "assistant", content, rid, time.time(), after)

    def edit_message(self, user: User | int, conv_id: int, message_id: int, content: str) -> Message:
        """A new version of one of the user's messages: a sibling of it (the same parent), the
        end of the branch in view from now on. The message, and what followed it, stay as they
        were, on their own branch. Only a user message can be edited."""
        self._check_message("user", content)
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            old = branches.message(db, conv.id, message_id)
            if old.role != "user":
                raise Invalid("only a message of the user can be edited")
            return self._insert_message(db, conv, "user", content, None, time.time(), old.parent)

    def show_version(self, user: User | int, conv_id: int, message_id: int) -> Branch:
        """Bring a version of a message into view, with the branch last written through it (to
        its newest message): what is shown, and what the model sees next, from now on."""
        uid = user_id(user)
        with self._tx(write=True) as db:
            conv = self._conv(db, uid, conv_id)
            chosen = branches.message(db, conv.id, message_id)
            db.execute(
                "UPDATE conversations SET leaf = ? WHERE id = ?",
                [branches.newest_under(db, conv.id, chosen.id), conv.id],
            )
            return branches.branch(db, conv.id)

    def history(self, user: User | int, conv_id: int) -> list[Message]:
        """The branch in view, first message to last."""
        with self._tx(write=False) as db:
            return branches.path(db, self._conv(db, user_id(user), conv_id).id)

    def branch(self, user: User | int, conv_id: int) -> Branch:
        """The branch in view with the versions of each of its messages."""
        with self._tx(write=False) as db:
            return branches.branch(db, self._conv(db, user_id(user), conv_id).id)

    def request_metrics(self, request_ids: Iterable[int | None]) -> dict[int, RequestFigures]:
        """The figures of the given requests, by id; unknown ids are left out.

        Aggregate figures only, no text: callers pass ids taken from messages their user may
        read (Message.request)."""
        ids = sorted({int(i) for i in request_ids if i is not None})
        out: dict[int, RequestFigures] = {}
        with self._tx(write=False) as db:
            for i in range(0, len(ids), 500):  # SQLite caps the number of bound parameters
                chunk = ids[i : i + 500]
                rows = db.execute(
                    "SELECT id, prompt_tokens, cached_tokens, ttft_ms, decode_tps, finish_reason, error "
                    f"FROM requests WHERE id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
                out.update((rid, RequestFigures(*rest)) for rid, *rest in rows)
        return out

    def prompt_messages(self, user: User | int, conv_id: int) -> list[dict]:
        """The conversation as chat messages for the engine: its system prompt, then the branch in view."""
        with self._tx(write=False) as db:
            conv = self._conv(db, user_id(user), conv_id)
            messages = branches.path(db, conv.id)
        head = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        return head + [{"role": m.role, "content": m.content} for m in messages]

    def export_conversation(self, user: User | int, conv_id: int, fmt: str = "json") -> str:
        """The conversation as a JSON document or as Markdown (fmt "json" or "md"): the branch in view."""
        if fmt not in store_report.EXPORT_FORMATS:
            raise Invalid(f"export format must be json or md, not {fmt!r}")
        with self._tx(write=False) as db:
            conv = self._conv(db, user_id(user), conv_id)
            owner = db.execute("SELECT name FROM users WHERE id = ?", [conv.owner]).fetchone()[0]
            msgs = branches.path(db, conv.id)
        render = store_report.export_json if fmt == "json" else store_report.export_markdown
        return render(conv, msgs, owner)

    # ---- request metrics ----

    def _insert_request(self, db: Database, rec: RequestRecord) -> int:
        if rec.user is not None and db.execute("SELECT 1 FROM users WHERE id = ?", [rec.user]).fetchone() is None:
            raise NotFound(f"user {rec.user!r} not found")
        if rec.conversation is not None:
            self._conv(db, rec.user, rec.conversation)  # a request of user A can't point into B's chat
        return (
            db["requests"]
            .insert(
                {
                    "created": rec.created,
                    "user": rec.user,
                    "conversation": rec.conversation,
                    "model": rec.model,
                    "prompt_tokens": rec.prompt_tokens,
                    "cached_tokens": rec.cached_tokens,
                    "generated_tokens": rec.generated_tokens,
                    "queue_ms": rec.queue_ms,
                    "ttft_ms": rec.ttft_ms,
                    "total_ms": rec.total_ms,
                    "decode_tps": rec.decode_tps,
                    "finish_reason": rec.finish_reason,
                    "error": rec.error,
                }
            )
            .last_pk
        )

    def record_request(self, record: RequestRecord) -> int:
        """Store one request's metrics now; returns its id (for `append_message(request=)`)."""
        with self._tx(write=True) as db:
            return self._insert_request(db, record)

    def record_request_async(self, record: RequestRecord) -> None:
        """Queue the metrics for the writer thread and return at once; never blocks, never
        raises (for the engine thread). A full queue or a closed store drops the record and
        counts it in `dropped`. See `flush`."""
        self._enqueue(record)

    def _enqueue(self, item: Any) -> None:
        # The check and the put are one step under the lock `close` takes to set _stopping:
        # an item is either queued before the writer's stop mark (and written) or counted as
        # dropped, never queued behind the mark where nobody reads it.
        with self._writer_lock:
            if self._stopping:
                self.dropped += 1
                return
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, daemon=True, name="radixchat-store-writer")
                self._writer.start()
                atexit.register(self.close)  # a daemon thread would lose its queue at exit
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                self.dropped += 1
        if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
            log.warning("store writer queue full: %d metric records dropped so far", self.dropped)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything queued before this call is committed. False on timeout."""
        if self._writer is None or self._closed:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def _write_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < _ASYNC_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            work = [x for x in batch if isinstance(x, (RequestRecord, _Touch))]
            if work:
                self._write_batch(work)
            for x in batch:
                if isinstance(x, threading.Event):
                    x.set()
            if any(x is _STOP for x in batch):
                return

    def _write_batch(self, work: list) -> None:
        # one transaction (one fsync) for the whole batch; a record whose user or conversation
        # has gone since is kept without those links rather than lost
        try:
            with self._tx(write=True) as db:
                for x in work:
                    if isinstance(x, _Touch):
                        db.execute(
                            "UPDATE api_keys SET last_used = max(coalesce(last_used, 0), ?) WHERE id = ?",
                            [x.when, x.key_id],
                        )
                        continue
                    try:
                        self._insert_request(db, x)
                    except NotFound as e:
                        log.warning("request metrics stored without links: %s", e)
                        self._insert_request(db, replace(x, user=None, conversation=None))
        except Exception:
            self.async_errors += sum(isinstance(x, RequestRecord) for x in work)
            log.exception("store writer: %d queued records lost", len(work))

    def stats(
        self,
        *,
        window_s: float = 3600.0,
        bucket_s: float = 60.0,
        now: float | None = None,
        user: User | int | None = None,
    ) -> list[StatsBucket]:
        """The dashboard's series: one StatsBucket per `bucket_s` over the last `window_s`,
        oldest first, empty buckets included; with `user`, of that user's requests only."""
        if not (0 < bucket_s <= window_s) or window_s / bucket_s > 10_000:
            raise Invalid("need 0 < bucket_s <= window_s and at most 10,000 buckets")
        end = time.time() if now is None else now
        start = end - window_s
        return store_report.buckets(self._stats_rows(start, end, user), start, end, bucket_s)

    def usage(
        self, *, window_s: float = 3600.0, now: float | None = None, user: User | int | None = None
    ) -> StatsBucket:
        """The last `window_s` as one StatsBucket (its percentiles over the whole window, its
        start the window's); with `user`, of that user's requests only."""
        if not window_s > 0:
            raise Invalid("need window_s > 0")
        end = time.time() if now is None else now
        start = end - window_s
        # shifted to start at 0 and one bucket wider than the window: exactly one bucket
        rows = [(r[0] - start, *r[1:]) for r in self._stats_rows(start, end, user)]
        return replace(store_report.buckets(rows, 0.0, window_s, window_s * 2)[0], start=start)

    def _stats_rows(self, start: float, end: float, user: User | int | None) -> list[tuple]:
        mine = "" if user is None else " AND user = ?"
        with self._tx(write=False) as db:
            return db.execute(
                "SELECT created, ttft_ms, prompt_tokens, cached_tokens, generated_tokens, decode_tps, "
                "error IS NOT NULL OR finish_reason = 'error' FROM requests "
                "WHERE created >= ? AND created <= ?" + mine,
                [start, end] + ([] if user is None else [user_id(user)]),
            ).fetchall()

    def totals(self) -> dict[str, int]:
        """Counts for the dashboard's header: users, conversations, messages, requests, errors,
        prompt, cached and generated tokens."""
        with self._tx(write=False) as db:
            counts = {
                t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("users", "conversations", "messages", "requests")
            }
            errors, prompt, cached, generated = db.execute(
                "SELECT count(*) FILTER (WHERE error IS NOT NULL OR finish_reason = 'error'), "
                "coalesce(sum(prompt_tokens), 0), coalesce(sum(cached_tokens), 0), "
                "coalesce(sum(generated_tokens), 0) FROM requests"
            ).fetchone()
        return {
            **counts,
            "errors": errors,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "generated_tokens": generated,
        }
