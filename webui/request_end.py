"""Each request's end, recorded exactly once: its metrics observed, then its row written.

A `RequestEnd` is made as soon as the engine accepts a request and hooked on the handle with
`add_done_callback`, so it learns of the end whether or not anyone reads the stream to the
end. Both the API (webui/api/generation.py) and the page (webui/page/logic/replies.py) go through it.
What to write is theirs to say (`write`): a queued request row for the API, the reply with
its request row for the page; this module owns only the "once": a reader that goes away
mid-stream, or while the write is under way, can neither skip the write nor repeat it.

Threads: `_ended` runs in the engine's output thread (core.engine.output; or in the
submitter's, if the request ended before the hook was set); it only counts metrics and hands
the write on, so the engine never waits for SQLite. The write runs on the executor it is
given, or right there when it never blocks (the store's queued writer). `release` and `wait` are the reader's, usually the event
loop's; `settle` is for whoever stops the server (webui/cli/main.py), before the store closes. No
MLX here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_for_all
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from radixchat.core.seam.requests import Failed, Finished

if TYPE_CHECKING:
    from radixchat.core.seam.handle import RequestHandle
    from radixchat.webui.api.metrics import Metrics

log = logging.getLogger("radixchat.requests")

T = TypeVar("T")

# every end not yet recorded, in this process: what a stopping server waits for (`settle`)
_open: set[Future[Any]] = set()
_open_lock = threading.Lock()


def settle(timeout: float) -> bool:
    """Wait up to `timeout` seconds until every RequestEnd made so far has recorded its end
    (written it, or learned there is nothing to keep); False if some have not. Called once the
    engines have stopped, when each request has its end and waits only for its reader and write."""
    with _open_lock:
        waiting = list(_open)
    return not wait_for_all(waiting, timeout).not_done


class RequestEnd(Generic[T]):
    """The end of one request: `metrics.observe(final)` once, then `write(final, text)` once.

    With `reader=True` the write also waits for `release`: the reader holds what a failed
    request wrote before failing (its final event carries no text) and knows whether there
    is anything to store the request under. Without an `executor`, `write` runs in the
    engine's output thread and must not block."""

    def __init__(
        self,
        handle: RequestHandle,
        metrics: Metrics | None,
        write: Callable[[Finished | Failed, str], T],
        *,
        executor: Executor | None = None,
        reader: bool = False,
        model: str | None = None,
    ):
        self._metrics, self._executor = metrics, executor
        # dropped once it has run: a write usually closes over what holds this end (the API's
        # Ledger keeps its ends), and kept, every request would be a reference cycle that
        # waits for Python's cyclic collector, whose pauses stall every thread
        self._write: Callable[[Finished | Failed, str], T] | None = write
        self._model = model  # the label its metrics go under (None: the first model)
        self._lock = threading.Lock()
        self._final: Finished | Failed | None = None
        self._released = not reader
        self._text, self._keep = "", True
        self._started = False
        # ours alone, never an executor's: nobody can cancel a write by cancelling a waiter
        self._done: Future[T | None] = Future()
        with _open_lock:
            _open.add(self._done)
        self._done.add_done_callback(_closed)
        handle.add_done_callback(self._ended)  # last: it may call back right here

    @property
    def released(self) -> bool:
        return self._released

    def release(self, text: str = "", *, keep: bool = True) -> None:
        """The reader is done with the stream, read to the end or gone. `text`: the reply as
        far as it was read; keep=False: nothing to store it under, only the metrics count.
        Only the first call counts."""
        with self._lock:
            if self._released:
                return
            self._released, self._text, self._keep = True, text, keep
        self._go()

    async def wait(self) -> T | None:
        """What `write` returned once it has run (None when nothing was kept); raises what it
        raised. A waiter that is cancelled stops waiting; the write goes on."""
        return await asyncio.shield(asyncio.wrap_future(self._done))

    def _ended(self, final: Finished | Failed) -> None:
        with self._lock:
            if self._final is not None:  # the handle calls once; this keeps it so
                return
            self._final = final
        if self._metrics is not None:
            try:  # in-memory counters: never blocks the engine
                self._metrics.observe(final, self._model)
            except Exception:  # a figure lost must never lose the reply
                log.exception("a request's metrics were not counted")
        self._go()

    def _go(self) -> None:
        # called by both `_ended` and `release`, from two threads: the second one in writes
        with self._lock:
            if self._started or self._final is None or not self._released:
                return
            self._started = True
        if not self._keep:
            self._write = None
            self._done.set_result(None)
        elif self._executor is None:
            self._record()
        else:
            self._executor.submit(self._record)

    def _record(self) -> None:
        write, self._write = self._write, None
        try:
            final = self._final
            assert final is not None and write is not None  # `_go` records an ended request, once
            self._done.set_result(write(final, self._text))
        except Exception as e:  # a waiter, if any, gets it too; the log is for when none is left
            log.exception("could not record the end of a request")
            self._done.set_exception(e)


def _closed(done: Future[Any]) -> None:
    with _open_lock:
        _open.discard(done)
