"""Request metrics: the `requests` rows, the writer thread that commits queued ones, and the
dashboard's reads of them.

Metrics from the engine thread go through `record_request_async`, which only puts the record on
a queue; one writer thread ("radixchat-store-writer", started by the first queued item) commits
queued records in batches, one transaction each. `flush()` waits for what was queued before it
(tests, shutdown). A queued record is not yet an acknowledged write: a crash may lose it. An API
reply's row goes through `record_request_acked`, whose future its reply waits on before its last
byte, so no request a client saw answered can be lost (many rows still share one commit). The same thread notes API keys' last use
(`_touch_api_key`, for core.store.accounts), so checking a key never waits for the write lock.

Owns: `record_request`, the queue and its writer, `flush`, `_stop_writer` (run by `Store.close`
before the connections close), `request_metrics`, `stats`, `usage` and `totals`. Leaves to
others: a reply written together with its request row (`append_reply`, core.store.conversations,
which calls `_insert_request` in its transaction), the check that a request's conversation is
its user's (`_conv`, core.store.conversations), shaping buckets (core.store.report) and drawing
them (webui). Called from the engine thread (never blocking), the writer thread, HTTP handlers
and the dashboard.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import asdict, replace
from typing import Any

from sqlite_utils import Database

from radixchat.core.store import report as store_report
from radixchat.core.store.connection import StoreBase
from radixchat.core.store.report import StatsBucket
from radixchat.core.store.types import (
    Invalid,
    NotFound,
    RequestFigures,
    RequestRecord,
    User,
    user_id,
)

log = logging.getLogger("radixchat.store")

ASYNC_QUEUE_MAX = 10_000  # past this, metrics are dropped (and counted) rather than block the engine
_ASYNC_BATCH = 256

_STOP = object()


class _Touch:
    """Queued note that an API key was just used."""

    __slots__ = ("key_id", "when")

    def __init__(self, key_id: int, when: float):
        self.key_id, self.when = key_id, when


class _Acked:
    """A queued request row whose writer says when it is committed."""

    __slots__ = ("done", "record")

    def __init__(self, record: RequestRecord, done: Future):
        self.record, self.done = record, done


class MetricsMixin(StoreBase):
    """Request rows, the metrics writer thread and the dashboard's reads (see the module docstring)."""

    def _init_writer(self) -> None:
        """The writer's state; the thread itself starts with the first queued item."""
        self._stopping = False  # set first by close(): no new async work from then on
        self._queue: queue.Queue = queue.Queue(ASYNC_QUEUE_MAX)
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self.dropped = 0  # async records refused because the queue was full or the store closed
        self.async_errors = 0  # async records that failed to write

    # ---- request rows ----

    def _insert_request(self, db: Database, rec: RequestRecord) -> int:
        if rec.user is not None and db.execute("SELECT 1 FROM users WHERE id = ?", [rec.user]).fetchone() is None:
            raise NotFound(f"user {rec.user!r} not found")
        if rec.conversation is not None:
            self._conv(db, rec.user, rec.conversation)  # a request of user A can't point into B's chat
        # a record's fields are the table's columns, one for one
        return db["requests"].insert(asdict(rec)).last_pk

    def record_request(self, record: RequestRecord) -> int:
        """Store one request's metrics now; returns its id (for `append_message(request=)`)."""
        with self._tx(write=True) as db:
            return self._insert_request(db, record)

    def record_request_async(self, record: RequestRecord) -> None:
        """Queue the metrics for the writer thread and return at once; never blocks, never
        raises (for the engine thread). A full queue or a closed store drops the record and
        counts it in `dropped`. See `flush`."""
        self._enqueue(record)

    def record_request_acked(self, record: RequestRecord) -> Future:
        """`record_request_async`, and a future that is True once the row is committed (False
        when it was dropped or failed to write): a reply's last byte waits for it, so a request
        answered is a request stored, and the writer still commits many rows at once."""
        acked = _Acked(record, Future())
        if not self._enqueue(acked):
            acked.done.set_result(False)
        return acked.done

    def _touch_api_key(self, key_id: int, when: float) -> None:
        self._enqueue(_Touch(key_id, when))

    # ---- the writer thread ----

    def _enqueue(self, item: Any) -> bool:
        # The check and the put are one step under the lock `close` takes to set _stopping:
        # an item is either queued before the writer's stop mark (and written) or counted as
        # dropped, never queued behind the mark where nobody reads it.
        with self._writer_lock:
            if self._stopping:
                self.dropped += 1
                return False
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, daemon=True, name="radixchat-store-writer")
                self._writer.start()
                atexit.register(self.close)  # a daemon thread would lose its queue at exit
            try:
                self._queue.put_nowait(item)
                return True
            except queue.Full:
                self.dropped += 1
        if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
            log.warning("store writer queue full: %d metric records dropped so far", self.dropped)
        return False

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything queued before this call is committed. False on timeout."""
        if self._writer is None or self._closed:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def _stop_writer(self) -> None:
        """Write what is queued and stop the writer; from now on queued items are dropped (and counted)."""
        with self._writer_lock:  # after this, _enqueue drops (and counts) instead of queueing
            self._stopping = True
        if self._writer is not None:
            self._queue.put(_STOP)
            self._writer.join(timeout=self._timeout_s)
            atexit.unregister(self.close)

    def _write_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < _ASYNC_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            work = [x for x in batch if isinstance(x, (RequestRecord, _Touch, _Acked))]
            if work:
                ok = self._write_batch(work)
                for x in work:
                    if isinstance(x, _Acked):
                        x.done.set_result(ok)
            for x in batch:
                if isinstance(x, threading.Event):
                    x.set()
            if any(x is _STOP for x in batch):
                return

    def _write_batch(self, work: list) -> bool:
        # one transaction (one fsync) for the whole batch; a record whose user or conversation
        # has gone since is kept without those links rather than lost
        try:
            with self._tx(write=True) as db:
                for x in work:
                    if isinstance(x, _Touch):
                        # SQL, not table.update(): a key removed meanwhile is no error here, and
                        # max() keeps a later touch that committed first
                        db.execute(
                            "UPDATE api_keys SET last_used = max(coalesce(last_used, 0), ?) WHERE id = ?",
                            [x.when, x.key_id],
                        )
                        continue
                    record = x.record if isinstance(x, _Acked) else x
                    try:
                        self._insert_request(db, record)
                    except NotFound as e:
                        log.warning("request metrics stored without links: %s", e)
                        self._insert_request(db, replace(record, user=None, conversation=None))
        except Exception:
            self.async_errors += sum(isinstance(x, (RequestRecord, _Acked)) for x in work)
            log.exception("store writer: %d queued records lost", len(work))
            return False
        return True

    # ---- reads ----

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
                    "SELECT id, prompt_tokens, cached_tokens, ttft_ms, decode_tps, finish_reason, error, coalesce(model, '') "
                    f"FROM requests WHERE id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
                out.update((rid, RequestFigures(*rest)) for rid, *rest in rows)
        return out

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
            counts = {t: db[t].count for t in ("users", "conversations", "messages", "requests")}
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
