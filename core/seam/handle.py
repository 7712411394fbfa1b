"""The caller's side of one request: a stream of events, readable from threads or asyncio.

The engine pushes events (`push`, the producer's side: from its output thread, core.engine.output;
a remote engine's reader, webui/remote/remote_engine.py, does the same for a worker's); callers iterate (`for ev in handle` or
`async for ev in handle`) until the final `Finished` or `Failed`. Events for asyncio
callers go through an `Outbox` that the engine flushes once per step: one wake-up of each
event loop per step instead of one per token, which kept the HTTP thread from holding the
GIL against the engine thread at every token. Nothing here runs MLX.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from radixchat.core.seam.requests import Event, Failed, Finished, TextDelta


class Outbox:
    """Events for asyncio callers, gathered per event loop until `flush`.

    The engine's output thread puts and flushes; after the engine stopped, a submitter that lost
    the race with the stop fails its own request through here too, hence the lock."""

    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Event], Event]]] = {}
        self._lock = threading.Lock()

    def put(self, loop: asyncio.AbstractEventLoop, q: asyncio.Queue[Event], ev: Event) -> None:
        with self._lock:
            self._pending.setdefault(loop, []).append((q, ev))

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop is gone: nobody is listening
                pass


def _deliver(items: list[tuple[asyncio.Queue[Event], Event]]) -> None:
    for q, ev in items:
        q.put_nowait(ev)


class RequestHandle:
    def __init__(
        self,
        rid: str,
        prompt_tokens: int,
        cancel: Callable[[str], None],
        loop: asyncio.AbstractEventLoop | None,
        outbox: Outbox,
    ):
        self.id = rid
        self.prompt_tokens = prompt_tokens
        self._cancel = cancel
        self._loop = loop
        self._outbox = outbox
        self._sync: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._async: asyncio.Queue[Event] | None = asyncio.Queue() if loop else None
        self.final: Finished | Failed | None = None
        self.cancelled_because: str | None = None  # why the server cut it (`cancel(reason)`)
        self._done_lock = threading.Lock()
        self._done_callbacks: list[Callable[[Finished | Failed], None]] = []

    def cancel(self, reason: str | None = None) -> None:
        """Ask the engine to stop this request at its next step (idempotent). A `reason` is
        the server's own (a user disabled while it ran), for the client still waiting: it
        ends as cancelled all the same, and whoever frames the answer says why."""
        if self.final is None:
            if reason is not None and self.cancelled_because is None:
                self.cancelled_because = reason
            self._cancel(self.id)

    def add_done_callback(self, fn: Callable[[Finished | Failed], None]) -> None:
        """Call fn(final event) once the request ends, even if nobody reads the stream.

        It runs in the engine's output thread (or right here if the request already ended):
        keep it short and non-blocking.
        """
        with self._done_lock:
            if self.final is None:
                self._done_callbacks.append(fn)
                return
        fn(self.final)

    # the producer's side: the engine's (or a remote engine's reader's)
    def push(self, ev: Event) -> None:
        """Hand the caller one event; the final one (Finished or Failed) ends the request and
        runs the done callbacks. From one thread at a time, in order."""
        final = ev if isinstance(ev, (Finished, Failed)) else None
        callbacks: list[Callable[[Finished | Failed], None]] = []
        if final is not None:
            with self._done_lock:
                self.final = final
                callbacks, self._done_callbacks = self._done_callbacks, []
        if self._async is not None and self._loop is not None:
            self._outbox.put(self._loop, self._async, ev)
        else:
            self._sync.put(ev)
        if final is not None:
            for fn in callbacks:
                try:
                    fn(final)
                except Exception:  # a caller's bookkeeping must not hurt the engine
                    logging.getLogger("radixchat.engine").exception("done callback failed")

    # caller side
    def __iter__(self) -> Iterator[Event]:
        if self._async is not None:
            raise TypeError("this handle was created inside an event loop: use `async for`")
        while True:
            ev = self._sync.get()
            yield ev
            if not isinstance(ev, TextDelta):
                return

    async def __aiter__(self) -> AsyncIterator[Event]:
        if self._async is None:
            raise TypeError("this handle was created outside an event loop: use `for`")
        while True:
            ev = await self._async.get()
            yield ev
            if not isinstance(ev, TextDelta):
                return

    async def batched(self) -> AsyncIterator[Event]:
        """Like `async for`, but text that arrived while the caller was busy (a slow client,
        a busy loop) comes as one delta: a client that falls behind gets fewer, larger events
        instead of one per token, and the server serializes and sends less."""
        if self._async is None:
            raise TypeError("this handle was created outside an event loop")
        q = self._async
        while True:
            ev = await q.get()
            if not isinstance(ev, TextDelta):
                yield ev
                return
            merged: list[TextDelta] = [ev]
            end: Event | None = None
            while end is None and not q.empty():
                nxt = q.get_nowait()
                if isinstance(nxt, TextDelta):
                    merged.append(nxt)
                else:
                    end = nxt
            if len(merged) == 1:
                yield ev
            else:
                lps = [lp for d in merged for lp in (d.logprobs or [])] if ev.logprobs is not None else None
                yield TextDelta("".join(d.text for d in merged), logprobs=lps)
            if end is not None:
                yield end
                return

    def result(self) -> Finished | Failed:
        """Block until the request ends; returns the final event (its text is the whole reply)."""
        if self.final is not None and self._sync.empty():
            return self.final
        for ev in self:
            if not isinstance(ev, TextDelta):
                return ev
        raise AssertionError("unreachable")
