"""The store's connections and transactions: the base every part of core.store.Store stands on.

Owns opening the file (created owner-only, migrated forward by core.store.schema), one SQLite
connection per thread, `_tx` (the one way the other parts read or write) and closing every
connection. SQLite connections must not be shared between threads, so each thread gets its own
(WAL mode, so readers never wait for the writer). Every read-then-write runs in `BEGIN IMMEDIATE`,
which takes the write lock before reading, so two threads can't both decide from the same stale
read; writers of one process take turns in arrival order before that (`_FairLock`). Commits are
`synchronous=FULL` by default: a returned write survives a killed process and a power cut.

Leaves to others: what is read and written (core.store.accounts, .conversations, .metrics), the
metrics writer thread (.metrics, which `Store.close` stops before the connections close here),
and the tables themselves (.schema). The few calls one topic makes into another are declared at
the end of `StoreBase`, so each mixin reads on its own. Called from every thread that uses the store: HTTP
handlers, the page's workers, the engine's metrics hand-off and the store's writer thread.
"""

from __future__ import annotations

import collections
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from radixchat.core.store import schema as store_schema
from radixchat.core.store.types import Conversation, RequestRecord, StoreError


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


class StoreBase:
    """Connections, transactions and closing; the topic mixins of core.store.Store build on it."""

    path: Path
    migrated_from: int

    def _open(self, path: str | Path, *, timeout_s: float, synchronous: str) -> None:
        """Open (creating, or migrating forward) the database at `path`. On failure every
        connection is closed again and StoreError raised."""
        self.path = Path(path).expanduser()
        self._timeout_s = timeout_s
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}")
        self._synchronous = synchronous
        self._local = threading.local()
        self._conns: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._closed = False
        self._write_turn = _FairLock()

        if not self.path.exists():
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
        except (sqlite3.Error, StoreError) as e:
            self.close()
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"cannot open {self.path}: {e}") from e

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
        this process's turn (fair between its threads), then SQLite's (against other processes).
        sqlite-utils 4's table calls nest in it as savepoints, so they commit with it or not at
        all (3.x's `with conn:` would commit it half-way)."""
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

    def _close_connections(self) -> None:
        """Refuse new transactions and close every thread's connection."""
        self._closed = True
        for conn in list(self._conns):
            conn.close()

    # What one topic asks of another inside the same Store, declared here so that each mixin
    # reads on its own; the mixins of core.store.Store define them (the MRO puts them first).

    def _conv(self, db: Database, uid: int, conv_id: Any) -> Conversation:
        """The conversation if `uid` owns it, else NotFound (core.store.conversations)."""
        raise NotImplementedError

    def _insert_request(self, db: Database, rec: RequestRecord) -> int:
        """One request row, in the caller's transaction (core.store.metrics)."""
        raise NotImplementedError

    def _touch_api_key(self, key_id: int, when: float) -> None:
        """Note a key's use through the writer thread (core.store.metrics)."""
        raise NotImplementedError
